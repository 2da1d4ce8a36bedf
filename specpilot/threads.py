"""torch's intra-op threads sized to the cores free now, and a word when timings are suspect.

Two CPU processes that each take every core (torch's default) slow each other down far
beyond their share: OpenMP threads spin-wait on cores the other process holds. So the
`specpilot` command decides the thread count once, before torch is imported, from the
cores this process may use (`os.sched_getaffinity`) less the tasks already running on
them (`/proc/loadavg`'s runnable count, sampled a few times), and exports it as
OMP_NUM_THREADS: torch in this process and in every worker it starts (confined workers get
OMP_NUM_THREADS passed through) then uses the same count, so both sides of a comparison
run under the same threads. OMP_NUM_THREADS or SPECPILOT_THREADS set by the user wins.

Where the load average describes more cores than ours (a container pinned to a subset of
the host's cores) it is not ours to read: all our cores are taken then.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

ENV = "SPECPILOT_THREADS"
NOISY_BAR = 0.25      # a controller bar (1% + k·σ) above this: no plausible gain gets over it
SPREAD_LIMIT = 1.5    # slowest over fastest repeat of one measurement: contended above this


@dataclass(frozen=True)
class Decision:
    threads: int
    cpus: int            # cores this process may run on
    others: float        # runnable tasks on the machine besides us (median of samples)
    load1: float         # the 1-minute load average
    source: str          # "user" (OMP_NUM_THREADS / SPECPILOT_THREADS), "free cores", "all cores"

    @property
    def busy(self) -> bool:
        return contended(self.cpus, self.others, self.load1)


def free_threads(cpus: int, others: float) -> int:
    """Threads for one compute-bound process: our cores less those other tasks hold, at
    least 1."""
    return max(1, min(cpus, cpus - int(round(others))))


def contended(cpus: int, others: float, load1: float) -> bool:
    """The machine is busy enough to distort a timing: other tasks hold a core, or the
    last minute's load was above the core count."""
    return others >= 1 or load1 > cpus


def spread(times: list[float]) -> float:
    """Slowest over fastest of repeated measurements of the same thing (1.0: identical)."""
    good = [t for t in times if t > 0]
    return max(good) / min(good) if len(good) >= 2 else 1.0


def noise_warning(sigma: float | None, threshold: float | None) -> str | None:
    """What to say when a controller's noise makes its verdict meaningless."""
    if sigma is None or threshold is None or threshold <= NOISY_BAR:
        return None
    return (f"warning: timing noise σ {sigma:.1%} puts the bar for adoption at "
            f"{threshold:.1%}: no plausible gain can pass it, so the verdict says nothing; "
            f"is the machine busy? (other processes; {ENV}=N sets torch's threads)")


def _runnable() -> tuple[int, float] | None:
    """(runnable tasks now, 1-minute load) from /proc/loadavg; None where unreadable."""
    try:
        fields = open("/proc/loadavg").read().split()
        return int(fields[3].split("/")[0]), float(fields[0])
    except (OSError, ValueError, IndexError):
        return None


def measure_load(samples: int = 3, gap_s: float = 0.005) -> tuple[float, float]:
    """(other runnable tasks, 1-minute load): the median of a few samples, less ourselves."""
    seen, load1 = [], 0.0
    for i in range(samples):
        got = _runnable()
        if got is None:
            return 0.0, 0.0
        seen.append(got[0] - 1)   # the reading process is running
        load1 = got[1]
        if i + 1 < samples:
            time.sleep(gap_s)
    return max(0.0, statistics.median(seen)), load1


def cpus_here() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def decide(environ=os.environ) -> Decision:
    cpus = cpus_here()
    for name in (ENV, "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            others, load1 = measure_load()
            return Decision(int(value), cpus, others, load1, "user")
    if (os.cpu_count() or cpus) != cpus:   # the load is the host's, over cores not ours
        return Decision(cpus, cpus, 0.0, 0.0, "all cores")
    others, load1 = measure_load()
    return Decision(free_threads(cpus, others), cpus, others, load1, "free cores")


_decided: Decision | None = None


def install(environ=os.environ) -> Decision:
    """Decide once (the `specpilot` command calls this before torch loads) and export it."""
    global _decided
    _decided = decide(environ)
    environ["OMP_NUM_THREADS"] = str(_decided.threads)
    return _decided


def busy_note() -> str | None:
    """One line for a command that times things, when the machine was busy at its start."""
    d = _decided
    if d is None or not d.busy:
        return None
    return (f"warning: {d.others:g} other runnable task(s) on {d.cpus} core(s) (1-minute load "
            f"{d.load1:.2f}): timings will be slower and noisier; torch uses {d.threads} "
            f"thread(s) ({'as you set' if d.source == 'user' else 'the cores free'}; "
            f"{ENV}=N to choose)")
