"""The CUDA W12 mma kernel (kernels/w12/csrc) on a machine with no GPU: its emulator runs
the kernel's grid, warps and lanes through the kernel's own header and each mma.sync from
the PTX ISA's fragment tables, against the plain-PyTorch references; and nvcc compiles the
kernel for sm_90 with no spills on the M <= 32 path (skipped where nvcc is missing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kernels.w12 import W12Tensor, decode, decode_w8, encode
from kernels.w12 import mma
from kernels.w12.mma import MmaConfig, emulate
from w12_weights import adversarial, check, gaussian, student_t

if shutil.which("c++") is None and shutil.which("g++") is None:
    pytest.skip("no host C++ compiler for the emulator", allow_module_level=True)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kc"))


def _x(m: int, k: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * scale).to(torch.bfloat16)


def _ref(x: torch.Tensor, t: W12Tensor, view: str) -> torch.Tensor:
    w = decode(t) if view == "w12" else decode_w8(t)
    return x.float() @ w.float().T


# every compiled (ng, depth), 1-8 warps a block, 1-3 K splits, x shared or not; N = 48
# leaves the last block's n-groups outside N for ng = 4 (rows 48..63) and, x shared, whole
# warps (ng 4 x 5 warps: 160 columns a block), M crosses the m-tiles
CASES = [(MmaConfig(2, 4), 1), (MmaConfig(1, 4, 3), 2), (MmaConfig(2, 2, 1), 3),
         (MmaConfig(4, 2, 4), 1), (MmaConfig(1, 4, 8), 2),
         (MmaConfig(2, 4, 4, share_x=True), 1), (MmaConfig(4, 2, 5, share_x=True), 2),
         (MmaConfig(1, 4, 8, share_x=True), 3), (MmaConfig(2, 4, 4, staged=True), 1),
         (MmaConfig(4, 4, 5, staged=True), 2)]


@pytest.mark.parametrize("m", [1, 7, 16, 17, 40, 64])
@pytest.mark.parametrize("view", ["w12", "w8"])
def test_emulated_kernel_equals_the_reference(m, view):
    t = encode(gaussian(48, 192, seed=2))
    x = _x(m, 192, seed=m)
    ref = _ref(x, t, view)
    for cfg, split in CASES:
        check(emulate(x, t, view, cfg, split=split, out_f32=True), ref)


def test_w8_view_is_not_w12():
    t = encode(gaussian(32, 128, seed=3))
    x = _x(4, 128, seed=1)
    a = emulate(x, t, "w12", out_f32=True)
    b = emulate(x, t, "w8", out_f32=True)
    assert not torch.allclose(a, b, rtol=1e-3, atol=0)
    check(b, _ref(x, t, "w8"))


@pytest.mark.parametrize("idx64", [False, True])
def test_exceptions_of_every_kind(idx64):
    """Zeros, subnormals, +-inf, NaN, max normals: exceptions in many rows, some rows made
    only of them; the int64 index path (N * K >= 2**31 in real layers) on the same data."""
    t = encode(adversarial(40, 128, seed=1))
    assert t.num_exceptions > 100
    if idx64:
        t = W12Tensor(t.hi, t.lo, t.base, t.exc_idx.long(), t.exc_val, t.shape)
    x = _x(3, 128, seed=1)
    for cfg, split in CASES[:3]:
        check(emulate(x, t, "w12", cfg, split=split, out_f32=True), _ref(x, t, "w12"))


def test_empty_splits_and_idle_warps():
    """More K splits than chunks a split can share, and more warps than chunks: splits and
    warps with nothing to do must add nothing (K = 192: 3 chunks)."""
    t = encode(student_t(24, 192, seed=4))
    x = _x(33, 192, seed=5, scale=4.0)
    check(emulate(x, t, "w12", MmaConfig(2, 2, 8), split=4, out_f32=True), _ref(x, t, "w12"))
    check(emulate(x, t, "w12", MmaConfig(2, 2, 8, share_x=True), split=4, out_f32=True),
          _ref(x, t, "w12"))


def test_bf16_output_rounds_as_torch():
    t = encode(adversarial(40, 128, seed=2))
    x = _x(5, 128, seed=3)
    y16 = emulate(x, t, "w12", MmaConfig(2, 2, 2), split=2)
    y32 = emulate(x, t, "w12", MmaConfig(2, 2, 2), split=2, out_f32=True)
    assert y16.dtype == torch.bfloat16
    nan = torch.isnan(y32)
    assert nan.any() and torch.isinf(y32).any()  # the special branches are exercised
    assert torch.equal(torch.isnan(y16), nan)     # (NaN payloads are not compared)
    assert torch.equal(y16.view(torch.int16)[~nan], y32.to(torch.bfloat16).view(torch.int16)[~nan])


def test_a_wrong_lane_map_is_caught():
    """The header built with two A-fragment registers swapped (W12_MMA_FAULT): the
    emulator's products must be wrong, or these tests could not see such a bug."""
    t = encode(gaussian(16, 64, seed=6))
    x = _x(16, 64, seed=6)
    y = emulate(x, t, "w12", MmaConfig(2, 4), out_f32=True, defines=("W12_MMA_FAULT",))
    ref = _ref(x, t, "w12")
    assert ((y - ref).abs().max() / ref.abs().max()).item() > 0.05


