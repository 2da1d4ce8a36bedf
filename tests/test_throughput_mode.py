"""The controller's throughput mode (`compare --batch C`): each round served as one batch by
the system's batched engine, the round's time the statistic, and every batched output
checked against stock's single-request reference (the batched gate).

Real candidates (tests/judge_fixtures.py) in real workers on the random tiny target.
"""

from __future__ import annotations

import pytest

from judge_fixtures import cheat, judge_project
from specpilot.errors import SpecPilotError
from specpilot.judges.controller import compare, compare_many

MODEL = "random:tiny-qwen3"

# Batching that changes tokens: the second request a batched engine admits, and every
# other one after it, has every token it gains shifted by one. Single-request generation
# (Engine) is untouched, so every gate that runs requests one at a time passes it; it is
# also faster, since a wrong token ends nothing early here: only the batched output check
# can see it. (It shifted only while two requests were in flight, and passed the gate once
# under pytest-xdist: a round's first request can end before its second arrives, and then
# nothing is shifted.)
WRONG_WHEN_BATCHED = """
_real_emit = BatchEngine._emit


def _shifted_emit(self, req, new):
    seen = self.__dict__.setdefault("_cheat_seen", [])   # requests in order of admission
    if not any(r is req for r in seen):
        seen.append(req)
    if next(i for i, r in enumerate(seen) if r is req) % 2 == 1:
        new = [(t + 1) % self.model.cfg.vocab_size for t in new]
    return _real_emit(self, req, new)


BatchEngine._emit = _shifted_emit
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from judge_fixtures import CONFIG

    # two stock workers for the references and for the forced check (the outputs dealt
    # among them), as bench/gpu_verdict.sh runs small targets
    two = CONFIG.replace("[controller]\n", "[controller]\nreference_processes = 2\n")
    return judge_project(tmp_path_factory.mktemp("throughput") / "proj", two)


def test_throughput_mode_times_batches_judges_candidates_apart_and_its_batched_gate_rejects(
        project):
    """One run (CI time) for every property below; it was two tests, each its own run, the
    first a one-candidate copy of the second's side B (their worker starts were most of their
    time). A is stock verifying every step 4 times (option repeat_work: identical writes, the
    same tokens); the candidates are B, whose outputs change only when requests share a
    batch, and C, the honest one (stock without A's 4x verification).

    Throughput mode: the rounds are timed as batches under an arrival trace, A is seen
    slower, A's batched outputs pass the check, B's are caught.

    `compare A B C`: one run, one stock reference, one A side, two candidates as sides B
    and C of the same rounds. B is rejected for its own faults; C is judged on its own cells
    against the same A cells, its outputs clean, and neither verdict sees the other's
    workers. The bound's level is split between the two (family 2)."""
    bad = cheat(project, "wrong-when-batched", WRONG_WHEN_BATCHED, path="stock/batch.py")
    said: list[str] = []
    reps = compare_many(project, "stock", [(bad, {}), ("stock", {})],
                        opts_a={"repeat_work": "3"}, model=MODEL, max_new=8, rounds=4,
                        requests=2, batch=2, sigma=0.05, rate=40.0, progress=said.append)
    assert [r.b.rev for r in reps] == [bad, "stock"]
    cheat_rep, honest = reps
    for rep in reps:
        assert rep.batch == 2 and rep.a.effective["repeat_work"] == 3
        # an arrival trace (the second request of a round arrives later, the same on both
        # sides, each sent only at its time): no side's round ends before its last arrival
        assert rep.rate == 40.0 and len(rep.arrivals) == 4
        assert all(at[0] == 0.0 and at[1] > 0 for at in rep.arrivals)
        for label, rows in rep.paired.times.items():
            assert all(row[0] >= at[-1] for row, at in zip(rows, rep.arrivals)), label
        assert len(rep.requests) == 4 * 2
        assert all(len(row) == 1 for rows in rep.paired.times.values() for row in rows)
        assert rep.estimate.pairs == 4                      # one cell per round
        assert rep.estimate.gain > 0                        # A's 4x verify is seen
        assert rep.outputs["A"].ok and rep.outputs["A"].requests == 2 * 8
        assert rep.outputs["A"].forced == 0                 # fp32: stock's own tokens
    assert honest.arrivals == cheat_rep.arrivals            # one trace for every side
    # B's shifted outputs were forced through stock (never continued, never charged)
    assert cheat_rep.outputs["B"].forced > 0 and cheat_rep.outputs["B"].restarts == 0
    assert not cheat_rep.outputs["B"].ok and cheat_rep.faults
    assert cheat_rep.faults[0].startswith("B ")
    # a shifted token where stock was sure, or (the random target's margins are small, the
    # prompts fresh each run) one near-tie past the comparison's budget
    assert all("stock's argmax after the same tokens" in f or "beyond the" in f
               for f in cheat_rep.faults), cheat_rep.faults
    assert not cheat_rep.decision.adopted

    assert sum(m == "stock's reference outputs" for m in said) == 1   # computed once
    # where the reference workers' time went, summed over both (fp32: no noise pass)
    parts = [m for m in said if m.startswith("stock's reference: ")]
    assert len(parts) == 1 and "in 2 worker(s)" in parts[0], said
    assert "generate " in parts[0] and "forced " in parts[0] and "noise" not in parts[0]
    assert any(m.startswith("candidates: B ") and "C stock" in m for m in said), said
    # the run's clock, its phases one after another (nothing prepared beside the reference)
    assert said[-1].startswith("the run's clock: stock's reference "), said[-1]
    assert list(reps[0].clock_s) == ["stock's reference", "workers started", "graphs",
                                     "rounds", "outputs forced", "all"]
    assert sum(v for k, v in reps[0].clock_s.items() if k != "all") <= reps[0].clock_s["all"]
    run = sorted((project / ".specpilot" / "runs").glob("compare-*"))[-1]
    assert (run / "stock-check.log").exists() and (run / "stock-check1.log").exists()
    assert (run / "stock-reference1.log").exists()   # the references in two workers too
    for rep in reps:
        assert sorted(rep.paired.times) == ["A0", "A1", "B0", "B1"]    # A and its own side
        assert rep.estimate.family == 2 and rep.family == 2
        assert rep.candidates == [bad, "stock"]
    assert cheat_rep.paired.times["A0"] == honest.paired.times["A0"]   # the same A cells
    assert cheat_rep.paired.times["B0"] != honest.paired.times["B0"]
    assert honest.outputs["B"].ok and honest.outputs["A"].ok and not honest.faults
    assert honest.outputs["B"].side == "C" and honest.outputs["B"].requests == 2 * 8
    assert honest.b.effective.get("repeat_work", 0) == 0


def test_bad_throughput_designs_are_one_line_errors(project):
    with pytest.raises(SpecPilotError, match="--batch must be at least 1"):
        compare(project, "stock", "stock", model=MODEL, batch=-1)
    with pytest.raises(SpecPilotError, match="--rate needs --batch"):
        compare(project, "stock", "stock", model=MODEL, rate=5.0)
    with pytest.raises(SpecPilotError, match="pairs per process"):   # one cell a round
        compare(project, "stock", "stock", model=MODEL, batch=2, rounds=2)


def test_throughput_mode_folds_stocks_own_batching_into_the_near_tie(project, monkeypatch):
    """Where the reference measured its noise (bf16 on a GPU; here its pass is asked for,
    fp32), stock's reference worker also serves every measured request through its own
    batched engine before any candidate runs, and the controller folds what parts from the
    single-request references into the near-tie (stock_reference.fold_batch_noise). The real
    path, end to end: the worker's batched outputs reach the fold, one per measured
    request, equal to the references here (fp32), so nothing widens."""
    from specpilot.judges import stock_reference
    from specpilot.judges.worker_proc import Worker

    real_call, real_fold, folds = Worker.call, stock_reference.fold_batch_noise, []

    def call(self, cmd, request_id, **fields):
        if cmd == "reference":
            fields["noise"] = True   # the shape-noise pass, as bf16 runs it
        return real_call(self, cmd, request_id, **fields)

    def fold(expected, outputs, forced=None):
        folds.append((set(expected), dict(outputs), real_fold(expected, outputs, forced),
                      forced))
        return folds[-1][2]

    monkeypatch.setattr(Worker, "call", call)
    monkeypatch.setattr(stock_reference, "fold_batch_noise", fold)
    rep = compare(project, "stock", "stock", model=MODEL, max_new=8, rounds=4, requests=2,
                  batch=2, sigma=0.05)
    assert len(folds) == 1
    expected, outputs, parted, forced = folds[0]
    assert expected == set(outputs) == set(rep.requests) and len(outputs) == 4 * 2
    assert all(len(toks) == 8 for toks in outputs.values()) and parted == 0
    assert forced == {}   # nothing parted, so stock was forced through none of them
    assert rep.tolerance is not None and not rep.tolerance.widened
    assert rep.outputs["A"].ok and rep.outputs["B"].ok


def test_near_ties_in_throughput_mode_are_forced_never_continued_nor_charged(tmp_path):
    """The bias the H100 showed (2026-12-06): a batched output that parted at a near-tie was
    continued alone and that single request's seconds added to its batch's time, so a
    verdict measured which side met more near-ties. Here every margin is a near-tie (a
    project whose near-tie is wide), so each token the batched cheat shifts is a tolerated
    divergence: its outputs pass, every parted one checked by forcing stock through it, and
    no continuation runs or is charged (on the code before, each near-tie was continued
    alone and its seconds added to B's batches)."""
    from judge_fixtures import CONFIG

    wide = (CONFIG.replace("[controller]\n", "[controller]\nnear_tie_rate = 1.0\n")
            .replace("[gates]\n", "[gates]\nnear_tie_epsilon = 1000.0\n"))
    project = judge_project(tmp_path / "wide", wide)
    bad = cheat(project, "wrong-when-batched", WRONG_WHEN_BATCHED, path="stock/batch.py")
    rep = compare(project, "stock", bad, model=MODEL, max_new=8, rounds=4, requests=2,
                  batch=2, sigma=0.05)
    b = rep.outputs["B"]
    assert b.ok and b.near_ties, b.faults                  # shifted tokens: near-ties here
    assert b.restarts == 0 and b.continuation_s == {}      # nothing continued, nothing charged
    assert b.forced > 0
