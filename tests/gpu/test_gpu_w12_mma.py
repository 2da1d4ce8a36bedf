"""The CUDA W12 mma kernel on the GPU: every configuration the tuner may pick against the
reference (bf16 output: within bf16 rounding of the fp32 product), both views, exceptions,
run-to-run and graph-replay bit equality, and the GEMV fallback for shapes it does not
cover. Built with nvcc at the first call (skipped where nvcc is missing)."""

from __future__ import annotations

import pytest
import torch

from kernels.w12 import W12Tensor, encode
from kernels.w12 import mma
from kernels.w12.format import decode, decode_w8

pytestmark = pytest.mark.skipif(mma.nvcc() is None, reason="no nvcc")


def _weights(n: int, k: int, seed: int) -> W12Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w.view(-1)[::501] = 0              # exceptions in many rows
    w.view(-1)[7::4099] = 1e4          # and far outside any row's exponent window
    return encode(w)


def _check(y: torch.Tensor, t: W12Tensor, x: torch.Tensor, view: str) -> None:
    """Each output within bf16 rounding of the fp32 product (half an ulp is at most 2^-8 of
    its value; allowed 2^-7) plus fp32 summation-order noise (1e-4 of the sum of |x_k w_k|).
    The CPU emulator's outputs for these weights use up to 0.97 of the rounding term alone."""
    w = (decode(t) if view == "w12" else decode_w8(t)).float()
    r = x.float() @ w.T
    mag = x.float().abs() @ w.abs().T
    assert y.dtype == torch.bfloat16 and y.shape == r.shape
    bad = (y.float() - r).abs() > r.abs() / 128 + 1e-4 * mag
    assert not bad.any(), f"{int(bad.sum())} outputs off, first at {bad.nonzero()[0].tolist()}"


@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 33, 64])
@pytest.mark.parametrize("view", ["w12", "w8"])
def test_every_candidate_against_the_reference(m, view):
    t = _weights(1032, 1536, seed=m)   # N = 1032: the last block's n-groups leave N
    x = torch.randn(m, 1536, device="cuda").to(torch.bfloat16)
    for cfg in dict.fromkeys(mma.CONFIGS[mma.tiles(m)] + mma.STAGED_CONFIGS[mma.tiles(m)]):
        y = mma.w12_mma(x, t, view, cfg)
        _check(y, t, x, view)
        assert torch.equal(y, mma.w12_mma(x, t, view, cfg))   # no atomics


def test_explicit_splits_and_int64_indices():
    t = _weights(512, 2048, seed=3)
    t64 = W12Tensor(t.hi, t.lo, t.base, t.exc_idx.long(), t.exc_val, t.shape)
    x = torch.randn(9, 2048, device="cuda").to(torch.bfloat16)
    for split in (1, 2, 5, 16):
        cfg = mma.MmaConfig(2, 4, 4, split=split)
        _check(mma.w12_mma(x, t, "w12", cfg), t, x, "w12")
        assert torch.equal(mma.w12_mma(x, t64, "w12", cfg), mma.w12_mma(x, t, "w12", cfg))


def test_tuned_call_replays_in_a_cuda_graph():
    t = _weights(1024, 1024, seed=4)
    x = torch.randn(16, 1024, device="cuda").to(torch.bfloat16)
    eager = mma.w12_mma(x, t, "w12")        # tunes outside the capture
    y = torch.empty_like(eager)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        y.copy_(mma.w12_mma(x, t, "w12"))
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)


def test_leading_dims_many_rows_and_the_gemv_fallback():
    t = _weights(256, 512, seed=5)
    x = torch.randn(2, 70, 512, device="cuda").to(torch.bfloat16)   # 140 rows: 3 blocks
    y = mma.w12_mma(x, t, "w12")
    assert y.shape == (2, 70, 256)
    _check(y.reshape(140, 256), t, x.reshape(140, 512), "w12")
    t96 = _weights(64, 96, seed=6)                                   # K % 64 != 0: GEMV
    x96 = torch.randn(3, 96, device="cuda").to(torch.bfloat16)
    assert mma.unsupported(x96, t96)
    _check(mma.w12_mma(x96, t96, "w12"), t96, x96, "w12")


def test_the_emulator_agrees_with_the_gpu():
    """The CPU emulator (the CPU tests' oracle of the lane maps) and the hardware give the
    same products up to bf16 rounding and fp32 summation order."""
    t = _weights(64, 512, seed=7)
    x = torch.randn(20, 512, device="cuda").to(torch.bfloat16)
    for cfg in (mma.MmaConfig(2, 4, 4, split=2), mma.MmaConfig(2, 2, 4, 2, share_x=True)):
        gpu = mma.w12_mma(x, t, "w12", cfg)
        emu = mma.emulate(x.cpu(), t.to("cpu"), "w12", cfg, split=2)
        _check(gpu, t, x, "w12")
        _check(emu.cuda(), t, x, "w12")
        w = decode(t).float()
        r, mag = x.float() @ w.T, x.float().abs() @ w.abs().T
        assert ((gpu.float() - emu.cuda().float()).abs() <= r.abs() / 64 + 2e-4 * mag).all()


