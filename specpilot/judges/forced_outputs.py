"""Throughput mode's output check: stock forced through every timed output that parts from
its reference (judges/outputs.py, `check_forced`, says why and what passes).

A worker of stock at defaults, from the same clean checkout as the references and started
after the candidates' rounds (so no candidate process is alive beside it), is forced
through each such output at the output's own prefix, in steps of the references' chunk;
outputs equal to the reference need nothing. One budget of near-ties per side for the
whole comparison, as the continuation check's.
"""

from __future__ import annotations

from typing import Callable

from specpilot.judges.eta import Eta
from specpilot.judges.outputs import Expected, OutputCheck, Tolerance, check_forced


def parted(names: list[str], replies: dict[str, dict[str, list[int]]],
           expected: dict[str, Expected]) -> int:
    """How many of the labels' replies part from their references."""
    return sum(1 for label in names for rid, got in replies[label].items()
               if got != expected[rid].tokens)


def force_outputs(stock, names: list[str], replies: dict[str, dict[str, list[int]]],
                  expected: dict[str, Expected], tol: Tolerance, budget: int,
                  chunk: int | None, checks: dict[str, OutputCheck] | None = None,
                  progress: Callable[[str], None] = lambda s: None) -> dict[str, OutputCheck]:
    """Each side's check (one per side, continuing `checks` of an earlier session of the
    run) of `replies` (label -> request id -> tokens) against `expected`; `stock`: a
    started worker of stock (anything with `call` and a `ready` dict naming its
    `stop_ids`), or None where no output parts from its reference (`parted`)."""
    checks = dict(checks or {})
    n = parted(names, replies, expected)
    if n and stock is None:
        raise ValueError(f"{n} outputs part from their references: forcing needs stock")
    stop_ids = frozenset(int(t) for t in stock.ready.get("stop_ids") or ()) if n else frozenset()
    forcible = sum(1 for label in names for rid, got in replies[label].items()
                   if got != expected[rid].tokens and 0 < len(got) <= expected[rid].max_new)
    eta = Eta("stock forced through an output", forcible, progress) if forcible else None
    for side in ("A", "B"):
        check = checks.get(side) or OutputCheck(side=side)
        for label in (lab for lab in names if lab.startswith(side)):
            for rid, got in replies[label].items():
                exp = expected[rid]
                argmax = margin = None
                if got != exp.tokens and got and len(got) <= exp.max_new:
                    rep = stock.call("force", f"force-{label}-{rid}", ids=exp.prompt_ids,
                                     forced=got, chunk=chunk)
                    argmax, margin = rep["argmax"], rep["margin"]
                    eta.done()
                elif got != exp.tokens:   # none, or more than asked: a fault unforced
                    argmax, margin = [], []
                check_forced(check, exp, got, argmax, margin, tol.epsilon, budget, stop_ids)
        checks[side] = check
    return checks
