"""Only the timed workers run: every other worker's processes are stopped while they are timed.

Workers take turns on one device, and candidate code runs in them. A candidate that keeps
working after its reply (a thread left spinning, processes it forked, even into a session
of their own) would slow whichever worker is timed next, stock's included, and look faster
for it. On this 2-core CPU such a candidate, no faster than stock (it leaves one process
per core burning for 0.4 s after each request: tests/test_quiet.py), measured +47% and
+35% against stock in two runs of the controller without this hold (not adopted there
only because 4 pairs gave σ 26-45%), and -76% and -79% with it (2026-12-06). So while a worker (or, on two devices, a pair) is timed, the
controller stops every process of every other worker with SIGSTOP and continues them
after: the process it started (bubblewrap, confined) and every descendant, found through
/proc by parent pid (a process that leaves its session, or is orphaned into the sandbox's
own init, is still a descendant of the process the controller started). Stopping goes top
down and repeats until a pass finds nothing new, so a process forked during the pass is
stopped too.

Not covered: work a worker already handed to the GPU before its reply (kernels run on
when their process is stopped); only the CPU side of a lingering worker is held.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Iterable, Iterator

PROC = "/proc"
PASSES = 4   # stop passes at most: each finds the processes forked during the one before


def children_map(proc: str = PROC) -> dict[int, list[int]]:
    """Every process's children, by parent pid, from /proc/<pid>/stat."""
    out: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:   # gone since the listing
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 2:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def descendants(roots: Iterable[int], kids: dict[int, list[int]]) -> list[int]:
    """`roots` and all their descendants, parents before children."""
    out, todo, seen = [], list(roots), set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def hold(roots: list[int], on: bool) -> list[int]:
    """Stop (`on`) or continue every process of the trees under `roots`; returns the pids
    signalled."""
    if not roots:
        return []
    if not on:
        pids = descendants(roots, children_map())
        for pid in pids:
            _signal(pid, signal.SIGCONT)
        return pids
    stopped: list[int] = []
    for _ in range(PASSES):
        new = [p for p in descendants(roots, children_map()) if p not in stopped]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped += new
    return stopped


def root_pid(worker) -> int | None:
    """The pid of the process the controller started for `worker`, if it still runs."""
    proc = getattr(worker, "proc", None)
    if proc is None or proc.poll() is not None:
        return None
    return proc.pid


@contextlib.contextmanager
def alone(workers: dict, timed: Iterable[str]) -> Iterator[None]:
    """Every worker of `workers` (label -> Worker) but the `timed` labels stopped for the
    duration; continued after, whatever happens inside."""
    timed = set(timed)
    roots = [pid for label, w in workers.items() if label not in timed
             for pid in [root_pid(w)] if pid is not None]
    hold(roots, True)
    try:
        yield
    finally:
        hold(roots, False)
