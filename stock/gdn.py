"""The Gated DeltaNet (GDN) layer of hybrid targets (Qwen3.5 / Qwen3-Next): its parameters,
named as Hugging Face's so a checkpoint loads as is, and its body, which every forward runs.

One GDN step over T new tokens, from the committed state (stock/hybrid_cache.py):
projections (q/k/v as one matrix feeding the conv, z the output gate, b and a for beta and
the decay), the short causal conv over the committed window and the new columns, SiLU, the
gated delta rule (kernels/gdn: one token at a time for T = 1, the chunked form otherwise),
the gated RMSNorm and the output projection. The committed state is only read: the step
stages what its commit needs (the new conv columns, k, v, g, beta and the state after all
T tokens) and `HybridCache.commit` keeps exactly the state after the accepted tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.gdn import causal_conv, chunk_rule, recurrent_rule
from stock.config import ModelConfig
from stock.linear import Linear, linear


class GatedRMSNorm(nn.Module):
    """RMSNorm of each value head's output, times SiLU of the gate z (fp32 gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32.to(x.dtype) * F.silu(gate.float())).to(x.dtype)


class ConvWeight(nn.Module):
    """Holds the depthwise conv's weight [C, 1, K] under Hugging Face's name `conv1d.weight`
    (no nn.Conv1d: its init would run at every build, and stock runs the conv itself)."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer  # the model layer's index: its state in the HybridCache
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.kernel = cfg.linear_conv_kernel
        h = cfg.hidden_size
        self.in_proj_qkv = Linear(h, self.conv_dim, bias=False)
        self.in_proj_z = Linear(h, self.hv * self.dv, bias=False)
        self.in_proj_b = Linear(h, self.hv, bias=False)
        self.in_proj_a = Linear(h, self.hv, bias=False)
        self.conv1d = ConvWeight(self.conv_dim, self.kernel)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(self.hv * self.dv, h, bias=False)


def _plain(mod, x: torch.Tensor) -> torch.Tensor:
    return mod(x)   # stock/body.py's `plain`, which cannot be imported here (body imports us)


def project(call, gdn: GatedDeltaNet, hx: torch.Tensor, fused=None):
    """The layer's input projections of normed inputs hx [B, T, hidden]: mixed [B, T,
    conv_dim] (the conv's input), the output gate z [B, T, Hv, Dv], beta [B, T, Hv] and the
    decay g [B, T, Hv] (fp32). `call(mod, x)` calls a module (stock/body.py's convention);
    `fused`: the four projections' concatenated matrix (stock/fused.py), one GEMM, or a
    group module a patch installed for them."""
    b, t, _ = hx.shape
    if fused is None:
        mixed, z = call(gdn.in_proj_qkv, hx), call(gdn.in_proj_z, hx)
        bb, a = call(gdn.in_proj_b, hx), call(gdn.in_proj_a, hx)
    else:
        out = linear(hx, fused) if isinstance(fused, torch.Tensor) else call(fused, hx)
        mixed, z, bb, a = out.split(
            [gdn.conv_dim, gdn.hv * gdn.dv, gdn.hv, gdn.hv], dim=-1)
    beta = torch.sigmoid(bb)
    g = -gdn.A_log.float().exp() * F.softplus(a.float() + gdn.dt_bias.float())
    return mixed, z.reshape(b, t, gdn.hv, gdn.dv), beta, g


def recur(gdn: GatedDeltaNet, mixed, beta, g, cache, start: int | None,
          rows: torch.Tensor | None = None) -> torch.Tensor:
    """The conv and the gated delta rule from the committed state at `start` (the committed
    length; None: a static step's, trusted), or, for a batched step, from the committed
    states of cache rows `rows` [R] (each request's own): the rule's output [B, T, Hv, Dv];
    stages the step's commit in `cache`. A batched row's padding comes after its tokens, so
    it changes none of their outputs (the rule is causal) and its commit never keeps it."""
    b, t, _ = mixed.shape
    if rows is None:
        window, state = cache.gdn_state(gdn.layer, start)
    else:
        window, state = cache.gdn_rows(gdn.layer, rows)
    x = causal_conv(mixed, window, gdn.conv1d.weight.squeeze(1))
    q, k, v = x.split([gdn.hk * gdn.dk, gdn.hk * gdn.dk, gdn.hv * gdn.dv], dim=-1)
    q, k = q.reshape(b, t, gdn.hk, gdn.dk), k.reshape(b, t, gdn.hk, gdn.dk)
    v = v.reshape(b, t, gdn.hv, gdn.dv)
    rule = recurrent_rule if t == 1 else chunk_rule
    out, final = rule(q, k, v, g, beta, state)
    if rows is None:
        cache.stage(gdn.layer, start, mixed, k, v, g, beta, final)
    else:
        cache.stage_rows(gdn.layer, mixed, k, v, g, beta, final)
    return out


def finish(call, gdn: GatedDeltaNet, out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gated norm of the rule's output and the output projection: [B, T, hidden]."""
    b, t = out.shape[:2]
    return call(gdn.out_proj, gdn.norm(out, z).reshape(b, t, gdn.hv * gdn.dv))


def mix(gdn: GatedDeltaNet, hx: torch.Tensor, cache, start: int | None,
        rows: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's output [B, T, hidden] for normed inputs hx [B, T, hidden] at cache
    position `start` (the committed length), or in cache rows `rows` (a batched step);
    stages the step's commit in `cache`."""
    mixed, z, beta, g = project(_plain, gdn, hx)
    return finish(_plain, gdn, recur(gdn, mixed, beta, g, cache, start, rows), z)
