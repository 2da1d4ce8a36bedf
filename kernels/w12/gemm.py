"""Fused W12 GEMM in Triton: y[M, N] = x[M, K] @ W^T with W stored as W12 planes.

One program computes a BLOCK_N slice of the output channels for all M (<= 64) rows over
one K range (split-K when the grid of N tiles alone would not fill the chip). Per K step
it loads the ``hi`` plane as 16-bit pairs (weights 2j and 2j+1) and the ``lo`` plane's
byte j, decodes both weights of the pair in registers (a few integer ops, no select:
``((hi<<4 & 0x7F0) | nibble) + (b << 7) | sign << 15``), bitcasts to bf16 and runs two
tensor-core dots (even and odd k) with fp32 accumulation. Exceptions are applied exactly in
the weights: their slots decode to w0 = 2**(b-127) (code 0), and the program that owns
split 0 of a tile adds x[:, k] * w_exc - x[:, k] * w0 for each exception of its rows
before the single store. Exceptions are sorted by row and found through a row pointer;
the first BLOCK_E of a tile are loaded in parallel before the main loop (their latency
hides behind it) and added after it, further ones in chunks of BLOCK_E.

``view="w8"`` compiles the same kernel without the ``lo`` plane (the nested 8-bit view:
half the bytes of bf16). References: kernels/w12/reference.py.

Configurations: a small list (<= 6), timed once per (N, K, view, dtype) on CUDA by `tune`
at the first call (M buckets 16/32/64 reuse the M <= 16 choice unless tuned themselves);
under TRITON_INTERPRET=1 or during CUDA graph capture an untuned shape uses DEFAULT, so
run one call per shape before capturing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.w12.format import W12Tensor

MAX_M = 64


@dataclass(frozen=True)
class Config:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split: str | int = "auto"   # "auto": split K while the N tiles do not fill the SMs twice


CONFIGS = (
    Config(64, 128, 4, 4),
    Config(32, 256, 4, 4),
    Config(128, 128, 8, 3),
    Config(64, 256, 8, 3),
    Config(32, 128, 4, 4),
    Config(64, 128, 4, 4, split=1),
)
DEFAULT = CONFIGS[0]
BLOCK_E = 32          # exceptions loaded at once (per tile, in parallel)
_TUNED: dict[tuple, Config] = {}
_SMS: dict[int, int] = {}


@triton.jit
def _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, e0, e_end, K, stride_xm, offs_m, mask_m,
                BLOCK_E: tl.constexpr):
    """Exceptions e0 .. min(e0 + BLOCK_E, e_end): their rows (-1 where masked) and the
    corrections x[:, k] * w_exc - x[:, k] * w0 [BLOCK_M, BLOCK_E] in fp32."""
    offs_e = e0 + tl.arange(0, BLOCK_E)
    me = offs_e < e_end
    idx = tl.load(eidx_ptr + offs_e, mask=me, other=0).to(tl.int64)
    en = (idx // K).to(tl.int32)
    ek = idx - en.to(tl.int64) * K
    wv = tl.load(eval_ptr + offs_e, mask=me, other=0).to(tl.bfloat16, bitcast=True)
    w0 = (tl.load(base_ptr + en, mask=me, other=1).to(tl.int32) << 7).to(tl.int16)
    w0 = w0.to(tl.bfloat16, bitcast=True).to(tl.float32)
    xv = tl.load(x_ptr + offs_m[:, None] * stride_xm + ek[None, :],
                 mask=mask_m[:, None] & me[None, :], other=0.0).to(tl.float32)
    corr = xv * wv.to(tl.float32)[None, :] - xv * w0[None, :]
    return tl.where(me, en, -1), corr


@triton.jit
def _apply(acc, en, corr, offs_n, BLOCK_E: tl.constexpr):
    """acc[:, en[j] - n0] += corr[:, j] for each exception j (selects, never multiplies by
    0, so an inf or NaN correction touches only its own column)."""
    lanes = tl.arange(0, BLOCK_E)
    for j in tl.static_range(BLOCK_E):
        n_j = tl.sum(tl.where(lanes == j, en, 0), axis=0)
        c_j = tl.sum(tl.where((lanes == j)[None, :], corr, 0.0), axis=1)
        acc += tl.where((offs_n == n_j)[None, :], c_j[:, None], 0.0)
    return acc


@triton.jit(do_not_specialize=["M", "k_split"])
def _w12_gemm_kernel(x_ptr, hi_ptr, lo_ptr, base_ptr, rowptr_ptr, eidx_ptr, eval_ptr, y_ptr,
                     M, N, K, stride_xm, stride_h, stride_l, stride_ym, stride_ys, k_split,
                     USE_LO: tl.constexpr, F32_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_E: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    HALF: tl.constexpr = BLOCK_K // 2
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, HALF)
    mask_m = offs_m < M
    mask_n = offs_n < N
    base7 = (tl.load(base_ptr + offs_n, mask=mask_n, other=1).to(tl.int32) << 7)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # exceptions of this tile's rows (split 0 only): the first BLOCK_E are loaded now, in
    # parallel, so their latency hides behind the main loop; they are added after it
    n0 = pid_n * BLOCK_N
    e_start = tl.load(rowptr_ptr + n0)
    e_end = tl.load(rowptr_ptr + tl.minimum(n0 + BLOCK_N, N))
    e_end = tl.where(pid_k == 0, e_end, e_start)
    en, corr = _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, e_start, e_end, K, stride_xm,
                           offs_m, mask_m, BLOCK_E)
    k_lo = pid_k * k_split
    k_hi = tl.minimum(k_lo + k_split, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        j = k0 // 2 + offs_j                      # pair index: weights 2j, 2j+1
        ke = 2 * j
        wmask = mask_n[:, None] & (ke < K)[None, :]
        h = tl.load(hi_ptr + offs_n[:, None] * stride_h + j[None, :], mask=wmask,
                    other=0).to(tl.int32) & 0xFFFF
        if USE_LO:
            lo = tl.load(lo_ptr + offs_n[:, None] * stride_l + j[None, :], mask=wmask,
                         other=0).to(tl.int32) & 0xFF
            be = ((((h << 4) & 0x7F0) | (lo & 0xF)) + base7) | ((h << 8) & 0x8000)
            bo = ((((h >> 4) & 0x7F0) | (lo >> 4)) + base7) | (h & 0x8000)
        else:
            be = (((h << 4) & 0x7F0) + base7) | ((h << 8) & 0x8000)
            bo = (((h >> 4) & 0x7F0) + base7) | (h & 0x8000)
        we = be.to(tl.int16).to(tl.bfloat16, bitcast=True)
        wo = bo.to(tl.int16).to(tl.bfloat16, bitcast=True)
        xrow = x_ptr + offs_m[:, None] * stride_xm
        xe = tl.load(xrow + ke[None, :], mask=mask_m[:, None] & (ke < K)[None, :], other=0.0)
        xo = tl.load(xrow + ke[None, :] + 1, mask=mask_m[:, None] & (ke + 1 < K)[None, :],
                     other=0.0)
        if F32_DOT:
            acc += tl.dot(xe.to(tl.float32), tl.trans(we.to(tl.float32)), input_precision="ieee")
            acc += tl.dot(xo.to(tl.float32), tl.trans(wo.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(xe, tl.trans(we))
            acc += tl.dot(xo, tl.trans(wo))
    if e_end > e_start:
        acc = _apply(acc, en, corr, offs_n, BLOCK_E)
    for es in range(e_start + BLOCK_E, e_end, BLOCK_E):  # tiles with many exceptions
        en, corr = _exceptions(x_ptr, eidx_ptr, eval_ptr, base_ptr, es, e_end, K, stride_xm,
                               offs_m, mask_m, BLOCK_E)
        acc = _apply(acc, en, corr, offs_n, BLOCK_E)
    out = y_ptr + pid_k * stride_ys + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def split_for(cfg: Config, n: int, k: int, device: torch.device) -> int:
    if cfg.split != "auto":
        return max(1, int(cfg.split))
    tiles = triton.cdiv(n, cfg.block_n)
    sms = _num_sms(device)
    if tiles >= 2 * sms:
        return 1
    split = min(8, triton.cdiv(2 * sms, tiles), max(1, k // (2 * cfg.block_k)))
    return max(1, split)


def _block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def _launch(x: torch.Tensor, t: W12Tensor, y: torch.Tensor, use_lo: bool, cfg: Config):
    m, k = x.shape
    n = t.shape[0]
    split = split_for(cfg, n, k, x.device)
    k_split = triton.cdiv(triton.cdiv(k, split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_split)
    hi16 = t.hi.view(torch.int16)
    target = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    stride_ys = 0 if split == 1 else target.stride(0)
    grid = (triton.cdiv(n, cfg.block_n), split)
    _w12_gemm_kernel[grid](
        x, hi16, t.lo, t.base, t.row_ptr(), t.exc_idx, t.exc_val, target,
        m, n, k, x.stride(0), hi16.stride(0), t.lo.stride(0), target.stride(-2), stride_ys,
        k_split, USE_LO=use_lo, F32_DOT=x.dtype != torch.bfloat16, BLOCK_M=_block_m(m),
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_E=BLOCK_E,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        y.copy_(target.sum(0))


def _key(m, t: W12Tensor, view: str, dtype) -> tuple:
    return (_block_m(m), t.shape[0], t.shape[1], view, dtype, t.device.index)


def tune(x: torch.Tensor, t: W12Tensor, view: str = "w12", configs=CONFIGS) -> Config:
    """Time each configuration once on CUDA (in a CUDA graph, `fastest`) and remember the fastest."""
    key = _key(x.shape[0], t, view, x.dtype)
    if key in _TUNED:
        return _TUNED[key]
    if x.device.type != "cuda" or len(configs) == 1:
        return configs[0]
    best = fastest(configs, lambda cfg, y: _launch(x, t, y, view == "w12", cfg),
                   torch.empty(x.shape[0], t.shape[0], dtype=x.dtype, device=x.device))
    _TUNED[key] = best or configs[0]
    return _TUNED[key]


_FLUSH: dict[int, torch.Tensor] = {}
FLUSH_BYTES = 256 << 20  # more than the H200's 50 MB L2: each timed call reads cold weights


def graph_us(fn, device: torch.device, calls: int = 8, reps: int = 5,
             flush: bool = True) -> float:
    """Microseconds per fn() as the engine runs it: `calls` launches back to back in one
    CUDA graph (no host launch cost between them), each after an L2 flush, minus a graph of
    the flushes alone; the median of `reps` replays. `flush=False`: no flushes (weights that
    fit in L2 stay there between calls). fn must already have compiled."""
    buf = None
    if flush:
        buf = _FLUSH.get(device.index)
        if buf is None:
            buf = _FLUSH[device.index] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32,
                                                     device=device)

    def captured(with_fn: bool) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            with torch.cuda.graph(g):
                for _ in range(calls):
                    if buf is not None:
                        buf.zero_()
                    if with_fn:
                        fn()
        torch.cuda.current_stream(device).wait_stream(side)
        return g

    def median_ms(g: torch.cuda.CUDAGraph) -> float:
        g.replay()
        out = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return sorted(out)[len(out) // 2]

    ms = median_ms(captured(True))
    if buf is not None:
        ms = max(ms - median_ms(captured(False)), 0.0)
    return 1000.0 * ms / calls


FINALISTS = 3  # fastest(): candidates timed a second time, in reverse order


def fastest(configs, launch, y: torch.Tensor):
    """The configuration whose launch(cfg, y) runs fastest inside a CUDA graph (graph_us: how
    the engine's decode steps run it; a host-timed loop would charge the split
    configurations' second launch to them); None if none compiles or fits (each such
    configuration is skipped). Picked by `pick`."""
    def time_us(cfg) -> float:
        launch(cfg, y)  # compiles on the first call; an error skips the configuration
        torch.cuda.synchronize(y.device)
        return graph_us(lambda: launch(cfg, y), y.device)
    return pick(configs, time_us)


def pick(configs, time_us):
    """The configuration with the lowest time_us(cfg): every one timed once (one that raises
    is skipped), then the FINALISTS fastest timed again in reverse order, each keeping the
    lower of its two times; ties go to the earlier candidate. One timing a candidate picked
    configurations that ran 4% slower end to end on one machine than on another
    (bench/archive/NOTES-2026.md). None if none ran."""
    timed = []
    for i, cfg in enumerate(configs):
        try:
            timed.append((time_us(cfg), i, cfg))
        except Exception:  # a config that does not compile or fit is skipped
            continue
    if len(timed) > 1:
        finals = sorted(timed, key=lambda t: t[:2])[:FINALISTS]
        again = []
        for us, i, cfg in reversed(finals):
            try:
                us = min(us, time_us(cfg))
            except Exception:
                pass
            again.append((us, i, cfg))
        timed = again
    return min(timed, key=lambda t: t[:2])[2] if timed else None


def by_row_blocks(x: torch.Tensor, t: W12Tensor, view: str, run) -> torch.Tensor:
    """Check x [..., K] against the weight, then run(xs, out) on blocks of <= MAX_M rows of
    x (as [m, K], unit stride) and the matching rows of y [m, N]; returns y as [..., N]."""
    if view not in ("w12", "w8"):
        raise ValueError(f"view must be 'w12' or 'w8', not {view!r}")
    n, k = t.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features; the W12 weight expects {k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    for m0 in range(0, x2.shape[0], MAX_M):
        run(x2[m0:m0 + MAX_M], y[m0:m0 + MAX_M])
    return y.reshape(*lead, n)


def w12_matmul(x: torch.Tensor, t: W12Tensor, view: str = "w12",
               config: Config | None = None) -> torch.Tensor:
    """y = x @ W^T for x [..., K] (bf16 on CUDA; fp32/fp16 under the interpreter)."""
    def run(xs: torch.Tensor, out: torch.Tensor) -> None:
        cfg = config
        if cfg is None:
            key = _key(xs.shape[0], t, view, x.dtype)
            capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
            cfg = _TUNED.get(key) or _TUNED.get(_key(1, t, view, x.dtype))
            if cfg is None:
                cfg = DEFAULT if capturing else tune(xs, t, view)
        _launch(xs, t, out, view == "w12", cfg)
    return by_row_blocks(x, t, view, run)
