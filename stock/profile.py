"""Profile by kernel category, with wall time per step.

Categories: target GEMM, attention, recurrent, drafter, prefill, other. A region inside a
drafter or prefill region counts toward that outer region only. Off by default: then
`region()` returns a shared no-op context and costs a function call. When on, regions
synchronise the device so each category's time is its own (this perturbs the timings it
measures; the overhead factor compares against unprofiled step times for that reason).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch

CATEGORIES = ("gemm", "attention", "recurrent", "drafter", "prefill", "other")
_OUTER = ("drafter", "prefill")
_NULL = nullcontext()


class Profiler:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.totals = {c: 0.0 for c in CATEGORIES}
        self.step_times: list[float] = []
        self._outer = 0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def _timed(self, category: str):
        outer = category in _OUTER
        if self._outer:
            yield
            return
        self._outer += outer
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.totals[category] += time.perf_counter() - t0
            self._outer -= outer

    def region(self, category: str):
        if category not in CATEGORIES:
            raise ValueError(f"unknown profile category {category!r}")
        return self._timed(category)

    @contextmanager
    def step(self):
        """Time one decode step (wall); time not in any category counts as 'other'."""
        self._sync()
        t0 = time.perf_counter()
        before = sum(self.totals.values())
        yield
        self._sync()
        dt = time.perf_counter() - t0
        self.step_times.append(dt)
        self.totals["other"] += max(0.0, dt - (sum(self.totals.values()) - before))

    def report(self) -> dict:
        steps = len(self.step_times)
        return {
            "steps": steps,
            "total_s": {c: round(v, 6) for c, v in self.totals.items()},
            "per_step_ms": {c: round(1e3 * v / max(steps, 1), 4) for c, v in self.totals.items()
                            if c != "prefill"},
            "mean_step_ms": round(1e3 * sum(self.step_times) / max(steps, 1), 4),
        }


_active: Profiler | None = None


def region(category: str):
    """A timing region if a profiler is active, else a shared no-op context."""
    return _NULL if _active is None else _active.region(category)


def profile_active() -> bool:
    return _active is not None


@contextmanager
def profiling(profiler: Profiler | None):
    """Make `profiler` the active one for the duration (None: leave profiling off)."""
    global _active
    previous, _active = _active, profiler
    try:
        yield profiler
    finally:
        _active = previous
