"""Split-KV attention over the static cache for a step's few query rows (flash decoding).

A decode or verify step of a large target has few query rows per K/V head (R = G * T: 8 at
T = 1 for 64 query / 8 K/V heads) and a cache of hundreds to thousands of slots. A fused
attention kernel that gives each (head, query tile) one program runs 8 programs on a
132-multiprocessor GPU, each walking the whole cache. Here the cache is cut into chunks:

1. `_partial`: one program per (batch x K/V head, row block, chunk) computes, for its rows
   and its chunk's keys, the running max m, the softmax denominator l and the unnormalised
   output acc (online softmax, fp32, `tl.dot` on the tensor cores);
2. `_combine`: one program per (batch x K/V head, row block) rescales the chunks' partials
   to their common max and divides: out = sum_c e^(m_c - m) acc_c / sum_c e^(m_c - m) l_c.

The mask is the static step's (see reference.py): row r sees key j iff j <= positions[r % T]
and j < kv_len, read from `positions` on the device, so one launch serves every step of a
CUDA graph slot (a batched step, `rows_of`: request b's programs read cache row rows_of[b]
and mask by positions[b], in the same row tiles as its single-request step; the cache's
split into chunks depends on the batch, see `plan`). A draft tree's step
(`tree`: stock/tree.py's `tree_table`, int64 on the device: the context length `start`, each
node's depth, and each node's path, its ancestor at every depth) runs one program per node
and chunk reaching its slots: the node's query rows see the context [0, start) and, at logical position start +
e, the key of its ancestor at depth e, read from that ancestor's slot. Every column of every
tile then holds the key and value the same token's row sees in a chain step (the same tile
of BLOCK_R rows, the same tensor-core instructions, zeros where the chain masks), so a
node's output is the bits of its root path verified as a chain: a tree step changes no
output token in bf16. Only the chunks that reach the tree's slots need a program per node:
a chunk of context alone is the same keys for every node, and its programs take row blocks
of all nodes' rows, as a chain step's do. The grid is flat: row blocks x chunks, then nodes x
the (at most two, for T <= 64 and chunks of 64 keys or more) chunks from start's on; a node's
program walks keys up to its own depth, and the combine reads the chunks up to the tree's
last slot. Two earlier layouts lost to the chain on the H200 (embedded shapes, context 512,
bench/step_27b.py --trees --profile-graphs): every chunk per node read the context T times
(a 32-node tree step 1.69 ms against 1.18 ms for a 32-token chain step); then a grid of
(node, chunk) with most programs exiting at once still cost 8.4 us a layer against the
chain's 3.9 at 16 nodes, 11.1 against 4.1 at 32.

A chain step's programs walk their whole chunk, also the keys past their rows' last
position (a KV bucket is a power of two, so up to half its slots lie past the context): a
loop bound read from `positions` (the tile's last position + 1) puts that load's latency
before the first key's, and on the H200 (the same bench, 2026-12-03) it made the chain's
kernel slower (135 us a step over 30 layers against 118 at T = 16), not faster.

A chunk whose keys are all hidden from a row leaves m = -1e30, l = 0 there
and weighs nothing in the combine (every row sees key 0, so some chunk has weight 1).

The result matches `reference_attention` to bf16 rounding (probabilities are rounded to the
value dtype before the second product, as fused attention kernels do). A row's result does not
depend on how many rows the step has (`plan`). A first version sized its tile by the row
count, so the AR step and a verify step computed the same token's row with different tiles
(on Hopper, different tensor-core instructions); on the H200 the embedded model's
speculative outputs then left AR's at bf16 near-ties on 4 of 5 requests. The price of one
plan for every T: a verify step of many rows writes one partial per row and chunk (at
T = 64 over 4,096 slots the kernel is barely faster than SDPA; bench/archive/NOTES-2026.md).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys per inner step
BLOCK_R = 64  # query rows per program, whatever the step's row count (see `plan`)
NEG = tl.constexpr(-1.0e30)  # "minus infinity" that keeps exp() and max() free of NaN


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, pos_ptr, tree_ptr, row_ptr, m_ptr, l_ptr, acc_ptr,
             R, T, HKV, kv_len, chunk, splits, row_blocks, tree_chunks, scale,
             sq_b, sq_h, sq_g, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
             D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
             TREE: tl.constexpr, ROWS: tl.constexpr):
    bh = tl.program_id(0)
    pid = tl.program_id(1)   # (chunk, row block) of all rows; a tree's then (node, tree chunk)
    b = bh // HKV
    h = bh % HKV
    cb = b   # the cache's batch row; a batched step: request b's own row, positions[b]
    if ROWS:
        cb = tl.load(row_ptr + b)
        pos_ptr = pos_ptr + b * T
    c = pid // row_blocks
    rb = pid % row_blocks
    if TREE:
        # A chunk of context only (every key before `start`) is the same for every node:
        # row blocks of all nodes' rows, as a chain step's. A chunk reaching the tree's
        # slots (the `tree_chunks` from start's): one program per node, the node's G query
        # rows (row g * T + node) in a tile of BLOCK_R rows as a chain's, its keys up to
        # its own depth.
        g = tl.arange(0, BLOCK_R)
        start = tl.load(tree_ptr)
        node_program = pid >= row_blocks * splits
        q_ = pid - row_blocks * splits
        node = tl.where(node_program, q_ // tree_chunks, 0)
        c = tl.where(node_program, start // chunk + q_ % tree_chunks, c)
        lo = c * chunk
        hi = tl.minimum(lo + chunk, kv_len)
        depth = tl.load(tree_ptr + 1 + node)
        block = rb * BLOCK_R + g
        rows = tl.where(node_program, g * T + node, block)
        limit = tl.where(node_program, tl.where(c < splits, R // T, 0),
                         tl.where(hi <= start, R, 0))   # 0: a program with nothing to do
        rmask = tl.where(node_program, g, block) < limit
        hi = tl.where(limit > 0, tl.minimum(hi, start + depth + 1), lo)
        path_base = tree_ptr + 1 + T + node * 64
    else:
        lo = c * chunk
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        pos = tl.load(pos_ptr + rows % T, mask=rmask, other=-1)
        hi = tl.minimum(lo + chunk, kv_len)   # the whole chunk: see the module docstring
    d = tl.arange(0, D)
    q_row = (rows // T) * sq_g + (rows % T) * sq_t   # row g * T + t: query head g, token t
    q = tl.load(q_ptr + b * sq_b + h * sq_h + q_row[:, None] + d[None, :],
                mask=rmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_R], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    k_base = k_ptr + cb * sk_b + h * sk_h
    v_base = v_ptr + cb * sv_b + h * sv_h
    for n0 in range(lo, hi, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        kmask = keys < hi
        if TREE:
            # logical key start + e is the node's ancestor at depth e, read from its slot:
            # each column holds what the chain's column holds (module docstring)
            rel = keys - start
            inside = (rel >= 0) & (rel <= depth) & kmask
            hop = tl.load(path_base + tl.where(inside, rel, 0), mask=inside, other=0)
            slots = tl.where(inside, start + hop, keys)
            kvis = ((keys < start) & kmask) | inside
            k = tl.load(k_base + slots[None, :] * sk_s + d[:, None], mask=kvis[None, :],
                        other=0.0)
            s = tl.dot(q, k) * scale  # [BLOCK_R, BLOCK_N] fp32
            vis = kvis[None, :] & rmask[:, None]
        else:
            slots = keys
            k = tl.load(k_base + keys[None, :] * sk_s + d[:, None], mask=kmask[None, :],
                        other=0.0)
            s = tl.dot(q, k) * scale  # [BLOCK_R, BLOCK_N] fp32
            vis = (keys[None, :] <= pos[:, None]) & kmask[None, :]
            kvis = kmask
        s = tl.where(vis, s, NEG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(vis, tl.exp(s - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + slots[:, None] * sv_s + d[None, :], mask=kvis[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    part = bh * splits + c
    tl.store(m_ptr + part * R + rows, m_i, mask=rmask)
    tl.store(l_ptr + part * R + rows, l_i, mask=rmask)
    tl.store(acc_ptr + (part * R + rows[:, None]) * D + d[None, :], acc, mask=rmask[:, None])


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, o_ptr, tree_ptr, R, T, HKV, chunk, splits,
             so_b, so_h, so_g, so_t, D: tl.constexpr, BLOCK_R: tl.constexpr,
             TREE: tl.constexpr):
    bh = tl.program_id(0)
    rb = tl.program_id(1)
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    d = tl.arange(0, D)
    used = splits
    if TREE:   # chunks past the tree's last slot hold no key of any row: not written
        used = tl.minimum(splits, (tl.load(tree_ptr) + T - 1) // chunk + 1)
    m = tl.full([BLOCK_R], NEG, tl.float32)
    for c in range(0, used):
        m = tl.maximum(m, tl.load(m_ptr + (bh * splits + c) * R + rows, mask=rmask, other=NEG))
    den = tl.zeros([BLOCK_R], tl.float32)
    out = tl.zeros([BLOCK_R, D], tl.float32)
    for c in range(0, used):
        part = bh * splits + c
        w = tl.exp(tl.load(m_ptr + part * R + rows, mask=rmask, other=NEG) - m)
        den += w * tl.load(l_ptr + part * R + rows, mask=rmask, other=0.0)
        acc = tl.load(acc_ptr + (part * R + rows[:, None]) * D + d[None, :],
                      mask=rmask[:, None], other=0.0)
        out += w[:, None] * acc
    out = out / tl.where(den > 0, den, 1.0)[:, None]
    b = bh // HKV
    h = bh % HKV
    g = rows // T   # row r: query head g of the group, token r % T (stock/body.py's fold)
    tl.store(o_ptr + b * so_b + h * so_h + g[:, None] * so_g + (rows % T)[:, None] * so_t
             + d[None, :], out.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan(batch_heads: int, rows: int, kv_len: int, sms: int) -> tuple[int, int, int]:
    """(rows per program, keys per chunk, chunks). Neither depends on the row count, so a
    row's output is the same bits whatever the step's T (the AR step and a verify step agree
    wherever their inputs do): every program multiplies a BLOCK_R-row tile (the same tensor
    core instructions for any T; rows past R are masked) over the same chunks. Chunks: about
    two programs per multiprocessor for the smallest T, a multiple of BLOCK_N keys, none
    empty."""
    del rows  # see above: the plan must not depend on it
    blocks = triton.cdiv(kv_len, BLOCK_N)
    want = max(1, min(blocks, triton.cdiv(2 * sms, batch_heads)))
    chunk = triton.cdiv(blocks, want) * BLOCK_N
    return BLOCK_R, chunk, triton.cdiv(kv_len, chunk)


def supported(head_dim: int) -> bool:
    """Head dims the kernel takes (a power of two, 16..256)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     positions: torch.Tensor, kv_len: int,
                     tree: torch.Tensor | None = None,
                     rows_of: torch.Tensor | None = None,
                     merged: bool = False) -> torch.Tensor:
    """Attention of the step's rows q [B, Hkv, R, D] over cache slots [0, kv_len) of k, v
    [B, Hkv, S, D] (last dim contiguous) with the static step's mask, or a draft tree's
    (`tree`: stock/tree.py's `tree_table`; module docstring); returns [B, Hkv, R, D] in q's
    dtype, or with `merged` the same values as [B, T, Hkv * G * D] (R = G * T rows, row
    r = g * T + t: query head g of its group, token t), the layout the output projection
    reads: for T > 1 the other layout needs a transposing copy (stock/body.py's merge). q
    may also come as [B, Hkv, G, T, D] with any strides (the last contiguous), rows g * T +
    t read in place: the queries as the projection wrote them, [B, T, H, D] viewed (stock/
    body.py's split_heads), with no folding copy before the kernel. A
    batched step (`rows_of` [B] int64: request b's cache row, k and v the whole cache
    [rows, Hkv, S, D]; `positions` [B, T]: each request's own positions) reads each
    request's keys from its own row, masked by its own positions: no gather of K/V."""
    if q.dim() == 5:   # [B, Hkv, G, T, D], any strides: rows g * T + t without a copy
        bsz, hkv, g_, t_, dim = q.shape
        rows, sq_g, sq_t = g_ * t_, q.stride(2), q.stride(3)
    else:
        bsz, hkv, rows, dim = q.shape
        sq_g, sq_t = None, q.stride(2)
    batched = rows_of is not None
    if batched and (tree is not None or positions.dim() != 2 or positions.shape[0] != bsz
                    or rows_of.numel() != bsz):
        raise ValueError(f"a batched step gives positions [{bsz}, T] and {bsz} cache rows, "
                         "and no tree")
    t = positions.shape[-1] if batched else positions.numel()
    kb = bsz if not batched else k.shape[0]
    if tree is not None and rows // t > BLOCK_R:
        raise ValueError(f"a tree step's {rows // t} query heads per K/V head exceed {BLOCK_R}")
    if tree is not None and tree.numel() != 1 + t + 64 * t:
        raise ValueError(f"tree holds {tree.numel()} values for {t} tokens (stock/tree.py's "
                         f"tree_table: start, depths, paths)")
    if k.shape[:2] != (kb, hkv) or v.shape[:2] != (kb, hkv) or k.shape[-1] != dim:
        raise ValueError(f"q {tuple(q.shape)} and cache {tuple(k.shape)} / {tuple(v.shape)} "
                         "disagree")
    if q.dim() == 5 and t_ != t:
        raise ValueError(f"q {tuple(q.shape)} holds {t_} tokens, positions {t}")
    sq_g = t * sq_t if sq_g is None else sq_g
    if not supported(dim) or rows % t or not 0 < kv_len <= k.shape[2]:
        raise ValueError(f"unsupported step: q {tuple(q.shape)}, {t} positions, kv_len "
                         f"{kv_len} of {k.shape[2]} slots")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k and v need a contiguous last dimension")
    block_r, chunk, splits = plan(bsz * hkv, rows, kv_len, _num_sms(q.device))
    row_blocks = triton.cdiv(rows, block_r)
    f32 = dict(device=q.device, dtype=torch.float32)
    m = torch.empty(bsz * hkv * splits * rows, **f32)
    l_ = torch.empty_like(m)
    acc = torch.empty(bsz * hkv * splits * rows * dim, **f32)
    if merged:   # [B, T, Hkv, G, D]: strides of batch, K/V head, query head, token
        g = rows // t
        out = torch.empty(bsz, t, hkv * g * dim, device=q.device, dtype=q.dtype)
        strides = (out.stride(0), g * dim, dim, hkv * g * dim)
    else:
        out = torch.empty(bsz, hkv, rows, dim, device=q.device, dtype=q.dtype)
        strides = (out.stride(0), out.stride(1), t * dim, dim)
    tree_chunks = triton.cdiv(t - 1, chunk) + 1 if tree is not None else 0
    table = positions if tree is None else tree
    _partial[(bsz * hkv, row_blocks * splits + t * tree_chunks)](
        q, k, v, positions, table, rows_of if batched else positions, m, l_, acc, rows, t,
        hkv, kv_len, chunk, splits, row_blocks, max(tree_chunks, 1), 1.0 / math.sqrt(dim),
        q.stride(0), q.stride(1), sq_g, sq_t, k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), D=dim, BLOCK_R=block_r, BLOCK_N=BLOCK_N,
        TREE=tree is not None, ROWS=batched)
    _combine[(bsz * hkv, row_blocks)](
        m, l_, acc, out, table, rows, t, hkv, chunk, splits, *strides, D=dim,
        BLOCK_R=block_r, TREE=tree is not None)
    return out
