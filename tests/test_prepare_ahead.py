"""controller.prepare_beside_reference: every side's workers start once stock's reference
has tokenized the prompts and prepare (untimed) while the references are computed, instead
of after them. The verdicts must be what they were: the same outputs checked, a candidate
whose batching breaks tokens still caught, an honest one still clean; a worker that fails
to prepare stops the run with its error and leaves no worker behind.

Real candidates (tests/judge_fixtures.py) in real workers on the random tiny target.
"""

from __future__ import annotations

import os

import pytest

from judge_fixtures import CONFIG, cheat, judge_project
from specpilot.judges.controller import compare_many
from test_throughput_mode import MODEL, WRONG_WHEN_BATCHED

FAILS_TO_PREPARE = """
def _no_prepare(self, end=None):
    raise RuntimeError("this candidate cannot prepare")


BatchEngine.prepare = _no_prepare
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    ahead = CONFIG.replace("[controller]\n", "[controller]\nreference_processes = 2\n"
                           "prepare_beside_reference = true\n")
    return judge_project(tmp_path_factory.mktemp("ahead") / "proj", ahead)


def children() -> set[int]:
    """This process's live worker children (Linux /proc: a child whose command line runs
    worker_main, confined or not; gitpython's own `git cat-file` helpers are not ours)."""
    me, out = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                argv = f.read()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and "worker_main" in argv:
            out.add(int(pid))
    return out


def test_workers_prepared_beside_the_reference_give_the_same_verdicts(project):
    """Two candidates (B breaks tokens when batched, C is honest) judged with every side's
    workers started right after the prompts were tokenized, before the references: the
    start is said before the reference's own summary line, B is caught by the forced check,
    C is clean, and both are judged on the same A cells."""
    bad = cheat(project, "wrong-when-batched", WRONG_WHEN_BATCHED, path="stock/batch.py")
    said: list[str] = []
    before = children()
    reps = compare_many(project, "stock", [(bad, {}), ("stock", {})],
                        opts_a={"repeat_work": "3"}, model=MODEL, max_new=8, rounds=4,
                        requests=2, batch=2, sigma=0.05, progress=said.append)
    started = said.index("every side's workers started, to prepare beside stock's reference")
    summary = next(i for i, m in enumerate(said) if m.startswith("stock's reference: "))
    assert said.index("stock's reference outputs") < started < summary, said
    assert any(m.startswith("graphs up to a context of") for m in said), said
    cheat_rep, honest = reps
    for rep in reps:
        assert sorted(rep.paired.times) == ["A0", "A1", "B0", "B1"]
    assert cheat_rep.paired.times["A0"] == honest.paired.times["A0"]
    assert not cheat_rep.outputs["B"].ok and cheat_rep.faults
    assert cheat_rep.outputs["B"].forced > 0 and not cheat_rep.decision.adopted
    assert honest.outputs["B"].ok and honest.outputs["A"].ok and not honest.faults
    assert children() <= before   # every worker stopped
    # where the run's time went: the preparation its own phase, beside the reference
    clocks = [m for m in said if m.startswith("the run's clock: stock's reference ")]
    assert len(clocks) == 1 and "graphs (beside the reference)" in clocks[0], said
    for rep in reps:
        assert {"stock's reference", "workers started", "graphs (beside the reference)",
                "waiting for the graphs", "rounds", "outputs forced", "all"} == set(rep.clock_s)
        assert all(0 <= v <= rep.clock_s["all"] for v in rep.clock_s.values())


def test_a_worker_that_fails_to_prepare_beside_the_reference_stops_the_run(project):
    """The preparation's failure, in its own thread, is raised once the references are
    done (not lost, not hung), and every worker of the run is stopped."""
    bad = cheat(project, "fails-to-prepare", FAILS_TO_PREPARE, path="stock/batch.py")
    before = children()
    with pytest.raises(Exception, match="cannot prepare"):
        compare_many(project, "stock", [(bad, {})], model=MODEL, max_new=8, rounds=4,
                     requests=2, batch=2, sigma=0.05)
    assert children() <= before
