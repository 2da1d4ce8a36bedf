"""Transformer building blocks for Llama-family and Qwen3 dense models, and the attention,
MLP and norms of hybrid GDN targets (the GDN layer itself: stock/gdn.py).

Module and parameter names follow Hugging Face's, so a safetensors state dict loads as is.
The attention and decoder-layer modules hold parameters only: every forward runs them
through the one layer body in stock/body.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stock.config import ModelConfig
from stock.gdn import GatedDeltaNet
from stock.linear import Linear
from stock.profile import region


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class OffsetRMSNorm(RMSNorm):
    """Qwen3.5 / Qwen3-Next's zero-centred RMSNorm: the weight is stored as an offset from 1
    and applied in fp32 before the cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg: ModelConfig, dim: int) -> RMSNorm:
    return (OffsetRMSNorm if cfg.norm_offset else RMSNorm)(dim, cfg.rms_norm_eps)


def rope_tables(cfg: ModelConfig, device, dtype=torch.float32):
    """cos, sin of shape [max_position, rotary_dim] (half-split rotary layout; rotary_dim is
    head_dim unless the model rotates only part of each head)."""
    rd = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.int64,
                                                  device=device).float() / rd))
    t = torch.arange(cfg.max_position, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [B, 1, T, R] already gathered at the tokens' positions; the
    first R of D dims rotate (partial RoPE when R < D), the rest pass through."""
    if cos.shape[-1] < x.shape[-1]:
        rd = cos.shape[-1]
        return torch.cat((apply_rope(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """`layer`: its index in the KV cache (the model layer's index, or on a hybrid target
    its index among the full-attention layers). `gated`: q_proj also emits a per-channel
    output gate (Qwen3.5), q and gate interleaved per head."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.gated = cfg.attn_output_gate
        self.q_proj = Linear(cfg.hidden_size, self.h * self.d * (2 if self.gated else 1),
                             bias=False)
        self.k_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = make_norm(cfg, self.d)
            self.k_norm = make_norm(cfg, self.d)
        self.qk_norm = cfg.qk_norm


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        with region("gemm"):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Full attention (`self_attn`) or, on a hybrid target's linear_attention layers, a GDN
    layer (`linear_attn`, stock/gdn.py), then the MLP."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        if cfg.layer_type(layer) == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, layer)
        else:
            kv_index = sum(cfg.layer_type(i) == "full_attention" for i in range(layer))
            self.self_attn = Attention(cfg, kv_index)
        self.mlp = MLP(cfg)
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