def test_a_wrong_staged_x_offset_is_caught():
    """The header built with staged x rows read at the wrong stride (W12_MMA_XS_FAULT): the
    kernel of shared x must give wrong products in the emulator, the other kernel not."""
    t = encode(gaussian(16, 128, seed=6))
    x = _x(20, 128, seed=6)
    ref = _ref(x, t, "w12")
    cfg = MmaConfig(2, 4, 4, share_x=True)
    y = emulate(x, t, "w12", cfg, out_f32=True, defines=("W12_MMA_XS_FAULT",))
    assert not torch.isfinite(y).all() or ((y - ref).abs().max() / ref.abs().max()).item() > 0.05
    check(emulate(x, t, "w12", MmaConfig(2, 4, 2), out_f32=True,
                  defines=("W12_MMA_XS_FAULT",)), ref)


@pytest.mark.parametrize("view", ["w12", "w8"])
def test_the_staged_ring_wraps_and_every_compiled_pair_computes(view):
    """The staged kernels (weights and x through a ring of shared memory): K = 640 is 10
    chunks, so every ring (4 or 8 stages) wraps, with one split and with three (4, 3 and 3
    chunks: rings that never fill); N = 72 leaves whole warps' columns outside N."""
    t = encode(gaussian(72, 640, seed=7))
    for m in (3, 33):
        x = _x(m, 640, seed=m)
        ref = _ref(x, t, view)
        for ng, stages in mma.STAGED:
            for wk, split in ((4, 1), (5, 3)):
                check(emulate(x, t, view, MmaConfig(ng, stages, wk, staged=True), split=split,
                              out_f32=True), ref)


def test_every_staged_candidate_is_valid_and_computes():
    """What the GPU tests and `bench/w12_mma.py --staged` run (mma.STAGED_CONFIGS): each
    candidate passes the configuration check and computes in the emulator at its m-tiles'
    largest M. The tuner's candidates (mma.CONFIGS) hold a staged one only where a GPU
    table had it win: at M = 64 (four m-tiles), and only ones from STAGED_CONFIGS."""
    t = encode(gaussian(24, 320, seed=9))
    for tiles, cands in mma.STAGED_CONFIGS.items():
        x = _x(16 * tiles, 320, seed=tiles)
        for cfg in cands:
            assert cfg.staged and cfg.xs == mma.STAGED_XS
            check(emulate(x, t, "w12", cfg, out_f32=True), _ref(x, t, "w12"))
    for tiles, cands in mma.CONFIGS.items():
        staged = [c for c in cands if c.staged]
        assert set(staged) <= set(mma.STAGED_CONFIGS[tiles]), staged
        assert bool(staged) == (tiles == 4), (tiles, staged)


