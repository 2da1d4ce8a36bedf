"""The best-first draft tree built on the device by one Triton program (reference.py says
what it computes; this file computes the same bits).

One program walks the lattice's depths: at depth d it scores the T x K children of the
previous depth's beam, sorts them once (tl.sort of 64-bit keys: the score's order-preserving
32-bit image, then the candidate's index reversed, so that ties go to the lower index as in
the reference's stable sort) and keeps the first T as the next beam. Then one sort of every
level's beam picks the tree's budget - 1 nodes, and each node's parent is looked up through
a position table. Beams, the table and the sorted keys pass through a small global scratch
between barriers (Triton cannot slice a register tensor). One launch, no host value: a CUDA
graph captures it, and no lattice or tree crosses to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NEG_INF_KEY = tl.constexpr(-2139095041)   # _key(-inf): the lowest score a candidate has


@triton.jit
def _key(x):
    """fp32 -> int32 whose signed order is x's (-0.0 taken as 0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    s = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return tl.where(s == -1, 0, s)


@triton.jit
def _unkey(s):
    bits = tl.where(s >= 0, s, s ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pack(s, order, n: tl.constexpr):
    """64-bit sort key: score key high, then n - 1 - order (ties: the lower order first)."""
    return (s.to(tl.int64) << 32) | (n - 1 - order).to(tl.int64)


@triton.jit
def _tree_build(lat_ptr, ctl_ptr, out_ptr, scr_ptr, D: tl.constexpr, K: tl.constexpr,
                KP: tl.constexpr, T: tl.constexpr, DT: tl.constexpr, SB: tl.constexpr):
    root = tl.load(ctl_ptr)
    k = tl.load(ctl_ptr + 1)
    budget = tl.load(ctl_ptr + 2)
    # scratch (int64): sorted keys [SB], then per level [D, T]: score key, parent, rank;
    # then the position table [DT]
    lvl_s = scr_ptr + SB
    lvl_p = lvl_s + D * T
    lvl_r = lvl_p + D * T
    pos_of = lvl_r + D * T
    i = tl.arange(0, T)
    r = tl.arange(0, KP)
    prev = tl.where(i == 0, 0.0, float("-inf"))          # the root, alone above depth 1
    flat2 = i[:, None] * KP + r[None, :]                  # candidate order in a level
    for d in range(D):
        ok = (r < K) & ((r * 0 + d) < k)
        tok = tl.load(lat_ptr + d * K + r, mask=ok, other=-1.0)
        lp = tl.load(lat_ptr + D * K + d * K + r, mask=ok, other=float("-inf")).to(tl.float32)
        lp = tl.where(tok >= 0, tl.minimum(lp, 0.0), float("-inf"))
        cand = prev[:, None] + lp[None, :]                # [T, KP]
        keys = tl.reshape(_pack(_key(cand), flat2, T * KP), [T * KP])
        keys = tl.sort(keys, 0, descending=True)
        tl.store(scr_ptr + tl.arange(0, T * KP), keys)
        tl.debug_barrier()
        top = tl.load(scr_ptr + i, cache_modifier=".cg")  # the T best of the level
        tl.debug_barrier()
        order = T * KP - 1 - (top & 0xFFFFFFFF)
        s = (top >> 32).to(tl.int32)
        prev = _unkey(s)
        tl.store(lvl_s + d * T + i, s.to(tl.int64))
        tl.store(lvl_p + d * T + i, order // KP)
        tl.store(lvl_r + d * T + i, order % KP)
    # the tree: the budget - 1 best nodes of all levels, shallower first on ties
    g = tl.arange(0, DT)
    s = tl.load(lvl_s + g, mask=g < D * T, other=-2147483648, cache_modifier=".cg").to(tl.int32)
    keys = tl.sort(_pack(s, g, DT), 0, descending=True)
    tl.store(scr_ptr + g, keys)
    tl.store(pos_of + g, tl.zeros([DT], dtype=tl.int64))
    tl.debug_barrier()
    node = i
    sel = tl.load(scr_ptr + node - 1, mask=node >= 1, other=0, cache_modifier=".cg")
    flat = DT - 1 - (sel & 0xFFFFFFFF)
    valid = (node >= 1) & (node < budget) & ((sel >> 32).to(tl.int32) > NEG_INF_KEY)
    flat = tl.where(valid, flat, 0)
    tl.store(pos_of + flat, node.to(tl.int64), mask=valid)
    tl.debug_barrier()
    depth = flat // T
    up = tl.load(lvl_p + flat, mask=valid, other=0, cache_modifier=".cg")
    rank = tl.load(lvl_r + flat, mask=valid, other=0, cache_modifier=".cg")
    above = valid & (depth > 0)
    parent = tl.load(pos_of + (depth - 1) * T + up, mask=above, other=0, cache_modifier=".cg")
    token = tl.load(lat_ptr + depth * K + rank, mask=valid, other=0.0).to(tl.int64)
    tl.store(out_ptr + node, tl.where(valid, token, root))
    tl.store(out_ptr + T + node, tl.where(above, parent, 0))
    tl.store(out_ptr + 2 * T + node, tl.where(valid, depth + 1, 0))


def tree_build(lattice: torch.Tensor, ctl: torch.Tensor, t: int):
    """(tokens, parents, depths), each [t] int64, views of one fresh [3, t] tensor; lattice
    [2, D, K] float64 contiguous and ctl [4] int64 on one CUDA device (or under
    TRITON_INTERPRET=1 on the CPU). t a power of two >= 2, K <= 64."""
    if lattice.dim() != 3 or lattice.shape[0] != 2 or lattice.dtype != torch.float64:
        raise ValueError(f"a packed lattice is [2, D, K] float64, not {list(lattice.shape)} "
                         f"{lattice.dtype}")
    if t < 2 or t & (t - 1):
        raise ValueError(f"a tree bucket is a power of two >= 2, not {t}")
    depth_n, width = lattice.shape[1], lattice.shape[2]
    kp = triton.next_power_of_2(width)
    dt = triton.next_power_of_2(depth_n * t)
    sb = max(t * kp, dt)
    lattice = lattice.contiguous()
    out = torch.empty(3, t, dtype=torch.long, device=lattice.device)
    scratch = torch.empty(sb + 3 * depth_n * t + dt, dtype=torch.long, device=lattice.device)
    _tree_build[(1,)](lattice, ctl, out, scratch, D=depth_n, K=width, KP=kp, T=t, DT=dt,
                      SB=sb, num_warps=4)
    return out[0], out[1], out[2]
