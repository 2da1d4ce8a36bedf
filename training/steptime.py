"""Where a training step's time goes (--time-steps N): the phases of N steps, synchronised.

A step of training/loop.py is: the target's hidden states of the step's sequences (with
--features live a target forward; cached, a gather), the drafter's forward over every anchor's
block, the target's head and the weighted loss, the backward pass, and the optimizer (the
gradients' all-reduce across ranks, clipping, AdamW). `StepTimer` times those phases on
steps [skip, skip + N) with a device synchronisation at each boundary (so they add up to the
step) and keeps every step's wall time, synchronised or not, to compare: the loop reads the
loss each step, so a step's wall time is its own on either side. Off (N = 0) it costs one
comparison a phase.
"""

from __future__ import annotations

import statistics
import time

import torch

PHASES = ("features", "drafter forward", "head + loss", "backward", "optimizer")


class StepTimer:
    def __init__(self, device: torch.device, steps: int, skip: int = 5):
        self.device, self.steps, self.skip = device, steps, skip
        self.on = False
        self._t = 0.0
        self._cur: dict[str, float] = {}
        self.timed: list[dict[str, float]] = []   # the synchronised steps' phases, seconds
        self.walls: list[tuple[bool, float]] = []   # (synchronised, wall seconds) a step
        self._step_t = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self, step: int) -> None:
        """At a step's start: time its phases if it is one of the N."""
        self.on = self.steps > 0 and self.skip <= step < self.skip + self.steps
        if self.on:
            self._sync()
            self._cur = {}
        self._t = self._step_t = time.perf_counter()

    def mark(self, phase: str) -> None:
        """The end of `phase` (one of PHASES) in a timed step."""
        if not self.on:
            return
        self._sync()
        now = time.perf_counter()
        self._cur[phase] = self._cur.get(phase, 0.0) + now - self._t
        self._t = now

    def end(self) -> None:
        """At a step's end, after its host read of the loss."""
        if self.steps <= 0:
            return
        self.walls.append((self.on, time.perf_counter() - self._step_t))
        if self.on:
            self.timed.append(self._cur)
            self.on = False

    def summary(self) -> dict:
        """Median ms a phase over the timed steps, their sum, and the median wall ms of the
        steps after them (unsynchronised); {} when none was timed."""
        if not self.timed:
            return {}
        ms = {p: round(1e3 * statistics.median(d.get(p, 0.0) for d in self.timed), 2)
              for p in PHASES}
        free = [w for on, w in self.walls[self.skip + len(self.timed):] if not on]
        return {"steps": len(self.timed), "phases_ms": ms,
                "sum_ms": round(sum(ms.values()), 2),
                "unsynchronised_step_ms": round(1e3 * statistics.median(free), 2) if free else None}

    def line(self) -> str:
        s = self.summary()
        if not s:
            return ""
        parts = ", ".join(f"{p} {v:.1f}" for p, v in s["phases_ms"].items())
        free = s["unsynchronised_step_ms"]
        return (f"step time, median of {s['steps']} synchronised steps: {parts}; sum "
                f"{s['sum_ms']:.1f} ms" + (f" (steps after them, unsynchronised: {free:.1f} ms)"
                                            if free is not None else ""))
