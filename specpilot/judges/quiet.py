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
stopped too. Each stopped process is pinned first (a pidfd, checked against the start time
the scan saw), and only the pinned ones are continued: a pid freed and reused by another
program between the scan and the signal is never stopped, nor left stopped.

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


def _stat(pid: int, proc: str = PROC) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, None where it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # pid (comm) state ppid ... starttime (field 22): comm may hold spaces and parentheses
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _started(pid: int) -> int | None:
    """A process's start time, None where it is gone."""
    st = _stat(pid)
    return None if st is None else st[1]


def processes(proc: str = PROC) -> dict[int, tuple[int, int]]:
    """Every process: pid -> (parent pid, start time)."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return {}
    out = {}
    for entry in entries:
        if entry.isdigit():
            st = _stat(int(entry), proc)
            if st is not None:   # else gone since the listing
                out[int(entry)] = st
    return out


def children_map(procs: dict[int, tuple[int, int]] | None = None) -> dict[int, list[int]]:
    """Every process's children, by parent pid."""
    out: dict[int, list[int]] = {}
    for pid, (ppid, _start) in (processes() if procs is None else procs).items():
        out.setdefault(ppid, []).append(pid)
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


class Held:
    """The processes one `stop` stopped, each pinned (a pidfd where the kernel has them):
    `release` continues exactly those, never a process that took a freed pid since (pids
    are reused: pid_max is 32768 on this CPU)."""

    def __init__(self) -> None:
        self.pinned: list[int] = []          # pidfds
        self.plain: list[tuple[int, int]] = []   # (pid, start time) without pidfd support

    def release(self) -> None:
        for fd in self.pinned:
            try:
                signal.pidfd_send_signal(fd, signal.SIGCONT)
            except OSError:   # gone since: nothing to continue; never stop halfway
                pass
            finally:
                os.close(fd)
        for pid, start in self.plain:
            if _started(pid) == start:
                _kill(pid, signal.SIGCONT)
        self.pinned, self.plain = [], []


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _stop_one(pid: int, start: int, held: Held) -> None:
    """Stop `pid` if it is still the process seen at `start`."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):   # no pidfds here: check, then signal by pid
        if _started(pid) == start:
            _kill(pid, signal.SIGSTOP)
            held.plain.append((pid, start))
        return
    if _started(pid) != start:   # the pid was reused before it was pinned
        os.close(fd)
        return
    try:
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
    except OSError:   # gone since it was pinned
        os.close(fd)
        return
    held.pinned.append(fd)


def stop(roots: list[int]) -> Held:
    """Stop every process of the trees under `roots`, top down, until a pass finds no new
    one (a process forked during a pass is found by the next)."""
    held, seen = Held(), set()
    for _ in range(PASSES if roots else 0):
        procs = processes()
        new = [p for p in descendants(roots, children_map(procs)) if p not in seen]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            if pid in procs:
                _stop_one(pid, procs[pid][1], held)
    return held


def root_pid(worker) -> int | None:
    """The pid of the process the controller started for `worker`, if it still runs."""
    proc = getattr(worker, "proc", None)
    if proc is None or proc.poll() is not None:
        return None
    return proc.pid


@contextlib.contextmanager
def alone(workers: dict, timed: Iterable[str]) -> Iterator[None]:
    """Every worker of `workers` (label -> Worker) but the `timed` labels stopped for the
    duration; exactly those processes continued after, whatever happens inside."""
    timed = set(timed)
    roots = [pid for label, w in workers.items() if label not in timed
             for pid in [root_pid(w)] if pid is not None]
    held = stop(roots)
    try:
        yield
    finally:
        held.release()
