"""The split-K W12 GEMV (kernels/w12/gemv.py) under Triton's interpreter against the
plain-PyTorch references: fp32/fp16 activations like tests/test_w12_gemm.py, plus bf16
activations on the 32-bit pair path (integer ops only inside the kernel, fp32 dots under
the interpreter), split-K plans, and exceptions on tile, split and K edges."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.w12.gemv builds its kernels

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.w12 import encode  # noqa: E402
from kernels.w12.reference import w12_matmul_ref  # noqa: E402
from w12_weights import adversarial, bf16_from_bits, check, gaussian, student_t  # noqa: E402

gemv = pytest.importorskip("kernels.w12.gemv")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

C = gemv.GemvConfig


def rand_x(m, k, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


FMA_NOSPLIT, FMA_SPLIT3 = C(16, 64, split=1), C(16, 32, split=3)
DOT_SPLIT2 = C(16, 64, split=2, dot=True)
SWAP_SPLIT2 = C(16, 64, split=2, dot=True, swap=True)   # W tile as the dot's first operand
SHARED_SPLIT2 = C(16, 64, split=2, dot=True, swap=True, shared_k=True)  # one dot, _swap_k order


@pytest.mark.parametrize("view", ["w12", "w8"])
@pytest.mark.parametrize("m,cfg", [(1, FMA_NOSPLIT), (1, FMA_SPLIT3), (3, FMA_SPLIT3),
                                   (5, DOT_SPLIT2), (16, C(32, 64, split="auto", dot=True)),
                                   (3, SWAP_SPLIT2), (16, C(32, 64, split=1, dot=True, swap=True)),
                                   (3, SHARED_SPLIT2),
                                   (40, C(32, 128, split=1, dot=True, swap=True, shared_k=True))],
                         ids=["m1-nosplit", "m1-split3", "m3-split3", "m5-dot-split2",
                              "m16-dot-auto", "m3-swap-split2", "m16-swap-nosplit",
                              "m3-shared-split2", "m40-shared-nosplit"])
def test_gaussian_fp32(view, m, cfg):
    t = encode(gaussian(48, 160, seed=2))
    x = rand_x(m, 160, m)
    check(gemv.w12_gemv(x, t, view, cfg), w12_matmul_ref(x, t, view))


@pytest.mark.parametrize("k", [128, 160])
def test_even_and_ragged_k_chunks(k):
    """K = 128: every chunk full (no K mask); K = 160: a ragged last chunk (masked)."""
    t = encode(gaussian(40, k, seed=7))
    x = rand_x(2, k, 7)
    for cfg in (C(8, 64, split=1), C(8, 64, split=2), C(16, 64, split=2, dot=True),
                C(16, 64, split=2, dot=True, swap=True), SHARED_SPLIT2):
        check(gemv.w12_gemv(x, t, "w12", cfg), w12_matmul_ref(x, t))


@pytest.mark.parametrize("m,dot", [(1, False), (5, True)])
def test_many_splits_reduce_in_several_steps(m, dot):
    """9 splits: more than one step of the reduce's loads in flight (8 at M <= 4, 4 above)."""
    t = encode(student_t(24, 800, seed=8))
    cfg = C(16 if dot else 8, 32, split=12, dot=dot)
    split, _ = gemv.plan(cfg, m, 24, 800, torch.device("cpu"))
    assert split == 9
    x = rand_x(m, 800, 8)
    check(gemv.w12_gemv(x, t, "w12", cfg), w12_matmul_ref(x, t))


@pytest.mark.parametrize("view", ["w12", "w8"])
@pytest.mark.parametrize("cfg", [FMA_SPLIT3, DOT_SPLIT2, SWAP_SPLIT2, SHARED_SPLIT2],
                         ids=["fma", "dot", "swap", "shared"])
def test_adversarial_fp32_exceptions_exact(view, cfg):
    """Zeros, subnormals, +-inf, NaN payloads, max normals: many exception chunks per tile."""
    t = encode(adversarial(40, 70, seed=1))
    assert int(t.row_ptr()[16]) > 4 * gemv.BLOCK_E  # several exception chunks in one tile
    x = rand_x(3, 70, 1)
    check(gemv.w12_gemv(x, t, view, cfg), w12_matmul_ref(x, t, view))


