"""Throughput mode's output check: stock forced through every timed output that parts from
its reference (judges/outputs.py, `check_forced`, says why and what passes).

A worker of stock at defaults, from the same clean checkout as the references and started
after the candidates' rounds (so no candidate process is alive beside it), is forced
through each such output at the output's own prefix, in steps of the references' chunk;
outputs equal to the reference need nothing. One budget of near-ties per side for the
whole comparison, as the continuation check's.
"""

from __future__ import annotations

import threading
from typing import Callable

from specpilot.judges.eta import Eta
from specpilot.judges.outputs import Expected, OutputCheck, Tolerance, check_forced
from specpilot.judges.worker_proc import deal


def forcible(exp: Expected, got: list[int]) -> bool:
    """Whether `got` needs stock forced through it: it parts from the reference, has tokens
    and no more than were asked (longer or empty is a fault without forcing; forcing a
    longer one could pass the context)."""
    return got != exp.tokens and 0 < len(got) <= exp.max_new


def forced_pass(stock, tag: str, exp: Expected, got: list[int],
                chunk: int | None) -> tuple[list[int], list[float]]:
    """Stock's argmax and top-1 minus top-2 margin at each of got's positions, given the
    prompt and got's earlier tokens (its worker's `force`, in steps of `chunk`)."""
    rep = stock.call("force", tag, ids=exp.prompt_ids, forced=got, chunk=chunk)
    return rep["argmax"], rep["margin"]


def to_force(names: list[str], replies: dict[str, dict[str, list[int]]],
             expected: dict[str, Expected]) -> int:
    """How many of the labels' replies need forcing (`forcible`)."""
    return sum(1 for label in names for rid, got in replies[label].items()
               if forcible(expected[rid], got))


def forced_passes(stocks: list, jobs: list[tuple[str, Expected, list[int]]],
                  chunk: int | None, progress: Callable[[str], None] = lambda s: None
                  ) -> dict[str, tuple[list[int], list[float]]]:
    """Each job's (tag, reference, output) forced pass (`forced_pass`), dealt out among the
    started stock workers `stocks` (worker k takes jobs k, k + n, ..., each in a thread of
    its own: the passes are independent and a small target's are host-bound), by tag."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    if not jobs:
        return out
    eta = Eta("stock forced through an output", len(jobs), progress, startup=True)
    lock = threading.Lock()

    def one(stock, job: tuple[str, Expected, list[int]]) -> None:
        tag, exp, got = job
        res = forced_pass(stock, tag, exp, got, chunk)
        with lock:
            out[tag] = res
            eta.done()

    deal(stocks, jobs, one)
    return out


def force_outputs(stocks, names: list[str], replies: dict[str, dict[str, list[int]]],
                  expected: dict[str, Expected], tol: Tolerance, budget: int,
                  chunk: int | None, checks: dict[str, OutputCheck] | None = None,
                  progress: Callable[[str], None] = lambda s: None) -> dict[str, OutputCheck]:
    """Each side's check (one per side, continuing `checks` of an earlier session of the
    run) of `replies` (label -> request id -> tokens) against `expected`; `stocks`: started
    workers of stock the passes are dealt among (anything with `call` and a `ready` dict
    naming its `stop_ids`), or None where no reply needs forcing (`to_force`)."""
    checks = dict(checks or {})
    jobs = [(f"force-{label}-{rid}", expected[rid], got) for label in names
            for rid, got in replies[label].items() if forcible(expected[rid], got)]
    if jobs and not stocks:
        raise ValueError(f"{len(jobs)} outputs part from their references: forcing needs stock")
    stop_ids = (frozenset(int(t) for t in stocks[0].ready.get("stop_ids") or ()) if jobs
                else frozenset())
    passes = forced_passes(stocks, jobs, chunk, progress)
    for side in dict.fromkeys(["A", "B"] + [lab[0] for lab in names]):   # A, B, C, ..
        check = checks.get(side) or OutputCheck(side=side)
        for label in (lab for lab in names if lab[0] == side):
            for rid, got in replies[label].items():
                exp = expected[rid]
                argmax = margin = None   # None: the reference itself, nothing to check
                if forcible(exp, got):
                    argmax, margin = passes[f"force-{label}-{rid}"]
                elif got != exp.tokens:   # none, or more than asked: a fault unforced
                    argmax, margin = [], []
                check_forced(check, exp, got, argmax, margin, tol.epsilon, budget, stop_ids)
        checks[side] = check
    return checks
