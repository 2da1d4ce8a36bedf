"""Throughput mode's charge for outputs that part from stock's at near-ties
(judges/controller.py, _charge): a round timed as one batch is charged at its own rate for
the tokens it did not keep, never with a continuation's single-request seconds."""

from __future__ import annotations

import math

from specpilot.config import ControllerSection
from specpilot.judges import stats
from specpilot.judges.controller import _charge


def _rows(rounds: int, per: int) -> list[list[tuple]]:
    return [[(f"r{m}-{i}", "", None) for i in range(per)] for m in range(rounds)]


def test_a_batched_round_is_charged_at_its_own_rate():
    """One batch of two 100-token requests in 1.0 s, one kept to token 50 (a near-tie there)
    and continued alone in 5.0 s: charged 1.0 x 200 / 150, not 1.0 x 0.75 + 5.0. A round
    timed request by request keeps the measured continuation."""
    rows = _rows(1, 2)
    charges = {"r0-0": (0.5, 5.0, 50.0, 100), "r0-1": (1.0, 0.0, 100.0, 100)}
    batched = [[1.0]]
    _charge(batched, rows, charges)
    assert math.isclose(batched[0][0], 200 / 150)
    single = [[1.0, 1.0]]
    _charge(single, rows, charges)
    assert single[0] == [0.5 + 5.0, 1.0]


def _verdict(extra_a: float, extra_b: float, old: bool) -> stats.Decision:
    """Two sides of the same speed (0.15 s a batch of 16, the same noise on both), their
    outputs parting from stock's at near-ties 12 (A) and 10 (B) times a round, each
    continuation `extra` seconds alone; charged by the old rule (the continuations' seconds
    added) or by _charge."""
    rounds, per = 8, 16
    rows = _rows(rounds, per)
    times = {}
    for label, n_ties, extra in (("A0", 12, extra_a), ("A1", 12, extra_a),
                                 ("B0", 10, extra_b), ("B1", 10, extra_b)):
        noise = [1 + 0.03 * math.sin(7 * m + len(label) + int(label[1])) for m in range(rounds)]
        t = [[0.15 * noise[m]] for m in range(rounds)]
        parted, whole = (100 / 128, extra, 100.0, 128), (1.0, 0.0, 128.0, 128)
        charges = {req[0]: parted if i < n_ties else whole
                   for row in rows for i, req in enumerate(row)}
        if old:   # the rule before: kept share of the batch plus every continuation's seconds
            for m, row in enumerate(rows):
                got = [charges[req[0]] for req in row]
                t[m][0] = t[m][0] * sum(g[0] for g in got) / len(got) + sum(g[1] for g in got)
        else:
            _charge(t, rows, charges)
        times[label] = t
    return stats.judge(times, True, ControllerSection(), 1)[1]


def test_near_ties_met_by_chance_do_not_decide_a_throughput_verdict():
    """The bias the H100 verdict on admission-stack showed (2026-12-06): sides of one speed,
    stock meeting a few more near-ties; each continuation run alone (0.06 s) costs about
    what the whole batch of 16 cost for its share. Charging those seconds made B look
    faster by far and adopted it; charging at the batch's own rate does not."""
    assert _verdict(0.06, 0.06, old=True).adopted          # the old rule: fooled
    dec = _verdict(0.06, 0.06, old=False)
    assert not dec.adopted, dec
