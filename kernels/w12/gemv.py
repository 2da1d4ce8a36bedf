"""Split-K W12 GEMV for the memory-bound decode/verify regime: y[M, N] = x[M, K] @ W^T.

The second W12 kernel (the first is kernels/w12/gemm.py; docs/w12.md says why that one is
slow). Designed for M <= 16 (decode and short verify), with a tensor-core path for 17..64:

- Many programs in flight: the grid is (N tiles, K splits), the split chosen so that the
  grid covers the SMs several times over (`WAVES`), capped so that the fp32 partial sums
  stay small against the weight bytes (`PARTIAL_FRACTION`).
- Each program streams a contiguous [BLOCK_N, split] slab of both planes in chunks of
  [BLOCK_N, BLOCK_K]: ``hi`` read as 16-bit pairs (weights 2j, 2j+1), ``lo`` as bytes (the
  pair's two nibbles). The K mask is a constexpr that is off whenever every chunk is full,
  and the split start is a multiple of the chunk, so the loads can be 16-byte vectors
  (the first kernel's stride-2 K mask forced 1- and 2-byte loads).
- Decode with integer ops in registers: the bf16 bits of a weight shifted left by 16 are
  its fp32 bits, so a weight becomes an fp32 value with one shift and one bitcast.
- Activations: bf16 rows with even K are read as 32-bit pairs (x[2j], x[2j+1]) and split
  with the same shift (exact); other dtypes (fp32/fp16 under the interpreter) per element.
- `dot=False` (M = 1, and one of the 2..4 configurations): fp32 FMAs on the CUDA cores.
  Every tensor of the loop has the weight tile's shape and layout (x rows are read as
  broadcast tiles, the repeats hit L1), so nothing passes through shared memory: M = 1
  accumulates a [BLOCK_N, BLOCK_K/2] tile and reduces it once after the loop; M > 1 reduces
  each chunk per row of x into a transposed [BLOCK_N, BLOCK_M] accumulator.
  `dot=True` (the rest of 2..4, all of 5..64): bf16 operands on the GPU, fp32
  accumulation, BLOCK_M >= 16. Without `swap`, two tl.dot per chunk (even and odd k), x
  first. With `swap` the decoded weight tile is the first operand and x^T the second (acc is
  y^T [BLOCK_N, BLOCK_M]): on the H200 the best swapped configuration ran 1.16-3.4x faster
  than the earlier candidates at M = 4 and 16 on 27B-class shapes (bench/archive/NOTES-2026.md). The
  decoded bf16 weights are the halves of the assembled word, truncated and reinterpreted.
  With `shared_k` as well, one dot per chunk over K in a permuted order shared by both
  operands (`_swap_k`), so that each decoded word already is a register of the tensor-core
  operand: fewer instructions, but on the H200 slower at M <= 16 (the tile is
  latency-bound: Nsight Compute, bench/archive/NOTES-2026.md) and faster at M = 64 on wide shapes, so
  only the 17..64 bucket lists it. `maxnreg` caps registers a thread: at M = 1 a cap of 96
  (more programs an SM) won every 27B-class layer shape on the H200, so four of that
  bucket's candidates carry it; at M = 4 and 16 caps lost (bench/archive/NOTES-2026.md).
- Exceptions exactly, as in the first kernel: the planes give w0 = 2**(b-127) at an
  exception's slot, and the program owning split 0 of a tile adds x[:, k] * w_exc -
  x[:, k] * w0 for each exception of its rows, by selects (never a multiply by 0); the
  first BLOCK_E of them are loaded before the main loop, so their latency hides behind it.
- One split: the kernel stores y in x's dtype (one launch). More: each program stores its
  fp32 partial [M, BLOCK_N] (no atomics: deterministic) and a small second kernel sums the
  splits in a fixed order, several loads in flight at a time, and stores y.

``view="w8"`` compiles the same kernel without the ``lo`` plane (the nested 8-bit view).
Configurations: at most 6 per M bucket (1, 2..4, 5..16, 17..64), timed once per (bucket,
N, K, view, dtype) at the first call on CUDA, inside a CUDA graph (gemm.graph_us); the w8
view is tuned on its own. Under TRITON_INTERPRET=1 an untuned shape uses the bucket's first
configuration; during a CUDA graph capture (no timing there) w8 takes w12's choice of the
same shape and bucket when there is one, else the bucket's first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.w12.format import W12Tensor
from kernels.w12.gemm import _apply, _num_sms, by_row_blocks, fastest

MAX_M = 64
WAVES = 8                 # "auto" split: aim for this many programs per SM
PARTIAL_FRACTION = 0.10   # "auto" split: fp32 partial bytes <= this share of weight bytes
BLOCK_E = 16              # exceptions loaded at once by a tile's split-0 program
REDUCE_BLOCK_N = 64


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int           # weights per chunk along K (pairs: block_k // 2), >= 32
    num_warps: int = 4
    num_stages: int = 2
    split: str | int = "auto"
    dot: bool = False      # tensor-core dots (BLOCK_M >= 16) instead of fp32 FMAs
    swap: bool = False     # dot with the operands swapped: W tile [BLOCK_N, K] times x^T
    shared_k: bool = False  # swap only: one dot a chunk in _swap_k's K order (else two)
    maxnreg: int | None = None  # register cap a thread (CUDA): more programs an SM


BUCKETS = (1, 4, 16, 64)  # an M bucket is the smallest of these >= M
C = GemvConfig
# Candidates per M bucket, from the H200 sweeps (bench/gpu_w12_sweep.py, bench/archive/NOTES-2026.md
# "W12 GEMV sweep" and "PTX pair decode"): the fastest configuration of each 27B-class layer
# shape at M = 1, 4, 16 (the second sweep, with the PTX decode), the split given explicitly
# where "auto" lost (one split skips the reduce launch).
CONFIGS: dict[int, tuple[GemvConfig, ...]] = {
    # M = 1: CUDA-core FMAs, the PTX pair decode (about 6.8 SASS instructions a weight);
    # the winners of the register-cap sweep (bench/archive/NOTES-2026.md, 2026-11-30 09:24 UTC: 96
    # registers a thread, more programs an SM) on the groups qkv, gate/up and on o, down and
    # head, then two uncapped winners of the earlier sweeps (q, head)
    1: (C(16, 512, 4, 3, split=1, maxnreg=96), C(8, 1024, 4, 1, split=1, maxnreg=96),
        C(16, 512, 4, 3, maxnreg=96), C(16, 256, 2, 3, maxnreg=96),
        C(16, 512, 4, 1, split=1), C(16, 256, 2, 3)),
    # M = 2..4 and 5..16: tensor cores with the weight tile as the first operand (swap),
    # the same shapes in the same order
    4: (C(64, 128, 4, 4, split=4, dot=True, swap=True),
        C(128, 128, 4, 2, split=16, dot=True, swap=True),
        C(64, 256, 4, 4, split=1, dot=True, swap=True),
        C(64, 128, 4, 3, split=4, dot=True, swap=True),
        C(64, 256, 4, 3, split=8, dot=True, swap=True),
        C(64, 128, 4, 3, split=2, dot=True, swap=True)),
    16: (C(64, 256, 4, 2, split=4, dot=True, swap=True),
         C(64, 64, 4, 3, split=8, dot=True, swap=True),
         C(128, 256, 8, 4, split=8, dot=True, swap=True),
         C(64, 128, 4, 3, dot=True, swap=True),
         C(64, 256, 4, 3, split=8, dot=True, swap=True),
         C(64, 256, 4, 3, dot=True, swap=True)),
    # M = 17..64: the two swapped tiles that won M = 32/64 with two dots a chunk, and the
    # winners of the shared-K sweep (bench/archive/NOTES-2026.md "shared K order"): q/gate/up, o, down
    64: (C(64, 128, 4, 3, dot=True, swap=True), C(64, 256, 4, 3, split=2, dot=True, swap=True),
         C(64, 128, 4, 3, dot=True, swap=True, shared_k=True),
         C(128, 128, 8, 3, split=4, dot=True, swap=True, shared_k=True),
         C(64, 64, 4, 4, split=1, dot=True, swap=True, shared_k=True),
         C(64, 64, 4, 3, split=16, dot=True, swap=True, shared_k=True)),
}
del C
_TUNED: dict[tuple, GemvConfig] = {}


def bucket(m: int) -> int:
    for b in BUCKETS:
        if m <= b:
            return b
    raise ValueError(f"M = {m} is above {MAX_M}; w12_gemv splits larger M itself")


@triton.jit
def _x_pairs(row_ptr, j, mask, K, X_PAIRS: tl.constexpr):
    """x[., 2j] and x[., 2j+1] in fp32. X_PAIRS: row_ptr is int32 pairs of bf16 (split by
    shifts, exact); else row_ptr holds x's elements (odd K: the last odd slot reads 0)."""
    if X_PAIRS:
        xp = tl.load(row_ptr + j, mask=mask, other=0)
        xe = (xp << 16).to(tl.float32, bitcast=True)
        xo = (xp & -65536).to(tl.float32, bitcast=True)
    else:
        ke = 2 * j
        xe = tl.load(row_ptr + ke, mask=mask & (ke < K), other=0.0).to(tl.float32)
        xo = tl.load(row_ptr + ke + 1, mask=mask & (ke + 1 < K), other=0.0).to(tl.float32)
    return xe, xo


