"""The block drafter's fixed-shape step: context update, block forward and top-k in one call.

On the H200 a block step of the embedded model's shape spent, besides its 1.14 ms verify,
0.5 ms of host time on the eager context update while the GPU waited (its length is that of
the newly committed span, so it stayed out of the drafter's graph) and 0.45 ms in that graph
of small kernels (bench/archive/NOTES-2026.md, "H200: the block drafter's step, one graph and compiled").
Here:

- **Fixed-shape context update.** The committed span has n <= block_size + 1 = R rows (the
  accepted draft tokens and the one before them). The step always writes R rows of context
  at positions start .. start + R - 1 from a static feature buffer whose first n rows hold
  the span's target hidden states. Rows past n are stale but harmless: their positions lie in
  end .. end + block_size - 1 (start + R - 1 = end - n + block_size, n >= 1), past the new
  context length `end`, and the block's own K/V, written there right after the context, cover
  them. When nothing new is committed (the prompt's context was written eagerly, start =
  end), the last row lands at end + block_size, which attention masks out and a later commit
  rewrites. So the whole step has fixed shapes and one CUDA graph per key bucket holds it.
- **Regions.** The step runs as regions: `block_prologue` (positions, RoPE rows, mask and
  block inputs), `block_context` (the context update), per drafter layer stock's own
  `attn_in` / `attn_out_mlp_next` / `attn_out_mlp` (stock/compiled.py: the drafter's
  layers have the target's layer interface), with SDPA eager between them, and
  `block_lattice` (final norm, the target's head, log-softmax, top-k, packed for one host
  read), or `block_chain` (final norm, head, argmax) where the engine takes only the chain
  (its device chain step: on an H100 the lattice's region took 0.105 ms for 16 positions
  of the embedded default, the argmax's 0.038 ms). With `compiled` (CUDA, the engine's
  option `compile`) each region is torch.compile'd by stock/compiled.py's `run_region`
  (loud eager fallback, recompile limit); without, the same functions run eagerly (the CPU
  tests' path, and the reference the compiled step is checked against).

The region functions take modules and buffers as arguments (never layer indices), so one
compiled graph per region serves every drafter layer, and none depends on the key bucket
(the prologue's mask covers every slot; attention reads its first kv_len columns): a new
bucket costs a CUDA-graph capture, never a compile.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from stock.compiled import REGIONS, dynamo_limits, head, register_region, run_region
from stock.layers import apply_rope
from stock.linear import linear


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as `stock.layers.RMSNorm` computes it, with a weight that may be stacked
    (broadcast over leading dims): one kernel chain for several norms at once."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def block_prologue(inp, rows, steps, keys, cos_tab, sin_tab, embed, masks):
    """inp [3] int64 (pending id, context start, context end) -> the context rows' positions
    and RoPE rows, the block's positions, RoPE rows and additive mask [1, 1, 1, slots] over
    `keys` (the context and the whole block: keys before end + T), and the block inputs
    [1, T, H]."""
    start, end = inp[1], inp[2]
    last = cos_tab.shape[0] - 1
    ctx_pos = start + rows
    pos = end + steps
    cp, bp = ctx_pos.clamp(max=last), pos.clamp(max=last)
    zero = torch.zeros((), dtype=masks.dtype, device=keys.device)
    mask = torch.where(keys < end + steps.shape[0], zero, torch.full_like(zero, float("-inf")))
    x = torch.cat([embed(inp[:1]), masks])[None]
    return (ctx_pos, cos_tab[cp][None, None], sin_tab[cp][None, None], pos,
            cos_tab[bp][None, None], sin_tab[bp][None, None], mask.view(1, 1, 1, -1), x)


def block_context(feat_in, fc, context_norm, ctx_w, knorm, cos, sin, positions, ks, vs):
    """Context K/V of every drafter layer from feat_in [R, n_ctx * H] (the chosen target
    layers' hidden states side by side), written at `positions` [R] into ks[i], vs[i]
    [1, Hkv, slots, D]: one GEMM for every layer's k/v, one RoPE."""
    r = feat_in.shape[0]
    _, hkv, _, d = ks[0].shape
    feat = context_norm(fc(feat_in))
    kv = linear(feat, ctx_w).view(r, len(ks), 2, hkv, d)
    k = kv[:, :, 0].permute(1, 2, 0, 3)  # [L, Hkv, R, D]
    v = kv[:, :, 1].permute(1, 2, 0, 3)
    if knorm is not None:
        k = rms(k, knorm, context_norm.eps)
    k = apply_rope(k, cos, sin)
    for i in range(len(ks)):
        ks[i].index_copy_(2, positions, k[i:i + 1])
        vs[i].index_copy_(2, positions, v[i:i + 1])


def pack_lattice(logits: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 logits [T, vocab] -> [2, T, k] float64: the top-k ids, then their log-probs
    (float64 holds both exactly: ids < 2**53, fp32 log-probs), so one transfer brings the
    lattice to the host."""
    top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    return torch.stack([top.indices.double(), top.values.double()])


def block_lattice(x, norm, lm_head, topk: int):
    """x [1, T, H] -> the packed lattice [2, T, topk] (`pack_lattice`)."""
    return pack_lattice(head(x, norm, lm_head)[0], topk)


def block_chain(x, norm, lm_head):
    """x [1, T, H] -> each position's top-1 id [T] (int64): the lattice's first column
    without the log-softmax and top-k over the vocabulary (the same ids but at ties, exact
    or within the log-softmax's rounding), for a chain step that takes only the chain."""
    return head(x, norm, lm_head)[0].argmax(-1)


for _name, _fn in (("block_prologue", block_prologue), ("block_context", block_context),
                   ("block_lattice", block_lattice), ("block_chain", block_chain)):
    register_region(_name, _fn)


def _eager(name: str, *args):
    return REGIONS[name](*args)


def packed_step(d, kv_len: int, compiled: bool, top1: bool = False) -> torch.Tensor:
    """One fixed-shape step of BlockDrafter `d` (its static buffers hold the inputs):
    context update, block forward over key slots [0, kv_len), packed lattice [2, T, topk]
    (with `top1`: only the top-1 chain [T], `block_chain`)."""
    run = run_region if compiled else _eager
    net, target = d.net, d.target
    layers = list(net.layers)
    with dynamo_limits() if compiled else nullcontext():
        ctx_pos, cos_c, sin_c, pos, cos, sin, mask, x = run(
            "block_prologue", d._inp, d._rows, d._steps, d._keys, target.cos, target.sin,
            target.model.embed_tokens, d._masks)
        mask = mask[..., :kv_len]  # a view: the compiled prologue is the same for every bucket
        run("block_context", d._feat_in, net.fc, net.context_norm, d._ctx_w, d._ctx_knorm,
            cos_c, sin_c, ctx_pos, d.k, d.v)
        first = layers[0]
        qg = run("attn_in", x, first.input_layernorm, first.self_attn, cos, sin, pos, d.k[0],
                 d.v[0], d._qkv_w[0])
        for i, layer in enumerate(layers):
            out = F.scaled_dot_product_attention(qg, d.k[i][:, :, :kv_len],
                                                 d.v[i][:, :, :kv_len], attn_mask=mask)
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                x, qg = run("attn_out_mlp_next", x, out, layer.self_attn,
                            layer.post_attention_layernorm, layer.mlp, nxt.input_layernorm,
                            nxt.self_attn, cos, sin, pos, d.k[i + 1], d.v[i + 1],
                            d._gate_up_w[i], d._qkv_w[i + 1])
            else:
                x = run("attn_out_mlp", x, out, layer.self_attn, layer.post_attention_layernorm,
                        layer.mlp, d._gate_up_w[i])
        if top1:
            return run("block_chain", x, net.norm, target.lm_head)
        return run("block_lattice", x, net.norm, target.lm_head, d.topk)