def test_a_staged_slot_reused_too_early_is_caught():
    """The header built with every stage's lo bytes in one place (W12_MMA_ST_FAULT): the
    chunk S - 1 ahead overwrites the one about to be computed, so the emulator, which
    copies and reads the ring in the kernel's order, must give wrong products; and with
    one x row too few copied (the rows past M are zeroed, not copied), that row's."""
    t = encode(gaussian(16, 640, seed=8))
    x = _x(5, 640, seed=8)
    ref = _ref(x, t, "w12")
    y = emulate(x, t, "w12", MmaConfig(2, 4, 4, staged=True), out_f32=True,
                defines=("W12_MMA_ST_FAULT",))
    assert ((y - ref).abs().max() / ref.abs().max()).item() > 1e-3
    check(emulate(x, t, "w12", MmaConfig(2, 4, 4, share_x=True), out_f32=True,
                  defines=("W12_MMA_ST_FAULT",)), ref)
    # one x row short (W12_MMA_ST_FAULT_ROWS): the last row below M is never copied
    y = emulate(x, t, "w12", MmaConfig(2, 4, 4, staged=True), out_f32=True,
                defines=("W12_MMA_ST_FAULT_ROWS",))
    assert not torch.isfinite(y[4]).all() or not torch.allclose(y[4], ref[4], rtol=1e-2)
    check(y[:4], ref[:4])


def test_what_the_kernel_refuses():
    t = encode(gaussian(16, 96, seed=0))
    assert "multiple of 64" in mma.unsupported(_x(2, 96), t)
    with pytest.raises(ValueError, match="does not cover"):
        emulate(_x(2, 96), t)
    t = encode(gaussian(12, 64, seed=0))
    assert "multiple of 8" in mma.unsupported(_x(2, 64), t)
    assert "bf16" in mma.unsupported(torch.randn(2, 64), t)
    t = encode(gaussian(16, 64, seed=0))
    with pytest.raises(ValueError, match="not compiled"):
        emulate(_x(2, 64), t, config=MmaConfig(3, 3))
    with pytest.raises(ValueError, match="outside 1..64"):
        emulate(_x(65, 64), t)
    with pytest.raises(ValueError, match="wk must be 4..8"):   # x shared: warps split N
        emulate(_x(2, 64), t, config=MmaConfig(2, 4, 2, share_x=True))
    # registers capped for a number of blocks an SM: only the shared-x kernels compiled so
    # (mma.CAPPED), four warps a block (their launch bounds are for 128 threads)
    for bad in (MmaConfig(2, 4, 4, blocks=4), MmaConfig(2, 4, 8, share_x=True, blocks=4),
                MmaConfig(2, 4, 4, share_x=True, blocks=3), MmaConfig(2, 2, 4, share_x=True,
                                                                      blocks=4)):
        with pytest.raises(ValueError, match="blocks = "):
            emulate(_x(2, 64), t, config=bad)
    with pytest.raises(ValueError, match="staged .* not compiled"):
        emulate(_x(2, 64), t, config=MmaConfig(2, 2, 4, staged=True))
    with pytest.raises(ValueError, match="wk must be 4..8"):
        emulate(_x(2, 64), t, config=MmaConfig(2, 4, 2, staged=True))
    with pytest.raises(ValueError, match="not capped"):
        emulate(_x(2, 64), t, config=MmaConfig(2, 4, 4, staged=True, blocks=4))


