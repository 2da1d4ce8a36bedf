"""The W12 kernels as one custom op (stock/w12_linear.py, `specpilot_w12::matmul`), the
form W12Linear takes under torch.compile: same result as the direct call (Triton's
interpreter on this CPU), a fake implementation with the right shape, and a compiled
caller that keeps the op whole (fullgraph: a graph break would raise)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.w12 builds its kernels

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.w12 import encode  # noqa: E402
from kernels.w12.ops import fused_matmul, w12_matmul_op  # noqa: E402
from kernels.w12.reference import w12_matmul_ref  # noqa: E402
from w12_weights import check, student_t  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("runs the kernels under the interpreter", allow_module_level=True)


def planes(t):
    return (t.hi, t.lo, t.base, t.exc_idx, t.exc_val, t.row_ptr())


def test_op_equals_direct_call_and_fake_shape():
    t = encode(student_t(24, 97, seed=5))           # odd K: the plane is padded to 98
    x = torch.randn(3, 97, generator=torch.Generator().manual_seed(5))
    y = w12_matmul_op(x, *planes(t), 97, "w12", "gemv")
    assert torch.equal(y, fused_matmul("gemv")(x, t, "w12"))
    check(y, w12_matmul_ref(x, t))
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    fx = mode.from_tensor(x.reshape(1, 3, 97))
    fp = [mode.from_tensor(p) for p in planes(t)]
    with mode:
        fy = torch.ops.specpilot_w12.matmul(fx, *fp, 97, "w12", "gemv")
    assert fy.shape == (1, 3, 24)


def test_compiled_caller_keeps_the_op_whole():
    t = encode(student_t(16, 64, seed=6))
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
    p = planes(t)

    def f(x):
        return torch.relu(torch.ops.specpilot_w12.matmul(x * 2.0, *p, 64, "w8", "gemv")) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), f(x))
    check(f(x), torch.relu(w12_matmul_ref(x * 2.0, t, "w8")) + 1.0)


def test_gemv_then_mma_dispatches_by_rows():
    """"gemv+mma": the GEMV for one row, the mma kernel for more; fp32 x (the interpreter's
    dtype) is a call the mma kernel does not cover, so it runs the GEMV there too."""
    from kernels.w12 import mma, ops

    t = encode(student_t(16, 64, seed=7))
    calls = []
    real = ops.fused_matmul

    def spy(kernel):
        calls.append(kernel)
        return real(kernel)

    x1 = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    x4 = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    assert mma.unsupported(x4, t)     # fp32
    try:
        ops.fused_matmul = spy
        y1, y4 = ops.gemv_then_mma(x1, t), ops.gemv_then_mma(x4, t)
    finally:
        ops.fused_matmul = real
    assert calls == ["gemv", "mma"]
    check(y1, w12_matmul_ref(x1, t))
    check(y4, w12_matmul_ref(x4, t))
    with pytest.raises(ValueError, match="one of"):
        fused_matmul("mma+gemv")


def test_gemv_then_mma_runs_the_gemv_where_mma_cannot_run_and_says_so_once():
    """The default kernel where the mma kernel cannot run (here: no CUDA device; on a GPU:
    below sm_80 or no nvcc): one warning naming why, then the GEMV for every row count,
    with the GEMV's results; "mma" asked for by name raises instead."""
    import warnings

    from kernels.w12 import mma, ops

    t = encode(student_t(16, 64, seed=7))
    x4 = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert mma.unsupported(x4, t) is None        # a call the kernel covers, on the CPU
    ops._NO_MMA.pop("cpu", None)
    try:
        with pytest.warns(RuntimeWarning, match="runs on CUDA devices, not cpu"):
            y = ops.gemv_then_mma(x4, t)
        with warnings.catch_warnings():
            warnings.simplefilter("error")       # said once
            again = ops.gemv_then_mma(x4, t)
    finally:
        ops._NO_MMA.pop("cpu", None)
    assert torch.equal(y, again) and torch.equal(y, fused_matmul("gemv")(x4, t, "w12"))
    check(y, w12_matmul_ref(x4.float(), t), rtol=1e-2)   # bf16 output
    with pytest.raises(mma.MmaUnavailable, match="CUDA"):
        fused_matmul("mma")(x4, t, "w12")
