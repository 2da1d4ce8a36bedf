"""The W12 CUDA kernels behind one entry point, and as one custom op for torch.compile.

`fused_matmul(kernel)` returns the CUDA matmul of a W12 kernel: "gemm" (kernels/w12/gemm.py),
"gemv" (split-K, kernels/w12/gemv.py), "mma" (tensor cores in CUDA C++ for M <= 64,
kernels/w12/mma.py; built with nvcc at first use; shapes it does not cover run "gemv"),
"gemv+mma" (the GEMV for one row, where it beats cuBLAS, "mma" for more; DEFAULT) or
"auto" (per weight shape and row bucket, "gemm" and "gemv" are tuned and timed once,
outside any CUDA graph capture, and the faster is kept; a shape first met inside a capture
runs "gemm"). stock/w12_linear.py's W12Linear calls these.

"gemv+mma" is W12Linear's default: on the H200 the 27B-class step runs as fast as on the
GEMV at one row (15.68 against 15.66 ms), faster at 16 verify rows (18.31 against 22.04 ms,
1.13x the bf16 step) and as fast at 32 and 64 (docs/results.md, 2026-12-05). Where the mma
kernel cannot run (no CUDA device, a GPU below sm_80, no nvcc to build it) "gemv+mma" says
so once in a warning and runs the GEMV for every row count; "mma" asked for by name raises.
"""

from __future__ import annotations

import warnings

import torch

from kernels.w12.format import W12Tensor

KERNELS = ("gemm", "gemv", "mma", "gemv+mma", "auto")
DEFAULT = "gemv+mma"             # W12Linear's kernel (module docstring)
_NO_MMA: dict[str, str] = {}     # device -> why "gemv+mma" runs the GEMV there
_CHOICE: dict[tuple, str] = {}   # (row bucket, N, K, view, dtype, device) -> kernel


def fused_matmul(kernel: str):
    """The CUDA entry point of a W12 kernel: one of KERNELS (same signature)."""
    if kernel == "auto":
        return auto_matmul
    if kernel == "gemm":
        from kernels.w12.gemm import w12_matmul  # lazy: Triton, CUDA only

        return w12_matmul
    if kernel == "gemv":
        from kernels.w12.gemv import w12_gemv  # lazy: Triton, CUDA only

        return w12_gemv
    if kernel == "mma":
        from kernels.w12.mma import w12_mma  # lazy: nvcc at first call, CUDA only

        return w12_mma
    if kernel == "gemv+mma":
        return gemv_then_mma
    raise ValueError(f"W12 kernel must be one of {KERNELS}, not {kernel!r}")


# The fused kernels as one custom op, so that torch.compile (stock's `compile` option) treats
# a W12 layer as an opaque call with a known output shape instead of tracing into the tuner's
# Python and the Triton launches (graph breaks). Eager calls skip the op's dispatch cost and
# call fused_matmul directly; both run the same kernels on the same planes.
@torch.library.custom_op("specpilot_w12::matmul", mutates_args=())
def w12_matmul_op(x: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, base: torch.Tensor,
                  exc_idx: torch.Tensor, exc_val: torch.Tensor, row_ptr: torch.Tensor,
                  in_features: int, view: str, kernel: str) -> torch.Tensor:
    t = W12Tensor(hi, lo, base, exc_idx, exc_val, shape=(base.shape[0], in_features))
    t._row_ptr = row_ptr
    return fused_matmul(kernel)(x, t, view)


@w12_matmul_op.register_fake
def _(x, hi, lo, base, exc_idx, exc_val, row_ptr, in_features, view, kernel):
    return x.new_empty((*x.shape[:-1], base.shape[0]))


def gemv_then_mma(x: torch.Tensor, t: W12Tensor, view: str = "w12") -> torch.Tensor:
    """One row (a decode step): the GEMV; more (verify and tree steps): the mma kernel,
    or the GEMV where the mma kernel cannot run on x's device (warned once per device)."""
    rows = x.numel() // max(1, x.shape[-1])
    if rows > 1 and str(x.device) not in _NO_MMA:
        from kernels.w12.mma import MmaUnavailable  # lazy: ctypes, nvcc at first call

        try:
            return fused_matmul("mma")(x, t, view)
        except MmaUnavailable as e:
            _NO_MMA[str(x.device)] = str(e)
            warnings.warn(f"W12 kernel 'gemv+mma' on {x.device}: {e}; every row count runs "
                          f"the GEMV there", RuntimeWarning, stacklevel=2)
    return fused_matmul("gemv")(x, t, view)


def auto_matmul(x: torch.Tensor, t: W12Tensor, view: str = "w12") -> torch.Tensor:
    """The faster of the two kernels for this shape and row count (chosen once, timed)."""
    from kernels.w12.gemm import MAX_M  # lazy: Triton, CUDA only
    from kernels.w12.gemv import bucket

    m = x.numel() // max(1, x.shape[-1])
    key = (bucket(min(m, MAX_M)), t.shape[0], t.shape[1], view, x.dtype, x.device)
    kernel = _CHOICE.get(key)
    if kernel is None:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            kernel = "gemm"
        else:
            kernel = _CHOICE[key] = choose(x, t, view)
    return fused_matmul(kernel)(x, t, view)


def choose(x: torch.Tensor, t: W12Tensor, view: str) -> str:
    """Tune both kernels on x (their own caches), then time each once more; the faster."""
    if not x.is_cuda:
        return "gemm"
    from triton.testing import do_bench

    times = {}
    for name in ("gemm", "gemv"):
        fn = fused_matmul(name)
        fn(x, t, view)   # tunes its configuration for this shape
        times[name] = do_bench(lambda: fn(x, t, view), warmup=5, rep=20)
    return min(times, key=times.get)


def chosen_kernels() -> dict[tuple, str]:
    """What "auto" picked so far, for reports: {(rows, N, K, view): kernel}."""
    return {k[:4]: v for k, v in _CHOICE.items()}