def test_the_capped_kernels_are_tuner_candidates_that_compute_what_the_others_do():
    """The capped shared-x configurations (only registers differ on the GPU) are timed by
    the tuner at M > 32, launch as kernel choice 3 or 4, and pass the configuration check
    into the emulator. The emulator has no registers to cap, so the twins' products are
    the same by construction here: what the cap does to a result is for the GPU test
    (tests/gpu/test_gpu_w12_mma.py, every candidate against the reference)."""
    capped = [c for c in mma.CONFIGS[4] if c.blocks]
    assert {(c.ng, c.depth, c.blocks) for c in capped} == set(mma.CAPPED)
    assert all(c in mma.CONFIGS[3] for c in capped) and not any(
        c.blocks for c in mma.CONFIGS[1] + mma.CONFIGS[2])
    assert [c.xs for c in (MmaConfig(2, 4), MmaConfig(2, 4, 4, share_x=True), *capped)] == \
        [0, 1, 4, 3]
    t = encode(gaussian(64, 128, seed=3))
    x = _x(64, 128, seed=3)
    for c in capped:   # accepted by the configuration check; products right
        check(emulate(x, t, "w12", c, out_f32=True), _ref(x, t, "w12"))


def test_auto_split_fills_the_gpu_and_weighs_partials():
    cfg = MmaConfig(2, 4, 4)
    resident = 132 * 4
    # a narrow layer (k/v: N = 1024, 64 blocks) splits K until the grid fills the SMs
    s = mma.plan_split(cfg, 16, 1024, 5120, 132, per_sm=4)
    assert 64 * s >= 0.9 * resident
    # the head (N = 151936) fills them alone; no partials to write
    assert mma.plan_split(cfg, 16, 151936, 5120, 132, per_sm=4) == 1
    # every warp keeps at least two chunks (K = 512: 8 chunks, 4 warps)
    assert mma.plan_split(cfg, 1, 1024, 512, 132, per_sm=4) == 1
    # partials grow with M: never more splits at M = 64 than at M = 1
    for n, k in ((1024, 5120), (5120, 5120), (5120, 17408), (8192, 5120)):
        assert (mma.plan_split(cfg, 64, n, k, 132, per_sm=4)
                <= mma.plan_split(cfg, 1, n, k, 132, per_sm=4))
    assert mma.plan_split(MmaConfig(2, 4, 4, split=3), 16, 1024, 5120, 132) == 3
    # x shared: a block covers its 4 warps' columns (64: 16 blocks at N = 1024), so K splits
    # more to fill the SMs; each warp sees every chunk of its split (K = 512: 4 splits)
    xs = MmaConfig(2, 4, 4, share_x=True)
    s = mma.plan_split(xs, 16, 1024, 5120, 132, per_sm=4)
    assert 16 * s >= 0.9 * min(resident, 16 * 16) and s > mma.plan_split(cfg, 16, 1024, 5120,
                                                                         132, per_sm=4)
    assert mma.plan_split(xs, 1, 1024, 512, 132, per_sm=4) == 4


def test_the_splits_fused_in_clusters_give_the_reduce_kernels_bits():
    """The splits summed as the kernel's clusters do (each block's tile of sums, every rank's
    threads finishing their elements through the header's fin_first / fin_step / tile_index)
    write every output, with the same bits as the partials summed by w12_mma_reduce: every
    kernel kind, 2-8 splits (more than a split has chunks too), M across the m-tiles, N = 72
    leaving the last tile's columns outside N."""
    t = encode(gaussian(72, 640, seed=11))
    for m in (1, 7, 17, 40):
        x = _x(m, 640, seed=m)
        ref = _ref(x, t, "w12")
        for cfg, split in ((MmaConfig(2, 2, 4), 2), (MmaConfig(4, 2, 3), 5),
                           (MmaConfig(1, 4, 8), 8), (MmaConfig(2, 2, 4, share_x=True), 3),
                           (MmaConfig(4, 2, 5, share_x=True), 8),
                           (MmaConfig(1, 8, 8, staged=True), 2),
                           (MmaConfig(2, 4, 4, staged=True), 6)):
            fused = emulate(x, t, "w12", cfg, split=split, out_f32=True, fuse=True)
            assert not fused.isnan().any(), (cfg, split, m)
            assert torch.equal(fused, emulate(x, t, "w12", cfg, split=split, out_f32=True))
            check(fused, ref)
            y16 = emulate(x, t, "w8", cfg, split=split, fuse=True)
            assert torch.equal(y16.view(torch.int16),
                               emulate(x, t, "w8", cfg, split=split).view(torch.int16))
    with pytest.raises(ValueError, match="at most 8"):
        emulate(_x(2, 640), t, "w12", MmaConfig(2, 2, 4), split=9, fuse=True)


