"""Cost model: bounds from shapes, best-first trees on lattices, the hardware table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specpilot.judges import costmodel
from specpilot.judges.hardware import TABLE, for_device, lookup
from stock.config import PRESETS

NEG = -math.inf


def test_dense_27b_gemm_bound_is_weight_bytes_over_bandwidth_on_h200():
    cfg = PRESETS["dense-27b"]
    h200 = TABLE["H200"]
    work = costmodel.step_work(cfg, tokens=1, context=0, elt_bytes=2)["gemm"]
    per_layer = (5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 3 * 5120 * 25600)
    weights = 64 * per_layer + 5120 * 151936
    assert work.flops == pytest.approx(2 * weights)
    assert work.bytes == pytest.approx(2 * weights, rel=0.01)  # activations are tiny
    bound = work.bound(h200.bf16_flops, h200.bandwidth)
    assert bound == pytest.approx(2 * weights / (0.9 * 4.8e12), rel=0.01)  # bytes-bound
    big = costmodel.step_work(cfg, tokens=4096, context=0, elt_bytes=2)["gemm"]
    assert big.bound(h200.bf16_flops, h200.bandwidth) == pytest.approx(
        big.flops / (0.6 * h200.bf16_flops))  # compute-bound at 4096 tokens


def test_attention_bytes_grow_with_context():
    cfg = PRESETS["smollm2-135m"]
    short = costmodel.step_work(cfg, 1, 100, 4)["attention"]
    long = costmodel.step_work(cfg, 1, 4000, 4)["attention"]
    assert long.bytes > 30 * short.bytes
    kv = 30 * 2 * 3 * 64 * 4  # layers * (K, V) * kv heads * head dim * fp32
    assert long.bytes == pytest.approx(kv * 4002 + 30 * 4 * 2 * 9 * 64, rel=1e-6)


def test_hybrid_27b_counts_gdn_projections_and_the_recurrent_state():
    cfg = PRESETS["hybrid-27b"]
    work = costmodel.step_work(cfg, tokens=1, context=1000, elt_bytes=2)
    mlp = 3 * 5120 * 17408
    attn = 5120 * 24 * 256 * 2 + 2 * 5120 * 4 * 256 + 24 * 256 * 5120   # gated q_proj
    conv = 2 * 16 * 128 + 48 * 128
    gdn = 5120 * conv + 5120 * 48 * 128 + 2 * 5120 * 48 + 48 * 128 * 5120
    weights = 16 * (attn + mlp) + 48 * (gdn + mlp) + 5120 * 248320
    assert work["gemm"].flops == pytest.approx(2 * weights)
    state = 48 * 2 * 4 * 48 * 128 * 128          # 48 GDN layers read and write fp32 state
    window = 48 * 2 * conv * (2 * 3 + 4)         # and the conv's window (K-1 = 3) and weight
    assert work["recurrent"].bytes == pytest.approx(state + window)
    assert work["attention"].bytes == pytest.approx(
        16 * 2 * (2 * 4 * 256 * 1002 + 2 * 24 * 256), rel=1e-6)   # 16 attention layers only
    # the state costs the same at 16 tokens as at one: its share falls with the step
    assert costmodel.step_work(cfg, 16, 1000, 2)["recurrent"].bytes == work["recurrent"].bytes


def test_best_first_tree_is_ancestor_closed_and_ranked():
    lps = np.log(np.array([[0.6, 0.3, 0.1], [0.9, 0.05, 0.05], [0.5, 0.4, 0.1]]))
    tree = costmodel.best_first_tree(lps, 5)
    assert len(tree) == 5
    assert all(p[:-1] in tree or len(p) == 1 for p in tree)
    assert (0,) in tree and (0, 0) in tree and (1,) in tree
    assert (0, 0, 0) in tree  # 0.6*0.9*0.5 = .27 beats (1,0) .27? and (2,) .1
    assert (2,) not in tree


def test_tree_finds_tokens_the_chain_missed():
    ids = np.array([[10, 11, -1], [20, 21, -1]])
    lps = np.array([[-0.1, -2.5, NEG], [-0.1, -2.5, NEG]])
    target = [11, 99, 7]  # the target picked the second alternative at depth 0
    assert costmodel.accepted_on_tree(ids, {(0,)}, target) == 1
    assert costmodel.accepted_on_tree(ids, {(0,), (1,)}, target) == 2
    chain_hit = [10, 20, 5]
    assert costmodel.accepted_on_tree(ids, {(0,), (0, 0)}, chain_hit) == 3
    curve = costmodel.tau_curve([(ids, lps, target)], budgets=(1, 2, 4))
    assert curve == {1: 1.0, 2: 1.0, 4: 2.0}  # (1,) ranks after (0,) and (0,0)


def test_tau_factor_picks_the_budget_with_the_best_estimated_speedup():
    ids = np.array([[10, 11], [20, 21]])
    lps = np.array([[-0.1, -0.2], [-0.1, -0.2]])
    steps = [(ids, lps, [11, 1, 1])] * 4
    flat = costmodel.tau_factor(steps, 1.0, 3, bound_of=lambda t: 1.0)
    assert flat.best_tau == 2.0 and flat.factor == 2.0
    steep = costmodel.tau_factor(steps, 1.0, 3, bound_of=lambda t: float(t))
    # τ(1)=1, τ(2)=1 ((0,0) ties (1,) and wins), τ(4)=2; bounds 2, 3, 5; current 1/3
    assert steep.speedup_by_budget[1] == pytest.approx(1.5)
    assert steep.speedup_by_budget[4] == pytest.approx(1.2)
    assert steep.best_budget == 1 and steep.factor == 1.0


def test_hardware_table_has_sources_and_matches_device_names():
    for key in ("H100 SXM", "H200", "B200", "RTX PRO 6000 Blackwell", "A100", "L40S"):
        hw = TABLE[key]
        assert hw.bf16_flops > 1e14 and hw.bandwidth > 5e11 and len(hw.source) > 20
    assert lookup("NVIDIA H200").name == "H200"
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert lookup("NVIDIA RTX PRO 6000 Blackwell Workstation Edition").name.startswith("RTX")
    assert lookup("NVIDIA A100-SXM4-80GB").name == "A100"
    assert lookup("Some Other GPU") is None


def _quiet(monkeypatch, others=0.0, load1=0.0, spread=1.0):
    from specpilot import threads

    monkeypatch.setattr(threads, "measure_load", lambda *a, **k: (others, load1))
    monkeypatch.setattr(threads, "spread", lambda times: spread)


def test_cpu_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    _quiet(monkeypatch)   # the machine as a quiet one (this test's machine may be shared)
    first = for_device("cpu", tmp_path, measure_size="small")
    assert first.measured and first.fp32_flops > 1e8 and first.bandwidth > 1e8
    assert not first.contended and "0 other runnable" in first.conditions
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1
    second = for_device("cpu", tmp_path, measure_size="small")
    assert second == first  # read back, not measured again


@pytest.mark.parametrize("busy", [dict(others=2.0, load1=3.0), dict(spread=2.0)])
def test_ceilings_measured_on_a_busy_machine_are_never_cached(tmp_path, monkeypatch, busy):
    _quiet(monkeypatch, **busy)
    hw = for_device("cpu", tmp_path, measure_size="small")
    assert hw.contended and "busy: not cached" in hw.conditions
    assert not list(tmp_path.rglob("*.json"))


def test_cached_ceilings_are_keyed_by_the_day(tmp_path, monkeypatch):
    import time as _time

    _quiet(monkeypatch)
    real = _time.strftime
    for day in ("2026-01-01", "2026-01-02"):
        monkeypatch.setattr(_time, "strftime", lambda fmt, *a, d=day: d if fmt == "%Y-%m-%d"
                            else real(fmt, *a))
        for_device("cpu", tmp_path, measure_size="small")
    assert len(list(tmp_path.rglob("*.json"))) == 2   # one a day: a new day measures again


@pytest.mark.slow
def test_analyze_reports_three_factors_and_the_largest(smol, tmp_path):
    from specpilot.judges.analyze import analyze
    from specpilot.requests import load_dev, select

    hw = for_device("cpu", tmp_path, measure_size="small")
    rep = analyze(None, "embedded", "cpu", 1, 8, system=smol, hardware=hw,
                  requests=select(load_dev(), ["code"], 1))
    assert set(rep.factors) == {"tau", "kernel", "overhead"}
    assert rep.suggested == max(rep.factors, key=rep.factors.get)
    rows = {r.category: r for r in rep.categories}
    # the kernel factor is the kernels' profiled time over their bounds (its size is a
    # timing: 0.72 to above 1 on this 2-core CPU depending on what ran beside the ceilings'
    # measurement, so no test asserts it)
    kern = [r for r in rep.categories if r.category in costmodel.KERNELS and r.bound_ms]
    assert rep.factors["kernel"] == pytest.approx(
        sum(r.measured_ms for r in kern) / sum(r.bound_ms for r in kern), rel=1e-3)
    assert rows["gemm"].bound_ms > 0 and rows["gemm"].measured_ms > 0
    assert rep.steps > 0 and rep.tau_best_budget in (costmodel.CHAIN, *costmodel.TREE_BUDGETS)
    # with the n-gram drafter: τ exact, from decodes simulated on teacher-forced lattices
    assert rep.tau_method == "exact"
    assert [(r.mode, r.budget) for r in rep.tau_rows] == \
        [("chain", smol.options["draft_len"] + 1)] + [("tree", b) for b in (8, 16, 32, 64)]
    assert rep.tau_rows[0].tau == pytest.approx(rep.tau_measured)   # the chain: as measured


def test_an_eager_profile_of_a_graphed_system_leaves_kernel_and_overhead_unknown(tmp_path):
    """Where the timed steps replay CUDA graphs the profiler runs the static forward eagerly
    (on the H200 the embedded default's eager regions summed 18.6 ms a step against a 2.04
    ms graphed step: kernel factor 287, overhead 0.11). The report then leaves those two
    factors unknown, names τ the largest, and the offline planner puts the τ entry first;
    a profile of the timed path keeps both numbers."""
    from specpilot.agents.planner import offline_plan
    from specpilot.judges.analyze import report
    from specpilot.judges.worker_main import measure
    from specpilot.cycle.planning import memory_metas
    from stock.config import PRESETS
    from stock.drafters.ngram import NGramDrafter
    from stock.engine import Engine
    from stock.model import Transformer
    from stock.options import Options

    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    engine = Engine(model, Options({"draft_len": 4}), 256)
    prompt = [5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 2
    measured = measure(engine, NGramDrafter(3, 1, 4), [prompt], 12)
    assert measured["profile_path"] == "timed"   # no graphs on the CPU: the timed path
    hw = for_device("cpu", tmp_path, measure_size="small")
    timed = report(measured, "random:tiny-qwen3", hw, ["p"])
    assert timed.factors["kernel"] > 0 and timed.factors["overhead"] > 0
    eager = report({**measured, "profile_path": "eager"}, "random:tiny-qwen3", hw, ["p"])
    assert eager.factors == {"tau": timed.factors["tau"], "kernel": None, "overhead": None}
    assert eager.suggested == "tau" and eager.profile_path == "eager"
    assert costmodel.ceiling(eager.factors) is None   # no plausibility ceiling either
    # the planner on the H200's analysis (τ factor 1.26; this random target's τ is 1)
    analysis = eager.model_dump(mode="json")
    analysis["factors"]["tau"] = 1.26
    root = Path(__file__).resolve().parents[1]
    first = offline_plan(analysis, memory_metas(root), "block", 3, 2)[0]
    assert first.id == "reuse-tree-verify"   # with kernel 287 there: reuse-fused-rmsnorm
    analysis["factors"].update(kernel=287.0, overhead=0.11)
    assert offline_plan(analysis, memory_metas(root), "block", 3, 2)[0].id != first.id