@triton.jit
def _decode_pairs(h, lo, base72, USE_LO: tl.constexpr):
    """Both weights of a pair as one int32 of two bf16 (even weight in the low half), from
    h (int32: the pair's hi bytes, even weight's in bits 0..7; bits above 15 are ignored),
    lo (the pair's lo byte: even weight's nibble low) and base72 (base << 7 in both halves).
    Packed: each step works on both weights at once (about 7 instructions a pair):
      e = hi bytes at bits 8..15 and 24..31: their sign bits already sit at 15 and 31;
      v = offset and mantissa[6:4] moved under the exponent, plus the base (no carry
          crosses the halves: base + offset <= 254);
      lo * 0x1001 puts the even nibble at bits 0..3 and the odd one at 16..19; the mask
          takes only those bits from it (bits 4..7 and 12..15 of the product are junk)."""
    e = ((h & 0xFF) << 8) | ((h & 0xFF00) << 16)
    v = ((e & 0x7F007F00) >> 4) + base72
    if USE_LO:
        v = (v & -983056) | ((lo * 0x1001) & 0x000F000F)  # -983056 == 0xFFF0FFF0 as int32
    return v | (e & -2147450880)  # -2147450880 == 0x80008000 as int32


# _decode_pairs in PTX for four pairs at once (inline_asm_elementwise, pack=4): $4, $5 hold
# the hi bytes of pairs 0-1 and 2-3 (int16 x 2 each), $6 the four lo bytes, $7-$10 base72.
# Byte permutes (prmt) place each pair's hi bytes at bits 8..15 / 24..31 and its lo byte at
# bits 0..7; Triton's integer ops leave these to ptxas as shifts and masks: 9.55 SASS
# instructions a weight in the M = 1 loop with them, 6.84 with this (bench/w12_sass.py,
# sm_90). lop3 0xE4: (a & c) | (b & ~c); 0xF8: a | (b & c).
def _pair_asm(use_lo: bool) -> str:
    steps = []
    for k in range(4):
        lo = (f"prmt.b32 l, $6, 0, {0x4440 + k:#x};\n"     # lo byte k alone at bits 0..7
              "mul.lo.u32 l, l, 0x1001;\n"
              "lop3.b32 t, t, l, 0xFFF0FFF0, 0xE4;\n") if use_lo else ""
        steps.append(f"prmt.b32 e, ${4 + k // 2}, 0, {0x1404 if k % 2 == 0 else 0x3424:#x};\n"
                     "and.b32 t, e, 0x7F007F00;\n"
                     "shr.u32 t, t, 4;\n"
                     f"add.u32 t, t, ${7 + k};\n" + lo +
                     f"lop3.b32 ${k}, t, e, 0x80008000, 0xF8;\n")
    return "{\n.reg .b32 e, t, l;\n" + "".join(steps) + "}"


