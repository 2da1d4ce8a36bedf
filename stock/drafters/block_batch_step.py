"""The batched block drafter's forwards as regions, compiled where the engine compiles.

`BatchBlockDrafter` (stock/drafters/block_batch.py) drafts every row's block in one forward
and writes each verification step's committed spans into every row's context. On the H200
both ran as CUDA graphs of eager kernels: the draft took 0.56 ms at one row and 1.09 ms at
16 (docs/results.md, "The batched block drafter's step", 2026-12-03) against 0.28 ms for the
single-request drafter's step, whose regions are torch.compile'd (stock/drafters/
block_step.py). Here the batched forwards are regions too:

- `batch_block_prologue`: the step's int64 input [3B] (cache rows, context ends, pending
  ids) -> rows, the blocks' positions [B, T] and RoPE rows, the additive mask [B, 1, 1,
  slots] (row b sees keys before end_b + T: its context and its whole block) and the block
  inputs [B, T, H];
- per drafter layer stock's own `attn_in` / `attn_out_mlp_next` / `attn_out_mlp`
  (stock/compiled.py, their batched form: each row's K/V written in its own cache row),
  with attention between them: kernels/attention's split-KV kernel reading each row's
  keys in its own cache row (`attention` "triton" on CUDA, the target's option
  attention_kernel; every block position masked as the block's last, so the kernel's
  causal mask is the block's), else SDPA over the rows' gathered keys (stock/body.py's
  `attend`). On the H100 the gather alone cost 183 us of a 1.92 ms step at 16 rows and
  SDPA 52 (bench/batch_step.py, docs/results.md session 33);
- `batch_block_lattice`: final norm, the target's head, log-softmax, top-k, packed
  [2, B, T, top-k] for one host read (block_step.pack_lattice); or `batch_block_chain`:
  final norm, head, argmax [B, T], where only the top-1 chains are wanted (they stay on the
  device for the verify step: at 16 rows the lattice's log-softmax and top-k run over
  256 x 49152 logits on the embedded default);
- `batch_block_context`: a verification step's committed spans (fixed shape [B, T] of
  features, padding to the spare row) -> every layer's context K/V, one GEMM, one RoPE.

With `compiled` each runs through stock/compiled.py's `run_region` (loud eager fallback,
recompile limit); without, the same functions run eagerly: the CPU's path, the reference
the compiled step is checked against (tests/test_batch_block.py), and the arithmetic of
BlockDrafter's plain path row by row. The mask covers every slot and attention reads its
first kv_len columns, so a new key bucket costs a capture, never a compile; a compile
happens once per rows bucket (and per rows bucket and CONTEXT_TOKENS bucket of the
context update, stock/drafters/block_batch.py).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from stock import body, compiled
from stock.compiled import dynamo_limits, head, register_region, requests_dynamic, run_region
from stock.drafters.block_step import _eager, pack_lattice, rms
from stock.layers import apply_rope
from stock.linear import linear


def batch_block_prologue(inp, steps, keys, cos_tab, sin_tab, embed, masks):
    """inp [3B] int64 (rows, context ends, pending ids) -> (rows [B], positions [B, T],
    cos, sin [B, 1, T, D], additive mask [B, 1, 1, slots], block inputs [B, T, H])."""
    b, t = inp.shape[0] // 3, steps.shape[0]
    rows, ends, pend = inp[:b], inp[b:2 * b], inp[2 * b:]
    pos = ends[:, None] + steps
    p = pos.clamp(max=cos_tab.shape[0] - 1)
    zero = torch.zeros((), dtype=masks.dtype, device=keys.device)
    mask = torch.where(keys[None] < (ends + t)[:, None], zero,
                       torch.full_like(zero, float("-inf")))
    x = torch.cat([embed(pend)[:, None], masks[None].expand(b, -1, -1)], dim=1)
    return rows, pos, cos_tab[p][:, None], sin_tab[p][:, None], mask.view(b, 1, 1, -1), x


def write_context(feats, rows, pos, fc, context_norm, ctx_w, knorm, cos_tab, sin_tab, ks, vs):
    """Context K/V of features [N, n_ctx * H] written at (rows[j], pos[j]) of every drafter
    layer's ks[i], vs[i] [rows, Hkv, slots, D]: one GEMM for all positions and layers, one
    RoPE. `knorm` [L, D]: the layers' k-norm weights (qk-norm drafters) or None."""
    _, hkv, _, d = ks[0].shape
    kv = linear(context_norm(fc(feats)), ctx_w).view(-1, len(ks), 2, hkv, d)
    p = pos.clamp(max=cos_tab.shape[0] - 1)
    cos, sin = cos_tab[p][:, None, None], sin_tab[p][:, None, None]     # [N, 1, 1, D]
    for i in range(len(ks)):
        k, v = kv[:, i, 0], kv[:, i, 1]                                  # [N, Hkv, D]
        if knorm is not None:   # as BlockDrafter's context update (block_step.block_context)
            k = rms(k, knorm[i], context_norm.eps)
        ks[i][rows, :, pos] = apply_rope(k[:, :, None], cos, sin)[:, :, 0]
        vs[i][rows, :, pos] = v


