"""The controller's design: what a run measures (`Job`: the rounds' requests, budget,
drafters, devices, processes, throughput mode, the sides A, B, C, ..), its workers' labels,
where each lives and in which order they are timed (specpilot/judges/controller.py runs it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from specpilot.errors import SpecPilotError
from specpilot.judges.prompts import Req

MAX_CANDIDATES = 7   # sides B..H beside A in one run


@dataclass
class Job:
    """What to measure: the requests of every round (warm-up rounds first; ids filled in
    by stock's tokenizer before any candidate runs), budget, drafter, devices."""
    round_requests: list[list[Req]]
    max_new: int
    drafter: str
    devices: list[str]
    rounds: int
    warmup_rounds: int
    model: str
    max_context: int | None = None
    drafter_b: str | None = None   # B's drafter when not A's (e.g. block against ngram)
    processes: int = 2             # workers per side (1: the pre-screen only)
    session: tuple[int, ...] | None = None   # the process indices alive now (None: all)
    batch: int = 0                 # throughput mode: a round served as one batch of at most
                                   # `batch` at once (0: request by request)
    rate: float = 0.0              # throughput mode's arrivals: Poisson at this many requests
                                   # a second (0: all at the round's start)
    sides: str = "AB"              # A, then one letter a candidate (B, C, ...: several judged
                                   # against one stock reference and one A side)

    def arrivals(self, reqs: list[Req]) -> list[float] | None:
        """A round's arrival offsets (seconds from its start; None: all at once): Poisson at
        `rate`, the first at 0, drawn from the round's own request ids, so both sides get
        the same trace and no one knows it before the round's fresh prompts are drawn."""
        if not self.rate:
            return None
        rng = random.Random(",".join(rid for rid, _p, _ids in reqs))
        at, out = 0.0, []
        for i in range(len(reqs)):
            at += rng.expovariate(self.rate) if i else 0.0
            out.append(round(at, 6))
        return out

    @property
    def indices(self) -> list[int]:
        return list(self.session) if self.session is not None else list(range(self.processes))

    @property
    def names(self) -> list[str]:
        """The labels of the workers alive in this session, interleaved: A0 B0 A1 B1 .. (with
        several candidates A0 B0 C0 A1 B1 C1 ..)."""
        return [f"{side}{i}" for i in self.indices for side in self.sides]

    def drafter_of(self, label: str) -> str:
        """A's drafter, or the candidates' (`drafter_b`) for any other side."""
        return self.drafter_b if label[0] != "A" and self.drafter_b else self.drafter

    @property
    def measured(self) -> list[Req]:
        return [r for row in self.round_requests[self.warmup_rounds:] for r in row]


def labels(processes: int, sides: str = "AB") -> list[str]:
    """A run's worker labels, interleaved: A0 B0 A1 B1 .. A{P-1} B{P-1} (one letter a side)."""
    return [f"{side}{i}" for i in range(processes) for side in sides]


def candidate_sides(n: int) -> str:
    """The side letters of a run of `n` candidates: "AB" for one, "ABC" for two, ..."""
    if not 1 <= n <= MAX_CANDIDATES:
        raise SpecPilotError(f"one run judges 1 to {MAX_CANDIDATES} candidates, got {n}",
                             code=2)
    return "A" + "BCDEFGH"[:n]


def device_of(label: str, devices: list[str]) -> str:
    """The one device a worker lives on: all on the first with one device; with two, A_i
    on device i mod 2 and B_i on the other, so each device hosts half of each side."""
    if len(devices) == 1:
        return devices[0]
    i = int(label[1:])
    return devices[(i + (label[0] != "A")) % 2]


def round_order(items: list, m: int) -> list:
    """Round m's order: `items` rotated left by m (each one leads once every len rounds)."""
    k = m % len(items)
    return items[k:] + items[:k]
