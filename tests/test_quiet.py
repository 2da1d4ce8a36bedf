"""Only the timed worker runs (specpilot/judges/quiet.py): the attack it stops, a candidate
that leaves processes burning the CPU after each reply (forked into sessions of their own)
so that the next timed worker, stock's, runs slower; and the mechanism on a process tree
whose grandchild left its session."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from cycle_fixtures import candidate, project, shared_cache  # noqa: F401

from specpilot.judges.controller import compare
from specpilot.judges.quiet import Held, _stat, _stop_one, alone, children_map, descendants


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return stat[stat.rfind(b")") + 2:].split()[0].decode()


def _wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


class _Proc:   # what quiet.alone reads of a Worker
    def __init__(self, popen):
        self.proc = popen


TREE = """
import os, sys, time
path = sys.argv[1]
if os.fork() == 0:          # the grandchild leaves the session, then counts
    os.setsid()
    n = 0
    while True:
        n += 1
        if n % 20000 == 0:
            with open(path, "w") as fh:
                fh.write(str(n))
else:
    while True:
        time.sleep(0.05)
"""


def test_a_held_worker_stops_to_its_last_descendant_and_continues_after(tmp_path):
    counter = tmp_path / "n"
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(counter)], start_new_session=True)
    try:
        assert _wait_for(counter.exists)
        tree = descendants([proc.pid], children_map())
        assert len(tree) == 2 and os.getsid(tree[1]) != os.getsid(proc.pid)   # escaped
        workers = {"A0": _Proc(proc), "B0": _Proc(None)}
        with alone(workers, ["B0"]):   # B0 timed: A0's whole tree stopped
            assert all(_wait_for(lambda p=p: _state(p) == "T", 5) for p in tree)
            time.sleep(0.05)
            before = counter.read_text()
            time.sleep(0.3)
            assert counter.read_text() == before          # the grandchild counts no more
        assert all(_wait_for(lambda p=p: _state(p) != "T", 5) for p in tree)
        assert _wait_for(lambda: counter.read_text() != before)   # and counts again
        with alone(workers, ["A0"]):   # A0 timed: nothing of it stopped
            assert all(_state(p) != "T" for p in tree)
    finally:
        for pid in descendants([proc.pid], children_map()):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()


def test_a_pid_that_is_not_the_process_scanned_is_never_stopped():
    """pids are reused (pid_max 32768 here): a process that took a scanned pid since, seen
    by its other start time, is left alone; the one scanned is stopped and then continued
    through its pin."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = _stat(proc.pid)[1]
        held = Held()
        _stop_one(proc.pid, start + 1, held)   # as if the scan had seen another process
        time.sleep(0.1)
        assert _state(proc.pid) != "T" and not (held.pinned or held.plain)
        _stop_one(proc.pid, start, held)
        assert _wait_for(lambda: _state(proc.pid) == "T", 5)
        held.release()
        assert _wait_for(lambda: _state(proc.pid) != "T", 5)
    finally:
        proc.kill()
        proc.wait()


# stock that, after each request, leaves one process per core burning for 0.4 s in a
# session of its own: no faster than stock, it slows whoever is timed next
LINGER = ("linger", [
    ("stock/engine.py", "\n\nclass EngineError(", '''

def _linger(seconds: float = 0.4) -> None:
    import os as _os, time as _time
    try:
        while _os.waitpid(-1, _os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    for _ in range(_os.cpu_count() or 2):
        if _os.fork() == 0:
            _os.setsid()
            end = _time.perf_counter() + seconds
            while _time.perf_counter() < end:
                pass
            _os._exit(0)


class EngineError('''),
    ("stock/engine.py", "            if recorder is not None:\n                recorder.end_request()\n        return res\n",
     "            if recorder is not None:\n                recorder.end_request()\n        _linger()\n"
     "        return res\n"),
])


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the hold reads /proc")
def test_a_candidate_that_keeps_burning_after_its_reply_slows_only_itself(project, tmp_path):
    """Before the hold, the lingering processes ran while stock's workers were timed:
    stock looked slower and the candidate faster than it is. Held, they run only when the
    candidate is timed again: it is measured slower, as it is."""
    attack = candidate(project, tmp_path, LINGER)
    # 8 pairs a process, not the project's 4: beside other tests on 2 cores (pytest -n 2)
    # 4 pairs once came out +32% with the hold on (σ 43%)
    rep = compare(project, "stock", attack, rounds=4, requests=2, model="random:tiny-qwen3",
                  max_new=24)
    assert not rep.paired.diverged and not rep.decision.adopted
    assert rep.estimate.gain < 0, rep.estimate