def batch_block_context(feat, inp, steps, spare: int, fc, context_norm, ctx_w, knorm,
                        cos_tab, sin_tab, ks, vs):
    """A step's committed spans: feat [B, T, n_ctx * H], inp [3B] int64 (rows, starts,
    counts); row b's first counts[b] features go to positions starts[b] + 0.. of its cache
    row, every other position (past a count, a padding row's) to the spare row."""
    b, t = feat.shape[0], feat.shape[1]
    rows, starts, counts = inp.view(3, b)
    steps = steps[:t]
    keep = steps[None] < counts[:, None]                                  # [B, T]
    pos = torch.where(keep, starts[:, None] + steps, steps).reshape(-1)
    row_idx = torch.where(keep, rows[:, None], torch.full_like(rows[:, None], spare))
    write_context(feat.reshape(b * t, -1), row_idx.reshape(-1), pos, fc, context_norm, ctx_w,
                  knorm, cos_tab, sin_tab, ks, vs)


def batch_block_lattice(x, norm, lm_head, topk: int):
    """x [B, T, H] -> the packed lattices [2, B, T, topk] (block_step.pack_lattice)."""
    return pack_lattice(head(x, norm, lm_head), topk)


def batch_block_chain(x, norm, lm_head):
    """x [B, T, H] -> each position's top-1 id [B, T] (int64): the lattices' first column
    (`batch_block_lattice`) without the log-softmax and top-k over the vocabulary, for a
    step that verifies only the chains (the same ids but at ties, exact or within the
    log-softmax's rounding)."""
    return head(x, norm, lm_head).argmax(-1)


for _name, _fn in (("batch_block_prologue", batch_block_prologue),
                   ("batch_block_context", batch_block_context),
                   ("batch_block_lattice", batch_block_lattice),
                   ("batch_block_chain", batch_block_chain)):
    register_region(_name, _fn)


def decode_attention(*args, **kw):
    """kernels/attention's split-KV kernel."""
    from kernels.attention import decode_attention as kernel  # lazy: Triton, CUDA only

    return kernel(*args, **kw)


def draft_step(d, inp: torch.Tensor, kv_len: int, top1: bool = False) -> torch.Tensor:
    """Every row's block of BatchBlockDrafter `d` in one forward over key slots [0, kv_len):
    inp [3B] int64 (rows, context ends, pending ids); the packed lattices [2, B, T, top-k]
    (float64 on the device), or with `top1` only the top-1 ids of the first d.chain_len
    positions [B, chain_len] (int64, `batch_block_chain`). Each row's block K/V written into
    its cache row."""
    run = run_region if d.compiled else _eager   # as block_step.packed_step
    net, target = d.net, d.target
    layers = list(net.layers)
    dyn = requests_dynamic if d.compiled and compiled.DYNAMIC_DRAFTER else (lambda *t: None)
    with dynamo_limits() if d.compiled else nullcontext():
        dyn((inp, (0,)))   # every rows bucket past one: one graph per region
        rows, pos, cos, sin, mask, x = run(
            "batch_block_prologue", inp, d._steps, d._keys, target.cos, target.sin,
            target.model.embed_tokens, d._masks)
        mask = mask[..., :kv_len]   # a view: the compiled prologue serves every key bucket
        dyn(*((t, (0,)) for t in (rows, pos, cos, sin, x)))
        first = layers[0]
        qg = run("attn_in", x, first.input_layernorm, first.self_attn, cos, sin, pos, d.k[0],
                 d.v[0], d._qkv_w[0], rows, d.kernel)
        if d.kernel:   # every block position sees keys up to its block's last: one position
            seen = pos[:, -1:].expand_as(pos).contiguous()   # a row's for all T, the kernel's
        for i, layer in enumerate(layers):                   # causal mask then the block's
            if d.kernel:   # each row's keys read in place, no gather of K/V (kernels/attention)
                out = decode_attention(qg, d.k[i], d.v[i], seen, kv_len, rows_of=rows,
                                       merged=True)
            else:
                out = body.attend(qg, d.k[i], d.v[i], kv_len, mask, rows)
            dyn((out, (0,)))
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                x, qg = run("attn_out_mlp_next", x, out, layer.self_attn,
                            layer.post_attention_layernorm, layer.mlp, nxt.input_layernorm,
                            nxt.self_attn, cos, sin, pos, d.k[i + 1], d.v[i + 1],
                            d._gate_up_w[i], d._qkv_w[i + 1], rows, d.kernel)
            else:
                x = run("attn_out_mlp", x, out, layer.self_attn, layer.post_attention_layernorm,
                        layer.mlp, d._gate_up_w[i])
            dyn((x, (0,)))
        if top1:   # the head over the columns a verify step reads, not the whole block
            return run("batch_block_chain", x[:, :d.chain_len], net.norm, target.lm_head)
        return run("batch_block_lattice", x, net.norm, target.lm_head, d.topk)


def context_step(d, feat: torch.Tensor, inp: torch.Tensor) -> None:
    """BatchBlockDrafter `d`'s fixed-shape context update (`batch_block_context`)."""
    run = run_region if d.compiled else _eager   # as block_step.packed_step
    net, target = d.net, d.target
    with dynamo_limits() if d.compiled else nullcontext():
        if d.compiled and compiled.DYNAMIC_DRAFTER:   # one graph per CONTEXT_TOKENS bucket
            requests_dynamic((feat, (0,)), (inp, (0,)))   # for every rows bucket past one
        run("batch_block_context", feat, inp, d._keys, d.spare, net.fc, net.context_norm,
            d._ctx_w, d._ctx_knorm, target.cos, target.sin, d.k, d.v)
