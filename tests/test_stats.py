"""The adoption rule on synthetic runs with known effects (layout: label -> [round][request])."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specpilot.config import ControllerSection
from specpilot.errors import SpecPilotError
from specpilot.judges.stats import decide, estimate, judge, threshold

CFG = ControllerSection()
NOISE = 0.01  # per-measurement multiplicative noise (lognormal sd), ~1% per request


def run(rng, gain: float, processes: int = 2, rounds: int = 4, requests: int = 8,
        offset_sd: float = 0.0, noise: float = NOISE) -> dict:
    """Per-request base times spread over 10x; B is `gain` faster; each process has its own
    life-long offset; independent noise per measurement."""
    base = rng.uniform(0.2, 2.0, requests)
    times = {}
    for side in "AB":
        for i in range(processes):
            off = rng.normal(0, offset_sd)
            t = base * np.exp(off + rng.normal(0, noise, (rounds, requests)))
            times[f"{side}{i}"] = (t / (1 + gain) if side == "B" else t).tolist()
    return times


def test_gain_and_bound_recover_a_known_effect():
    rng = np.random.default_rng(3)
    est = estimate(run(rng, 0.10, processes=3, rounds=8), CFG)
    assert est.gain == pytest.approx(0.10, abs=0.015)
    assert 0.0 < est.lower_bound < est.gain
    assert est.level == 0.95 and est.family == 1 and est.df == 4 and est.method == "t-process"
    assert (est.processes_a, est.processes_b, est.pairs, est.rounds) == (3, 3, 64, 8)
    assert est.wilcoxon_p is not None and est.wilcoxon_p < 1e-6
    assert set(est.aa_gains) == {"A1/A0", "A2/A0", "A2/A1", "B1/B0", "B2/B0", "B2/B1"}
    assert judge(run(rng, 0.10), cfg=CFG)[1].adopted


def test_a_process_offset_widens_the_bound_where_pairs_alone_would_not():
    """A0 runs 6% slower than A1 for its whole life: the pairs of A0 look like a gain for
    B, and only the spread between same-side processes shows it is noise."""
    rng = np.random.default_rng(4)
    times = run(rng, 0.0, rounds=8, noise=0.002)
    times["A0"] = (np.asarray(times["A0"]) * 1.06).tolist()
    est, dec = judge(times, cfg=CFG)
    assert est.gain == pytest.approx(0.03, abs=0.005)   # the offset, averaged over A0, A1
    d = np.log(np.asarray(times["A0"]) / np.asarray(times["B0"])).ravel()
    naive_low = math.expm1(d.mean() - 1.7 * d.std(ddof=1) / math.sqrt(d.size))
    assert naive_low > 0.05   # one process per side would have "seen" a 5%+ gain
    assert est.lower_bound < 0 and not dec.adopted
    assert est.aa_gains["A1/A0"] == pytest.approx(0.06, abs=0.005)
    assert dec.sigma == est.sigma > 0.02 and dec.sigma_source.startswith("this run")


def test_sigma_is_the_rms_of_the_same_run_same_side_pairs_scaled_to_the_design():
    base = np.array([[0.5, 1.0, 2.0]] * 4)
    times = {"A0": base.tolist(), "A1": (base * 1.02).tolist(),
             "B0": (base / 1.1).tolist(), "B1": (base / 1.1).tolist()}
    cfg = CFG.model_copy(update={"min_pairs": 12})
    est = estimate(times, cfg)
    # D_A = log 1.02, D_B = 0; var of the gain = mean(D²)/2 · (1/2 + 1/2)
    assert est.sigma == pytest.approx(math.expm1(math.log(1.02) / 2))
    assert est.se_log_ratio == pytest.approx(math.log(1.02) / 2)   # equal P: σ is the SE
    assert est.aa_gains == pytest.approx({"A1/A0": 1 / 1.02 - 1, "B1/B0": 0.0})


def test_a_given_sigma_is_a_floor_that_can_only_raise_the_bar():
    rng = np.random.default_rng(6)
    est = estimate(run(rng, 0.10), CFG)
    low = decide(est, cfg=CFG, sigma_floor=est.sigma / 10)
    assert low.sigma == est.sigma and low.sigma_source.startswith("this run")
    high = decide(est, cfg=CFG, sigma_floor=0.5)
    assert high.sigma == 0.5 and high.sigma_source.startswith("given floor")
    assert high.threshold > low.threshold and not high.adopted and low.adopted


def test_family_splits_the_level_and_lowers_the_bound():
    times = run(np.random.default_rng(8), 0.05)
    one, three = estimate(times, CFG), estimate(times, CFG, family=3)
    assert three.level == pytest.approx(1 - 0.05 / 3) and three.family == 3
    assert three.lower_bound < one.lower_bound and three.gain == one.gain
    assert judge(times, cfg=CFG, family=3)[1].family == 3
    with pytest.raises(SpecPilotError, match="family"):
        estimate(times, CFG, family=0)


def test_slower_candidate_has_negative_bound_and_direction_slower():
    est, dec = judge(run(np.random.default_rng(5), -0.3), cfg=CFG)
    assert est.lower_bound < 0 and est.gain < 0
    assert dec.direction == "slower" and not dec.adopted


def test_divergent_outputs_raise_the_bar_to_three_percent():
    assert threshold(0.0, False, CFG) == pytest.approx(0.01)
    assert threshold(0.0, True, CFG) == pytest.approx(0.03)
    assert threshold(0.005, False, CFG) == pytest.approx(0.02)
    est = estimate(run(np.random.default_rng(9), 0.025), CFG)
    est = est.model_copy(update={"lower_bound": 0.02, "sigma": 0.0})
    assert decide(est, diverged=False, cfg=CFG).adopted
    assert not decide(est, diverged=True, cfg=CFG).adopted


def test_too_few_pairs_or_processes_is_a_one_line_refusal():
    rng = np.random.default_rng(10)
    with pytest.raises(SpecPilotError, match="min_pairs 8") as exc:
        estimate(run(rng, 0.1, rounds=2, requests=3), CFG)   # 6 pairs per process
    assert "\n" not in str(exc.value)
    with pytest.raises(SpecPilotError, match="2 worker processes per side") as exc:
        estimate(run(rng, 0.1, processes=1), CFG)
    assert "\n" not in str(exc.value)
    estimate(run(rng, 0.1, rounds=2, requests=4), CFG)   # 8: enough


def test_bad_input_is_an_error():
    good = run(np.random.default_rng(11), 0.0)
    for bad in ({**good, "A1": good["A1"][:-1]},                       # ragged
                {**good, "B0": [[0.0] * 8] * 4},                       # zero time
                {**good, "C0": good["A0"]}):                           # unknown label
        with pytest.raises(SpecPilotError):
            estimate(bad, CFG)


def test_identical_times_give_zero_gain_bound_and_sigma():
    t = [[1.0, 2.0, 3.0, 4.0]] * 2
    est, dec = judge({"A0": t, "A1": t, "B0": t, "B1": t}, cfg=CFG)
    assert est.gain == 0.0 and est.lower_bound == 0.0 and est.wilcoxon_p is None
    assert math.isclose(est.sigma, 0.0) and dec.direction == "no clear difference"