def test_a_fused_sum_that_skips_elements_is_caught():
    """The header built with a finishing stride one rank too long (W12_MMA_FIN_FAULT): some
    outputs are never written, which the emulator shows as NaN; one split never fuses."""
    t = encode(gaussian(64, 256, seed=12))
    x = _x(16, 256, seed=12)
    cfg = MmaConfig(2, 2, 4, share_x=True)   # a tile of 16 x 64 sums, 2 x 128 threads
    y = emulate(x, t, "w12", cfg, split=2, out_f32=True, fuse=True,
                defines=("W12_MMA_FIN_FAULT",))
    assert y.isnan().any()
    check(emulate(x, t, "w12", cfg, split=1, out_f32=True, fuse=True,
                  defines=("W12_MMA_FIN_FAULT",)), _ref(x, t, "w12"))


def test_fused_launches_split_at_most_a_cluster():
    """A fused launch plans at most MAX_FUSED splits (a portable cluster), an explicit split
    included; unfused keeps 16."""
    cfg = MmaConfig(2, 2, 4, share_x=True)
    assert mma.plan_split(cfg, 1, 1024, 17408, 132, per_sm=4) > mma.MAX_FUSED
    assert mma.plan_split(cfg, 1, 1024, 17408, 132, per_sm=4, most=mma.MAX_FUSED) == mma.MAX_FUSED
    assert mma.plan_split(MmaConfig(2, 4, 4, split=12), 16, 1024, 5120, 132,
                          most=mma.MAX_FUSED) == mma.MAX_FUSED
    assert not mma.fuses(torch.device("cpu"))


def test_the_tuner_times_each_fused_split_against_the_second_kernels_sum():
    """Where a candidate splits K when fused, its unfused twin joins the tuner's candidates
    (neither sum won on every shape on the H100); one that does not split has no twin, and a
    twin is never added twice."""
    one, two = MmaConfig(2, 2, 4), MmaConfig(2, 4, 4)
    got = mma.tune_candidates((one, two, one), lambda c: 2 if c == two else 1)
    assert got == (one, two, MmaConfig(2, 4, 4, fuse=False))
    # the candidates at M = 1 on 17408x5120, split by plan_split with an H100's 132 SMs
    shape = dict(m=1, n=5120, k=17408, sms=132, per_sm=4, most=mma.MAX_FUSED)
    got = mma.tune_candidates(mma.CONFIGS[1], lambda c: mma.plan_split(c, **shape))
    twins = [c for c in got if not c.fuse]
    assert twins and all(mma.plan_split(replace(c, fuse=True), **shape) > 1 for c in twins)
    assert len(got) == len(mma.CONFIGS[1]) + len(twins)


NVCC_SKIP = pytest.mark.skipif(mma.nvcc() is None, reason="no nvcc")


