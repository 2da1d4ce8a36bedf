"""Progress of long judge work, with the time left: stock's references, a gate's requests,
a comparison's rounds. A unit of work (a request, a round) takes about as long as the last
few did, so the time left is their mean times the units left; before the first unit ends
there is no estimate, and the line says what is starting. Where the first unit carries a
start-up (`startup`: a worker's first CUDA graphs and compiles, 38 s for the first of 256
references on the H100 and then about 0.3 s each, 2026-12-06), its line says how long it
took and the estimates leave it out."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


def span(seconds: float) -> str:
    """A duration for a progress line: 8 s, 3.5 min, 1.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Eta:
    """`total` units of `what`; `done()` after each reports "what i/N (about S left)"."""

    WINDOW = 5   # the units the estimate averages over (the latest ones)

    def __init__(self, what: str, total: int, progress: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, startup: bool = False):
        self.what, self.total, self.progress, self.clock = what, max(0, total), progress, clock
        self.startup = startup
        self.count = 0
        self.times: list[float] = []
        self.last = clock()
        if self.total:
            progress(f"{what} 1/{self.total}")

    def done(self) -> None:
        now = self.clock()
        self.times.append(now - self.last)
        self.last = now
        self.count += 1
        left = self.total - self.count
        if left <= 0:
            return
        if self.startup and self.count == 1:   # no rate to extrapolate from yet
            self.progress(f"{self.what} 2/{self.total} (the first took {span(self.times[0])})")
            return
        recent = self.times[1 if self.startup else 0:][-self.WINDOW:]
        eta = sum(recent) / len(recent) * left
        self.progress(f"{self.what} {self.count + 1}/{self.total} (about {span(eta)} left)")


class Clock:
    """Where a run's wall time went, phase by phase: `with clock.phase(name):` adds the
    seconds spent inside to `name` (from any thread; phases may overlap, each keeps its own
    wall time); `line()` says them in the order they first began, and the whole."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock, self.t0 = clock, clock()
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._lock:
            self.seconds.setdefault(name, 0.0)
        t = self.clock()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] += self.clock() - t

    def total(self) -> float:
        return self.clock() - self.t0

    def line(self) -> str:
        parts = ", ".join(f"{name} {span(sec)}" for name, sec in self.seconds.items())
        return f"the run's clock: {parts}; {span(self.total())} in all"
