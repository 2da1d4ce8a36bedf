"""Crash test: kill a real `specpilot explore` mid-phase-1 and resume it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cycle_fixtures import REPO, project, shared_cache  # noqa: F401

from specpilot.cycle import runner
from specpilot.cycle.state import FINAL, RunStore, list_runs
from specpilot.memory.store import Memory
from specpilot.memory.verify import verify

pytestmark = pytest.mark.slow


def _state(project):
    runs = list_runs(project)
    return runs[-1] if runs else None


def test_killed_cycle_resumes_without_redoing_finished_directions(project):
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECPILOT_HOLD_AFTER_DIRECTIONS": "1"}
    env.pop("ANTHROPIC_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "specpilot", "explore", "--json"],
                            cwd=project, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            st = _state(project)
            if st and st.directions and st.directions[0].status in FINAL:
                break
            assert proc.poll() is None, "explore ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the first direction never finished")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _state(project)
    assert before.phase == "explore" and len(before.directions) == 2
    assert before.directions[1].status not in FINAL    # killed mid-phase-1
    first = before.directions[0]

    after = runner.resume(project, before.run_id).run("integrate")
    assert after.resumed == 1
    assert after.analysis == before.analysis and after.run_id == before.run_id
    done = after.directions[0]
    assert done.model_dump() == first.model_dump()    # not redone: same verdict, times, attempts
    assert after.directions[1].status in FINAL and after.phase == "integrate"
    saved = RunStore(project, before.run_id).load()
    assert saved == after
    log = (project / ".specpilot" / "runs" / before.run_id / "cycle.log").read_text()
    assert "resumed at phase explore" in log
    if after.entries:   # anything adopted is a reproducing entry
        assert verify(Memory(project), "refs", after.entries).ok
