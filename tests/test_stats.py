"""The adoption rule on synthetic timings with known effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specpilot.config import ControllerSection
from specpilot.errors import SpecPilotError
from specpilot.judges.stats import decide, estimate, sigma_from_aa, threshold

CFG = ControllerSection(bootstrap_resamples=999)
NOISE = 0.01  # per-measurement multiplicative noise (lognormal sd), ~1% per request


def simulate(rng, pairs: int, gain: float):
    """Per-request base times spread over 10x; B is `gain` faster; independent noise."""
    base = rng.uniform(0.2, 2.0, pairs)
    t_a = base * np.exp(rng.normal(0, NOISE, pairs))
    t_b = base / (1 + gain) * np.exp(rng.normal(0, NOISE, pairs))
    return t_a, t_b


def sigma_for(pairs: int) -> float:
    rng = np.random.default_rng(1234)
    return sigma_from_aa(estimate(*simulate(rng, pairs, 0.0), CFG))


@pytest.mark.parametrize("pairs,method", [(8, "t"), (32, "bca")])
def test_aa_trials_are_adopted_less_than_two_percent(pairs, method):
    rng = np.random.default_rng(7)
    sigma = sigma_for(pairs)
    adopted = 0
    for trial in range(200):
        est = estimate(*simulate(rng, pairs, 0.0), CFG, seed=trial)
        assert est.method == method
        adopted += decide(est, sigma, cfg=CFG).adopted
    assert adopted / 200 < 0.02


@pytest.mark.parametrize("pairs", [8, 32])
def test_true_five_percent_gain_is_adopted_in_most_trials(pairs):
    rng = np.random.default_rng(11)
    sigma = sigma_for(pairs)
    adopted = sum(decide(estimate(*simulate(rng, pairs, 0.05), CFG, seed=i), sigma,
                         cfg=CFG).adopted for i in range(200))
    assert adopted / 200 > 0.8


def test_gain_and_bound_recover_a_known_effect():
    rng = np.random.default_rng(3)
    est = estimate(*simulate(rng, 64, 0.10), CFG)
    assert est.gain == pytest.approx(0.10, abs=0.015)
    assert 0.0 < est.lower_bound < est.gain
    assert est.level == 0.95
    assert est.wilcoxon_p is not None and est.wilcoxon_p < 1e-6


def test_slower_candidate_has_negative_bound_and_direction_slower():
    rng = np.random.default_rng(5)
    est = estimate(*simulate(rng, 12, -0.3), CFG)
    dec = decide(est, 0.001, cfg=CFG)
    assert est.lower_bound < 0 and est.gain < 0
    assert dec.direction == "slower" and not dec.adopted


def test_divergent_outputs_raise_the_bar_to_three_percent():
    assert threshold(0.0, False, CFG) == pytest.approx(0.01)
    assert threshold(0.0, True, CFG) == pytest.approx(0.03)
    assert threshold(0.005, False, CFG) == pytest.approx(0.02)
    rng = np.random.default_rng(9)
    est = estimate(*simulate(rng, 32, 0.025), CFG)
    assert 0.01 < est.lower_bound < 0.03
    assert decide(est, 0.0, False, CFG).adopted
    assert not decide(est, 0.0, True, CFG).adopted


def test_bad_input_is_an_error():
    with pytest.raises(SpecPilotError):
        estimate([1.0, 2.0], [1.0], CFG)
    with pytest.raises(SpecPilotError):
        estimate([1.0, 0.0], [1.0, 1.0], CFG)
    with pytest.raises(SpecPilotError):
        estimate([1.0], [1.0], CFG)


def test_identical_times_give_zero_gain_and_bound():
    est = estimate([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], CFG)
    assert est.gain == 0.0 and est.lower_bound == 0.0 and est.wilcoxon_p is None
    assert math.isclose(sigma_from_aa(est), 0.0)