def test_adversarial_above_16_rows_exceptions_after_the_loop():
    """BLOCK_M 32: the exceptions are not prefetched; all chunks are loaded after the loop."""
    t = encode(adversarial(40, 70, seed=2))
    x = rand_x(20, 70, 2)
    check(gemv.w12_gemv(x, t, "w12", C(16, 32, split=2, dot=True)), w12_matmul_ref(x, t))


def test_exceptions_on_tile_split_and_k_edges():
    """Exceptions in the first and last column, on split boundaries, in the last (partial)
    N tile, an inf weight against x = 0 (NaN, as in a dense matmul) and a NaN weight."""
    n, k = gemv.REDUCE_BLOCK_N + 6, 96
    w = gaussian(n, k, seed=9)
    bits = w.view(torch.int16)
    cfg = C(16, 32, split=3)           # splits of 16 pairs: columns 32 and 64 start splits
    for row, col, b in [(0, 0, 0x0000), (1, k - 1, 0x8000), (2, 31, 0x0001), (2, 32, 0x7F7F),
                        (3, 63, 0x8001), (3, 64, 0xFF7F), (n - 1, 0, 0x0000),
                        (n - 2, k - 1, 0x7F80), (n - 3, 32, 0xFF80), (n - 4, 64, 0x7FC1),
                        (gemv.REDUCE_BLOCK_N, 5, 0x0000)]:
        bits[row, col] = int(bf16_from_bits(b).view(torch.int16))
    t = encode(w)
    assert t.num_exceptions >= 11
    x = rand_x(4, k, 9)
    x[1, k - 1] = 0.0                  # inf weight (row n-2, col k-1) times 0: NaN
    y = gemv.w12_gemv(x, t, "w12", cfg)
    r = w12_matmul_ref(x, t)
    assert torch.isnan(r[1, n - 2]) and torch.isinf(r[0, n - 2]) and torch.isnan(r[:, n - 4]).all()
    check(y, r)
    check(gemv.w12_gemv(x, t, "w8", C(16, 32, split=2, dot=True)), w12_matmul_ref(x, t, "w8"))


@pytest.mark.parametrize("m", [1, 17, 67])
def test_fp16_activations_odd_k_and_m_chunks(m):
    """fp16 x, odd K (padded plane column), M above 16 (dot, BLOCK_M 32), above 64 (chunks)."""
    t = encode(student_t(24, 97, seed=4))
    x = rand_x(m, 97, m, torch.float16, scale=4)
    for cfg in (C(16, 32, split=2, dot=m > 4), C(16, 32, split=2, dot=True, swap=True),
                C(16, 32, split=2, dot=True, swap=True, shared_k=True)):
        y = gemv.w12_gemv(x, t, "w12", cfg)
        assert y.dtype == torch.float16 and y.shape == (m, 24)
        check(y, w12_matmul_ref(x, t, "w12"), rtol=2e-3)


@pytest.mark.parametrize("cfg", [FMA_SPLIT3, DOT_SPLIT2, SWAP_SPLIT2, SHARED_SPLIT2],
                         ids=["fma", "dot", "swap", "shared"])
def test_bf16_activations_pair_path(cfg):
    """bf16 x with even K: read as int32 pairs and split by shifts; exceptions read x's bits.
    y is bf16: each entry within one bf16 ulp (2**-7 relative) of the fp32 reference (the
    interpreter's fp32 -> bf16 store truncates where the GPU rounds to nearest)."""
    w = student_t(36, 64, seed=3)
    w.view(-1)[::29] = 0.0                        # exceptions
    t = encode(w)
    assert t.num_exceptions >= 70
    x = rand_x(3, 64, 3, torch.bfloat16)
    y = gemv.w12_gemv(x, t, "w12", cfg)
    assert y.dtype == torch.bfloat16
    r = x.float() @ w.float().T
    tol = 2.0 ** -7 * r.abs() + 1e-5 * r.abs().max()
    assert ((y.float() - r).abs() <= tol).all(), ((y.float() - r).abs() / tol).max()