def test_w12linear_runs_mma_eagerly_and_under_torch_compile():
    """The engine's way in: W12Linear with kernel "mma" (and "gemv+mma"), eager and through
    the custom op torch.compile keeps whole (stock's compiled regions)."""
    from torch import nn

    from stock.w12_linear import W12Linear

    lin = nn.Linear(1024, 768, bias=False, device="cuda", dtype=torch.bfloat16)
    mod = W12Linear.from_linear(lin)
    x = torch.randn(12, 1024, device="cuda").to(torch.bfloat16)
    t = mod.w12
    for kernel in ("mma", "gemv+mma"):
        mod.kernel = kernel
        _check(mod(x), t, x, "w12")
        _check(mod(x[:1]), t, x[:1], "w12")
        compiled = torch.compile(lambda a: mod(a), fullgraph=True)
        _check(compiled(x), t, x, "w12")


CLUSTERS = pytest.mark.skipif(not torch.cuda.is_available()
                              or torch.cuda.get_device_capability()[0] < 9,
                              reason="thread block clusters need sm_90")


@CLUSTERS
@pytest.mark.parametrize("view", ["w12", "w8"])
def test_fused_splits_give_the_reduce_kernels_bits_in_one_kernel(view, monkeypatch):
    """K splits summed inside the tiles kernel (one cluster an output tile) against the
    same splits summed by w12_mma_reduce: the same bits, for every kernel kind, 2-8 splits,
    M across the m-tiles; eagerly and replayed twice from one CUDA graph (nothing is left
    behind between calls); and no second kernel launched."""
    from torch.profiler import ProfilerActivity, profile

    C = mma.MmaConfig
    t = _weights(1032, 2048, seed=8)
    for m in (1, 5, 16, 33, 64):
        x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
        cands = [C(2, 2, 4, split=2), C(4, 2, 2, split=5), C(1, 4, 8, split=8),
                 C(2, 2, 4, share_x=True, split=3), C(2, 4, 8, share_x=True, split=8),
                 C(1, 8, 8, staged=True, split=2), C(4, 4, 4, staged=True, split=6)]
        for cfg in cands:
            monkeypatch.setattr(mma, "FUSE_SPLITS", False)
            unfused = mma.w12_mma(x, t, view, cfg)
            monkeypatch.setattr(mma, "FUSE_SPLITS", True)
            fused = mma.w12_mma(x, t, view, cfg)
            assert torch.equal(fused, unfused), (cfg, m)
            _check(fused, t, x, view)
    x = torch.randn(16, 2048, device="cuda").to(torch.bfloat16)
    cfg = C(2, 2, 4, share_x=True, split=4)
    eager = mma.w12_mma(x, t, view, cfg)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mma.w12_mma(x, t, view, cfg)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if "w12_mma" in e.key]
    assert names and not any("reduce" in n for n in names), names
    y = torch.empty_like(eager)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        y.copy_(mma.w12_mma(x, t, view, cfg))
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, eager)


@CLUSTERS
def test_the_tuner_may_pick_the_second_kernels_sum_and_it_gives_the_fused_bits(monkeypatch):
    """On a GPU that fuses, the tuner times each splitting candidate's unfused twin too
    (mma.tune_candidates); an unfused config (fuse=False) launches the reduce kernel and
    gives the fused twin's bits; whatever the tuner picks is one of the candidates and
    passes the reference check."""
    from torch.profiler import ProfilerActivity, profile

    t = _weights(1032, 4096, seed=9)
    x = torch.randn(4, 4096, device="cuda").to(torch.bfloat16)
    cfg = mma.MmaConfig(2, 2, 4, split=4)
    fused = mma.w12_mma(x, t, "w12", cfg)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        unfused = mma.w12_mma(x, t, "w12", mma.MmaConfig(2, 2, 4, split=4, fuse=False))
        torch.cuda.synchronize()
    assert any("reduce" in e.key for e in prof.key_averages()), "no second kernel"
    assert torch.equal(fused, unfused)
    seen, real = [], mma.tune_candidates
    monkeypatch.setattr(mma, "tune_candidates",
                        lambda cs, f: seen.append(real(cs, f)) or seen[-1])
    mma._TUNED.clear()
    pick = mma.tune(x, t, "w12")
    assert seen and pick in seen[0] and any(not c.fuse for c in seen[0])
    _check(mma.w12_mma(x, t, "w12"), t, x, "w12")