@NVCC_SKIP
def test_kernel_compiles_for_hopper_without_spills(tmp_path):
    """Every instantiation of the W12 view assembles for sm_90; those for M <= 32 (the
    verify and tree shapes that matter most) spill nothing; the PTX holds the bf16 mma.
    Built without the 8-bit view (W12_MMA_ONLY_W12): the whole library took 255 s of one
    core here (front end 120, ptxas 135; 2026-12-07), the suite's longest test. Its 56
    W8 kernels, checked the same way that day, spilled nothing; two of them took more
    registers than their W12 twins (111 against 108, 71 against 54), within every bound
    below. The GPU machine builds both views for its tests."""
    src = mma.SOURCES / mma.CUDA_SOURCE
    ptx = tmp_path / "k.ptx"
    subprocess.run([mma.nvcc(), "-std=c++17", "-arch=sm_90", "-DW12_MMA_ONLY_W12", "-ptx", "-o",
                    str(ptx), str(src)], check=True, capture_output=True, text=True)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx.read_text()
    # the PTX assembled by ptxas (nvcc's own last step): the C++ front end runs once
    ptxas = Path(mma.nvcc()).with_name("ptxas")
    cmd = ([str(ptxas), "-arch=sm_90", "-v", "-o", str(tmp_path / "k.cubin"), str(ptx)]
           if ptxas.is_file() else
           [mma.nvcc(), "-O3", "-std=c++17", "-arch=sm_90", "-DW12_MMA_ONLY_W12", "-cubin",
            "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(src)])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    info = out.stderr + out.stdout
    blocks = re.findall(r"Function properties for (\S+)\n.*?(\d+) bytes spill stores", info)
    regs = dict(re.findall(r"Function properties for (\S+)\n[^\n]*\n[^\n]*Used (\d+) registers",
                           info))
    assert not any("ELb1E" in name for name, _ in blocks), "an 8-bit view was built"
    # the capped shared-x kernels (template argument MINB 3 or 4) may spill: their own check
    capped = {name: int(spill) for name, spill in blocks if re.search(r"ELb[01]ELi[34]EEv", name)}
    blocks = [(name, spill) for name, spill in blocks if name not in capped]
    for kind in ("w12_mma_kernel", "w12_mma_xs_kernel"):   # x shared or not
        kernels = {name: int(spill) for name, spill in blocks if kind in name}
        assert len(kernels) == 4 * 4, sorted(kernels)   # m-tiles x (ng, depth)
        small = {n: s for n, s in kernels.items() if re.search(r"kernelILi[12]E", n)}
        assert len(small) == 8 and all(s == 0 for s in small.values()), small
        if kind == "w12_mma_xs_kernel":   # x copied by cp.async: no staging registers
            assert all(s == 0 for s in kernels.values()), kernels
    # the staged kernels (mma.STAGED): every m-tile count; at M <= 32 no spill, and
    # at most 128 registers wherever ng <= 2 (their ring is in shared memory: 42-87 by
    # ptxas 13.0, 2026-12-07; with the register ring 114-199 at M = 64)
    staged = {name: int(spill) for name, spill in blocks if "w12_mma_st_kernel" in name}
    assert len(staged) == 4 * len(mma.STAGED), sorted(staged)
    assert all(sp == 0 for n, sp in staged.items() if re.search(r"kernelILi[12]E", n)), staged
    st_regs = {n: int(r) for n, r in regs.items()
               if re.search(r"w12_mma_st_kernelILi[1-4]ELi[12]E", n)}
    assert len(st_regs) == 4 * 3 and all(r <= 128 for r in st_regs.values()), st_regs
    # at M = 64 the shared-x (2, 2) kernel fits four blocks of four warps an SM (at most 128
    # registers; 144 with x staged through registers, two blocks): occupancy, not the mma,
    # held M = 64 (Nsight Compute on the H100, 2026-12-06)
    m64 = {n: int(r) for n, r in regs.items() if "w12_mma_xs_kernelILi4ELi2ELi2E" in n}
    assert len(m64) == 1 and all(r <= 128 for r in m64.values()), m64
    # the capped ones (mma.CAPPED): each m-tile count, registers within the cap
    # that MINB blocks of 128 threads an SM leave (65536 / 128 / MINB: 128 for four, 170
    # rounded down to 168 for three); uncapped, (2, 4) took 156 and (4, 2) 199 at M = 64
    assert len(capped) == 4 * len(mma.CAPPED), sorted(capped)
    for ng, depth, minb in mma.CAPPED:
        mine = {n: int(r) for n, r in regs.items()
                if re.search(rf"w12_mma_xs_kernelILi[1-4]ELi{ng}ELi{depth}ELb[01]ELi{minb}EEv", n)}
        assert len(mine) == 4 and all(r <= 65536 // 128 // minb // 8 * 8 for r in mine.values()), mine
