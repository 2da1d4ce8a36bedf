"""Linear layers with a CPU path for the few rows of a verify step.

On the CPU, `F.linear(x, W)` (x [M, K], W [N, K]) runs the BLAS GEMM with W transposed, and
for 2..16 rows it was 1.07-3.3x slower than the same product written as `W @ x^T` on every
layer shape of the embedded model (this project's 2-core machine, fp32, weights from
memory: `python bench/cpu_linear_rows.py`, bench/archive/NOTES-2026.md). One
row (the autoregressive step) and larger batches keep `F.linear`. Both are fp32 GEMMs with
fp32 accumulation; they differ only in summation order, as any two BLAS kernels do.

`Linear` is `nn.Linear` with that dispatch (same parameters and state-dict names, so
weights load and `isinstance(m, nn.Linear)` holds); `linear` is the function for code that
multiplies by a fused weight itself (the block drafter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# rows of x for which the CPU takes W @ x^T (see above; at one row the two are even)
SMALL_ROWS = (2, 16)


def small_rows(x: torch.Tensor) -> bool:
    if x.device.type != "cpu" or x.dim() == 0:
        return False
    rows = x.numel() // max(x.shape[-1], 1)
    return SMALL_ROWS[0] <= rows <= SMALL_ROWS[1]


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias), as F.linear, with the CPU's small-row path."""
    if not small_rows(x) or x.requires_grad or (w.requires_grad and torch.is_grad_enabled()):
        return F.linear(x, w, bias)
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.mm(w, x2.t()).t().contiguous()
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], w.shape[0])


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
