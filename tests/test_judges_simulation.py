"""False adoption by simulation through the real decision code (issue 20, class 6).

Synthetic workers are timed by the controller's own round loop (`controller.measure`) and
judged by `stats.judge`, the function `controller.compare` calls; see
specpilot/judges/simulate.py for the noise models. The old rule (one process per side, σ
from a separate A/A) is run on the same machines to show the attack the new one stops.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specpilot.config import ControllerSection
from specpilot.cycle.settings import ExploreSection
from specpilot.judges import simulate, stats

CFG = ControllerSection()             # the shipped defaults: 2 processes per side, ...
FAMILY = ExploreSection().max_directions   # ... judged as one cycle's directions (3)
ROUNDS, REQUESTS = CFG.rounds, CFG.requests  # 4 × 4 = 16 pairs per process
TRIALS = 400
MODEL = {m.name: m for m in simulate.MODELS}


def test_the_simulation_runs_the_controllers_layout():
    paired = simulate.synthetic_run(np.random.default_rng(0), simulate.REALISTIC, 0.1,
                                    CFG.processes, ROUNDS, REQUESTS)
    assert sorted(paired.times) == ["A0", "A1", "B0", "B1"]
    assert all(np.shape(t) == (ROUNDS, REQUESTS) for t in paired.times.values())
    assert paired.placement == ["A0,B0,A1,B1", "B0,A1,B1,A0", "A1,B1,A0,B0", "B1,A0,B0,A1"]
    est, dec = stats.judge(paired.times, paired.diverged, CFG, FAMILY)
    assert est.processes_a == est.processes_b == 2 and est.pairs == 16 and dec.family == 3


@pytest.mark.parametrize("model", simulate.MODELS + [simulate.REALISTIC], ids=lambda m: m.name)
def test_false_adoption_stays_below_two_percent(model):
    rate = simulate.rate(lambda g: simulate.new_rule(g, model, 0.0, CFG, FAMILY, ROUNDS,
                                                     REQUESTS), TRIALS, seed=101)
    assert rate < 0.02, f"{model.name}: {rate:.1%} of {TRIALS} A/A runs adopted"


def test_an_honest_ten_percent_gain_is_adopted_under_realistic_noise():
    rate = simulate.rate(lambda g: simulate.new_rule(g, simulate.REALISTIC, 0.10, CFG, FAMILY,
                                                     ROUNDS, REQUESTS), TRIALS, seed=202)
    assert rate >= 0.95, f"honest +10% adopted in {rate:.1%} of {TRIALS} trials"


def test_a_stale_sigma_given_from_outside_never_lowers_the_bar():
    model = MODEL["stale σ: quiet 0.2%/0 then 3%/1%"]
    rng = np.random.default_rng(303)
    trials, below = TRIALS // 2, 0
    for _ in range(trials):
        now = simulate.synthetic_run(rng, model, 0.0, CFG.processes, ROUNDS, REQUESTS)
        quiet = simulate.synthetic_run(rng, model.stale, 0.0, CFG.processes, ROUNDS, REQUESTS)
        stale = stats.estimate(quiet.times, CFG).sigma
        _, own = stats.judge(now.times, False, CFG, FAMILY)
        _, given = stats.judge(now.times, False, CFG, FAMILY, sigma_floor=stale)
        assert given.sigma == max(stale, own.sigma)
        assert given.threshold >= own.threshold and given.adopted <= own.adopted
        below += stale < own.sigma
    assert below >= 0.95 * trials   # the quiet machine's σ is stale: below today's noise


@pytest.mark.parametrize("name", ["process offset SD 2%", "process offset SD 3%",
                                  "stale σ: quiet 0.2%/0 then 3%/1%"])
def test_the_old_rule_adopts_more_than_two_percent_under_process_offsets(name):
    """The attack: one process per side turns a process offset into a gain that a
    within-run interval cannot see, and a separate A/A's σ does not cover it."""
    model = MODEL[name]
    old = simulate.rate(lambda g: simulate.old_rule(g, model, 0.0, CFG, ROUNDS, REQUESTS),
                        TRIALS, seed=404)
    new = simulate.rate(lambda g: simulate.new_rule(g, model, 0.0, CFG, FAMILY, ROUNDS,
                                                    REQUESTS), TRIALS, seed=404)
    assert old > 0.02 and new < 0.02, f"{name}: old rule {old:.1%}, new rule {new:.1%}"


def test_a_load_that_starts_partway_slows_every_later_call():
    """The `step` noise model: from the drawn call on, every call is `step` slower (log)."""
    model = simulate.NoiseModel("load", drift_sd=0.0, step=math.log(2.0))
    machine = simulate.Machine(model, np.random.default_rng(0), (3, 4))   # the load at call 3
    assert [machine.step() for _ in range(6)] == [0.0] * 3 + [math.log(2.0)] * 3
    assert simulate.Machine(simulate.REALISTIC, np.random.default_rng(0)).load_at is None