def test_agrees_with_first_kernel():
    gemm = pytest.importorskip("kernels.w12.gemm")
    t = encode(student_t(32, 128, seed=6))
    x = rand_x(4, 128, 6)
    a = gemm.w12_matmul(x, t, "w12", gemm.Config(16, 32, split=2))
    b = gemv.w12_gemv(x, t, "w12", C(8, 64, split=2))
    check(b, a)


def test_leading_dims_and_bad_input():
    t = encode(gaussian(16, 32))
    x = torch.randn(2, 3, 32)
    y = gemv.w12_gemv(x, t, "w12", C(16, 32))
    assert y.shape == (2, 3, 16)
    check(y.reshape(6, 16), w12_matmul_ref(x.reshape(6, 32), t))
    with pytest.raises(ValueError, match="features"):
        gemv.w12_gemv(torch.randn(2, 31), t)
    with pytest.raises(ValueError, match="view"):
        gemv.w12_gemv(x, t, "w4")
    with pytest.raises(ValueError, match="block_k"):
        gemv.w12_gemv(x, t, "w12", C(16, 48))


@pytest.mark.parametrize("m,n,k", [(1, 15360, 5120), (16, 15360, 5120), (64, 15360, 5120),
                                   (1, 5120, 17408), (4, 151936, 5120), (3, 24, 97)])
def test_split_plan_covers_k(m, n, k):
    """Every split starts on a chunk boundary, the splits cover K exactly once, the grid is
    a few waves where K allows it, and the fp32 partials stay a small share of the bytes."""
    cpu = torch.device("cpu")
    for b in gemv.BUCKETS:
        for cfg in gemv.CONFIGS[b]:
            split, per = gemv.plan(cfg, m, n, k, cpu)
            half, kh = cfg.block_k // 2, (k + 1) // 2
            assert per % half == 0 and split >= 1
            assert (split - 1) * per < kh <= split * per
            if cfg.split == "auto":
                tiles = -(-n // cfg.block_n)
                if split > 1:
                    assert split * 4 * m * n <= gemv.PARTIAL_FRACTION * 1.5 * n * k * 1.01
                    assert tiles < gemv.WAVES * 132


def test_buckets_configs_and_tuning_fallbacks():
    assert [gemv.bucket(m) for m in (1, 2, 4, 5, 16, 17, 64)] == [1, 4, 4, 16, 16, 64, 64]
    with pytest.raises(ValueError):
        gemv.bucket(65)
    assert all(1 <= len(c) <= 6 for c in gemv.CONFIGS.values())
    assert all(c.split == "auto" or c.split >= 1 for cs in gemv.CONFIGS.values() for c in cs)
    t = encode(gaussian(16, 64))
    x = rand_x(3, 64, 0)
    assert gemv.tune(x, t) == gemv.CONFIGS[4][0]         # no CUDA: the bucket's first
    key = gemv._key(3, t, "w12", x.dtype)
    try:
        gemv._TUNED[key] = gemv.CONFIGS[4][2]
        assert gemv.chosen(4, t, "w8", x.dtype) == gemv.CONFIGS[4][2]  # w8 reuses w12's
        assert gemv.chosen(1, t, "w8", x.dtype) is None
    finally:
        gemv._TUNED.pop(key, None)


def test_linear_kernel_selection():
    from torch import nn

    from kernels.w12.ops import fused_matmul
    from stock.w12_linear import W12Linear, set_kernel

    assert fused_matmul("gemv") is gemv.w12_gemv
    with pytest.raises(ValueError, match="kernel"):
        fused_matmul("cublas")
    net = nn.Sequential(W12Linear.from_linear(nn.Linear(32, 16).to(torch.bfloat16)),
                        W12Linear.from_linear(nn.Linear(16, 8).to(torch.bfloat16)))
    assert all(m.kernel == "gemv+mma" for m in net)  # the default (the faster on the H200)
    assert set_kernel(net, "gemm") == 2 and all(m.kernel == "gemm" for m in net)
    assert set_kernel(net, "auto") == 2 and fused_matmul("auto") is not gemv.w12_gemv
    with pytest.raises(ValueError):
        set_kernel(net, "nope")
    assert "kernel=auto" in repr(net[0])