_ASM_LO = tl.constexpr(_pair_asm(True))
_ASM_HI = tl.constexpr(_pair_asm(False))


@triton.jit
def _decode_pairs_asm(h, lo, base72, USE_LO: tl.constexpr):
    """_decode_pairs in inline PTX (CUDA only: the interpreter cannot run it)."""
    args = [h.to(tl.int16), lo.to(tl.uint8), base72]
    if USE_LO:
        return tl.inline_asm_elementwise(_ASM_LO, "=r,=r,=r,=r,r,r,r,r,r,r,r", args,
                                         dtype=tl.int32, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(_ASM_HI, "=r,=r,=r,=r,r,r,r,r,r,r,r", args,
                                         dtype=tl.int32, is_pure=True, pack=4)


@triton.jit
def _swap_k(t, OTHER: tl.constexpr, HALF: tl.constexpr, K_FIRST: tl.constexpr):
    """The K order of the swapped dot, for both operands: t holds (pair, half) of each pair
    j of the chunk, as [OTHER, HALF, 2] (weights, K_FIRST=0) or [HALF, 2, OTHER] (x^T,
    K_FIRST=1); returns [OTHER, 2*HALF] or [2*HALF, OTHER]. Within each group of 16 pairs,
    pair p = 4c + 2s + h goes to position 8s + 4h + c: a thread of the tensor-core operand
    layout holds pairs c, c+4, c+8, c+12 of a group, which are then the four pairs it loaded
    next to each other. Any order gives the same sum when both operands share it; this one
    lets the compiler keep the decoded words in place (6.5 -> 5.0 SASS instructions a
    weight at M = 16 under Triton 3.6, bench/archive/NOTES-2026.md)."""
    if K_FIRST:
        t = t.reshape(HALF // 16, 4, 2, 2, 2, OTHER).permute(0, 2, 3, 1, 4, 5)
        return t.reshape(2 * HALF, OTHER)
    else:
        t = t.reshape(OTHER, HALF // 16, 4, 2, 2, 2).permute(0, 1, 3, 4, 2, 5)
        return t.reshape(OTHER, 2 * HALF)


@triton.jit
def _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, e0, e_end, K, stride_xm, offs_m, mask_m,
                X_PAIRS: tl.constexpr, BLOCK_E: tl.constexpr):
    """Exceptions e0 .. min(e0 + BLOCK_E, e_end): their rows (-1 where masked) and the
    corrections x[:, k] * w_exc - x[:, k] * w0 [BLOCK_M, BLOCK_E] in fp32 (integer decode
    of the bf16 bits, so no bf16 arithmetic)."""
    offs_e = e0 + tl.arange(0, BLOCK_E)
    me = offs_e < e_end
    idx = tl.load(eidx_ptr + offs_e, mask=me, other=0).to(tl.int64)
    en = (idx // K).to(tl.int32)
    ek = idx - en.to(tl.int64) * K
    wv = (tl.load(eval_ptr + offs_e, mask=me, other=0).to(tl.int32) << 16)
    wv = wv.to(tl.float32, bitcast=True)
    w0 = (tl.load(base_ptr + en, mask=me, other=1).to(tl.int32) << 23).to(tl.float32, bitcast=True)
    xm = mask_m[:, None] & me[None, :]
    if X_PAIRS:  # the int32 word of pair ek // 2; x[ek] is its low half when ek is even
        xp = tl.load(x_ptr + offs_m[:, None] * stride_xm + (ek // 2)[None, :], mask=xm, other=0)
        xv = tl.where((ek % 2 == 0)[None, :], xp << 16, xp & -65536).to(tl.float32, bitcast=True)
    else:
        xv = tl.load(x_ptr + offs_m[:, None] * stride_xm + ek[None, :], mask=xm,
                     other=0.0).to(tl.float32)
    corr = xv * wv[None, :] - xv * w0[None, :]
    return tl.where(me, en, -1), corr


@triton.jit
def _w12_gemv_kernel(x_ptr, hi_ptr, lo_ptr, base_ptr, rowptr_ptr, eidx_ptr, eval_ptr, out_ptr,
                     M, N, K, KH, stride_xm, stride_h, stride_l, stride_os, stride_om,
                     split_pairs,
                     USE_LO: tl.constexpr, X_PAIRS: tl.constexpr, USE_DOT: tl.constexpr,
                     DOT_BF16: tl.constexpr, SWAP: tl.constexpr, SHARED_K: tl.constexpr,
                     EVEN_K: tl.constexpr,
                     PTX: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
                     PREFETCH_E: tl.constexpr):
    """Sums over pairs [pid_k * split_pairs, +split_pairs) of rows of tile pid_n into
    out[pid_k, :M, tile]: fp32 partials, or y itself when there is one split. The split-0
    program adds the tile's exception corrections. KH = pairs per row (Kp / 2); x_ptr is
    int32 pairs when X_PAIRS (stride_xm in pairs), else elements. PREFETCH_E: load the
    first BLOCK_E exceptions before the main loop (off at BLOCK_M > 16, where the registers
    they hold would spill)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    HALF: tl.constexpr = BLOCK_K // 2
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, HALF)
    mask_n = offs_n < N
    mask_m = offs_m < M
    base7 = tl.load(base_ptr + offs_n, mask=mask_n, other=1).to(tl.int32) << 7
    base72 = (base7 | (base7 << 16))[:, None]  # the base exponent in both halves of a pair
    hrow = hi_ptr + offs_n[:, None] * stride_h
    lrow = lo_ptr + offs_n[:, None] * stride_l
    if USE_DOT and SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # y^T tile
    elif USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)     # reduced over K after the loop
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # transposed: no layout change
    zero_n = (offs_n * 0)[:, None]
    # exceptions of this tile's rows (split 0 only): the first BLOCK_E are loaded now, so
    # their latency hides behind the main loop; they are added after it
    n0 = pid_n * BLOCK_N
    e_start = tl.load(rowptr_ptr + n0)
    e_end = tl.load(rowptr_ptr + tl.minimum(n0 + BLOCK_N, N))
    e_end = tl.where(pid_k == 0, e_end, e_start)
    if PREFETCH_E:
        en, corr = _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, e_start, e_end, K,
                               stride_xm, offs_m, mask_m, X_PAIRS, BLOCK_E)
    j_lo = pid_k * split_pairs
    j_hi = tl.minimum(j_lo + split_pairs, KH)
    for jb in range(j_lo, j_hi, HALF):
        j = jb + offs_j
        if EVEN_K:
            wmask = mask_n[:, None]
        else:
            wmask = mask_n[:, None] & (j < KH)[None, :]
        h = tl.load(hrow + j[None, :], mask=wmask, other=0).to(tl.int32)
        if USE_LO:
            lo = tl.load(lrow + j[None, :], mask=wmask, other=0).to(tl.int32)  # uint8: 0..255
        else:
            lo = h  # a placeholder: neither decode reads lo without the lo plane
        if PTX:
            d = _decode_pairs_asm(h, lo, base72, USE_LO)
        else:
            d = _decode_pairs(h, lo, base72, USE_LO)
        if USE_DOT and DOT_BF16:
            # the halves are the bf16 weights: truncate and reinterpret (no fp32 detour)
            web = d.to(tl.int16).to(tl.bfloat16, bitcast=True)
            wob = (d >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            # bf16 bits << 16 are the fp32 bits of the same value
            we = (d << 16).to(tl.float32, bitcast=True)
            wo = (d & -65536).to(tl.float32, bitcast=True)
        if USE_DOT and SWAP and SHARED_K:
            # weights as the dot's first operand (kept in registers on Hopper), x^T second:
            # the tensor-core tile's wide side is the layer's N, its narrow side x's rows.
            # One dot per chunk over K in the order _swap_k gives to both operands: each
            # thread's decoded pairs are then already the operand's registers (no repacking).
            w = tl.join(web, wob) if DOT_BF16 else tl.join(we, wo)
            w = _swap_k(w.reshape(BLOCK_N, HALF, 2), BLOCK_N, HALF, 0)
            kk = 2 * jb + tl.arange(0, BLOCK_K)
            xmask = mask_m[None, :] if EVEN_K else mask_m[None, :] & (kk < K)[:, None]
            if X_PAIRS:  # the int32 pairs are bf16 elements
                xt = tl.load(x_ptr.to(tl.pointer_type(tl.bfloat16)) + offs_m[None, :]
                             * (2 * stride_xm) + kk[:, None], mask=xmask, other=0.0)
            else:
                xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + kk[:, None], mask=xmask,
                             other=0.0)
            xt = _swap_k(xt.reshape(HALF, 2, BLOCK_M), BLOCK_M, HALF, 1)
            if DOT_BF16:
                acc += tl.dot(w, xt.to(tl.bfloat16))
            else:
                acc += tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        elif USE_DOT and SWAP:
            # the same operands as two dots per chunk, even and odd k
            if EVEN_K:
                xmask = mask_m[None, :]
            else:
                xmask = mask_m[None, :] & (j < KH)[:, None]
            xe, xo = _x_pairs(x_ptr + offs_m[None, :] * stride_xm, j[:, None], xmask, K,
                              X_PAIRS)
            if DOT_BF16:
                acc += tl.dot(web, xe.to(tl.bfloat16))
                acc += tl.dot(wob, xo.to(tl.bfloat16))
            else:
                acc += tl.dot(we, xe, input_precision="ieee")
                acc += tl.dot(wo, xo, input_precision="ieee")
        elif USE_DOT:
            if EVEN_K:
                xmask = mask_m[:, None]
            else:
                xmask = mask_m[:, None] & (j < KH)[None, :]
            xe, xo = _x_pairs(x_ptr + offs_m[:, None] * stride_xm, j[None, :], xmask, K,
                              X_PAIRS)
            if DOT_BF16:
                acc += tl.dot(xe.to(tl.bfloat16), tl.trans(web))
                acc += tl.dot(xo.to(tl.bfloat16), tl.trans(wob))
            else:
                acc += tl.dot(xe, tl.trans(we), input_precision="ieee")
                acc += tl.dot(xo, tl.trans(wo), input_precision="ieee")
        else:
            # x rows read as [BLOCK_N, HALF] broadcasts (same shape and layout as the weight
            # tile, so nothing moves through shared memory; the repeats hit L1)
            for mm in tl.static_range(BLOCK_M):
                xe, xo = _x_pairs(x_ptr + mm * stride_xm, j[None, :] + zero_n,
                                  wmask & ((zero_n + mm) < M),
                                  K, X_PAIRS)
                if BLOCK_M == 1:
                    acc += we * xe   # two FFMAs (a + b*c + d*e would add a FADD)
                    acc += wo * xo
                else:
                    s = tl.sum(we * xe + wo * xo, axis=1)
                    acc += tl.where(offs_m[None, :] == mm, s[:, None], 0.0)
    if USE_DOT and SWAP:
        out = tl.trans(acc)
    elif USE_DOT:
        out = acc
    elif BLOCK_M == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.trans(acc)
    if PREFETCH_E:
        if e_end > e_start:
            out = _apply(out, en, corr, offs_n, BLOCK_E)
        e_next = e_start + BLOCK_E
    else:
        e_next = e_start
    for es in range(e_next, e_end, BLOCK_E):  # the rest (all of them without PREFETCH_E)
        en, corr = _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, es, e_end, K, stride_xm,
                               offs_m, mask_m, X_PAIRS, BLOCK_E)
        out = _apply(out, en, corr, offs_n, BLOCK_E)
    dst = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["S"])
def _w12_reduce_kernel(part_ptr, y_ptr, M, N, S, stride_ps, stride_ym,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, S_CHUNK: tl.constexpr):
    """y[:, tile] = part[0] + part[1] + ... + part[S-1] (in that order), in y's dtype. The
    S_CHUNK loads of a step are independent, so they are in flight together."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    src = part_ptr + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s0 in range(0, S, S_CHUNK):
        for i in tl.static_range(S_CHUNK):
            s_ok = (offs_n * 0 + (s0 + i)) < S
            acc += tl.load(src + (s0 + i) * stride_ps, mask=mask & s_ok[None, :], other=0.0)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask)


def _block_m(m: int, cfg: GemvConfig) -> int:
    b = triton.next_power_of_2(max(1, m))
    return max(16, b) if cfg.dot else b


def plan(cfg: GemvConfig, m: int, n: int, k: int, device: torch.device) -> tuple[int, int]:
    """(splits, pairs per split) for this configuration and shape."""
    half = cfg.block_k // 2
    kh = (k + 1) // 2
    chunks = triton.cdiv(kh, half)
    if cfg.split != "auto":
        split = max(1, min(int(cfg.split), chunks))
    else:
        tiles = triton.cdiv(n, cfg.block_n)
        want = triton.cdiv(WAVES * _num_sms(device), tiles)
        weight_bytes_per_row = 1.5 * k
        cap = max(1, int(PARTIAL_FRACTION * weight_bytes_per_row / (4 * max(1, m))))
        split = max(1, min(want, cap, chunks))
    per = triton.cdiv(chunks, split) * half
    return triton.cdiv(kh, per), per


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _launch(x: torch.Tensor, t: W12Tensor, y: torch.Tensor, use_lo: bool, cfg: GemvConfig):
    m, k = x.shape
    n = t.shape[0]
    if cfg.block_k < 32 or cfg.block_k & (cfg.block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 32, not {cfg.block_k}")
    kh = t.hi.shape[1] // 2
    split, per = plan(cfg, m, n, k, x.device)
    # one split: the kernel writes y itself; more: fp32 partials, summed by the reduce
    out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    hi16 = t.hi.view(torch.int16)
    bf16 = x.dtype == torch.bfloat16
    x_pairs = bf16 and k % 2 == 0 and x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0
    xk = x.view(torch.int32) if x_pairs else x
    stride_xm = x.stride(0) // 2 if x_pairs else x.stride(0)
    grid = (triton.cdiv(n, cfg.block_n), split)
    _w12_gemv_kernel[grid](
        xk, hi16, t.lo, t.base, t.row_ptr(), t.exc_idx, t.exc_val, out,
        m, n, k, kh, stride_xm, hi16.stride(0), t.lo.stride(0),
        out.stride(0) if split > 1 else 0, out.stride(-2), per,
        USE_LO=use_lo, X_PAIRS=x_pairs, USE_DOT=cfg.dot,
        DOT_BF16=bf16 and not _interpreting(), SWAP=cfg.dot and cfg.swap,
        SHARED_K=cfg.dot and cfg.swap and cfg.shared_k,
        EVEN_K=kh % (cfg.block_k // 2) == 0, PTX=not _interpreting(),
        BLOCK_M=_block_m(m, cfg), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_E=BLOCK_E,
        PREFETCH_E=_block_m(m, cfg) <= 16, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg and not _interpreting() else {}))
    if split > 1:
        bm = triton.next_power_of_2(m)
        _w12_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK_N),)](
            out, y, m, n, split, out.stride(0), y.stride(0),
            BLOCK_M=bm, BLOCK_N=REDUCE_BLOCK_N, S_CHUNK=8 if bm <= 4 else 4 if bm <= 16 else 2,
            num_warps=4)


def _key(m: int, t: W12Tensor, view: str, dtype) -> tuple:
    return (bucket(m), t.shape[0], t.shape[1], view, dtype, t.device.index)


def tune(x: torch.Tensor, t: W12Tensor, view: str = "w12", configs=None) -> GemvConfig:
    """Time each configuration of x's M bucket once on CUDA and remember the fastest."""
    m = x.shape[0]
    key = _key(m, t, view, x.dtype)
    if key in _TUNED:
        return _TUNED[key]
    configs = CONFIGS[bucket(m)] if configs is None else configs
    if x.device.type != "cuda" or len(configs) == 1:
        return configs[0]
    best = fastest(configs, lambda cfg, y: _launch(x, t, y, view == "w12", cfg),
                   torch.empty(m, t.shape[0], dtype=x.dtype, device=x.device))
    if best is None:
        raise RuntimeError(f"no W12 GEMV configuration ran for {tuple(t.shape)}, M={m}")
    _TUNED[key] = best
    return best


def chosen(m: int, t: W12Tensor, view: str, dtype) -> GemvConfig | None:
    """The configuration a call would use without tuning, as inside a CUDA graph capture:
    the view's own tuned choice, or for w8 the w12 choice of the same shape and bucket
    (None: outside a capture the call tunes first; inside, it takes the bucket's first)."""
    cfg = _TUNED.get(_key(m, t, view, dtype))
    if cfg is None and view == "w8":
        cfg = _TUNED.get(_key(m, t, "w12", dtype))
    return cfg


def w12_gemv(x: torch.Tensor, t: W12Tensor, view: str = "w12",
             config: GemvConfig | None = None) -> torch.Tensor:
    """y = x @ W^T for x [..., K] (bf16 on CUDA; fp32/fp16/bf16 under the interpreter)."""
    def run(xs: torch.Tensor, out: torch.Tensor) -> None:
        cfg = config
        if cfg is None:
            cfg = _TUNED.get(_key(xs.shape[0], t, view, x.dtype))
            if cfg is None:
                if x.is_cuda and torch.cuda.is_current_stream_capturing():  # no timing here
                    cfg = chosen(xs.shape[0], t, view, x.dtype) or CONFIGS[bucket(xs.shape[0])][0]
                else:
                    cfg = tune(xs, t, view)
        _launch(xs, t, out, view == "w12", cfg)
    return by_row_blocks(x, t, view, run)
