"""Plain-PyTorch references for the W12 GEMM and its nested 8-bit view (any device).

Both compute y[M, N] = x[M, K] @ W^T in fp32 and return x's dtype, where W is

- ``w12``: the exact weight, ``decode(t)`` (bit-identical to the encoded bf16 matrix);
- ``w8``:  the nested 8-bit view, ``decode_w8(t)``: every in-window weight with its low 4
  mantissa bits zeroed (bits & 0xFFF0), every exception exact.

The fused kernel multiplies by the planes, in which an exception's slot decodes to
w0 = 2**(b-127) (code 0), then adds x[:, k] * w_exc - x[:, k] * w0 for each exception:
the same weights, summed in a different order, so it matches these references to fp32
rounding (not bitwise). `planes_matmul` is that two-step computation in PyTorch.
"""

from __future__ import annotations

import torch

from kernels.w12.format import W12Tensor, _finish, codes, decode, decode_w8


def w12_matmul_ref(x: torch.Tensor, t: W12Tensor, view: str = "w12") -> torch.Tensor:
    if view not in ("w12", "w8"):
        raise ValueError(f"view must be 'w12' or 'w8', not {view!r}")
    w = decode(t) if view == "w12" else decode_w8(t)
    return (x.float() @ w.float().T).to(x.dtype)


def planes_matmul(x: torch.Tensor, t: W12Tensor, view: str = "w12") -> torch.Tensor:
    """The kernel's algorithm in PyTorch: dense planes (exception slots = w0) + corrections."""
    n, k = t.shape
    c = codes(t) if view == "w12" else (t.hi.to(torch.int32) << 4)
    planes = _finish(W12Tensor(t.hi, t.lo, t.base, t.exc_idx[:0], t.exc_val[:0], t.shape), c)
    xf = x.float()
    y = xf @ planes.float().T
    if t.num_exceptions:
        rows, cols = t.exc_rows_cols()
        w_exc = t.exc_val.view(torch.bfloat16).float()
        w0 = (t.base.to(torch.int32)[rows] << 7).to(torch.int16).view(torch.bfloat16).float()
        corr = xf[:, cols] * w_exc - xf[:, cols] * w0  # [M, E]
        y.index_add_(1, rows, corr)
    return y.to(x.dtype)
