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


def force_outputs(stock, names: list[str], replies: dict[str, dict[str, list[int]]],
                  expected: dict[str, Expected], tol: Tolerance, budget: int,
                  chunk: int | None, checks: dict[str, OutputCheck] | None = None,
                  progress: Callable[[str], None] = lambda s: None) -> dict[str, OutputCheck]:
    """Each side's check (one per side, continuing `checks` of an earlier session of the
    run) of `replies` (label -> request id -> tokens) against `expected`; `stock`: a
    started worker of stock (anything with `call` and a `ready` dict naming its
    `stop_ids`), or None where no reply needs forcing (`to_force`)."""
    checks = dict(checks or {})
    n = to_force(names, replies, expected)
    if n and stock is None:
        raise ValueError(f"{n} outputs part from their references: forcing needs stock")
    stop_ids = frozenset(int(t) for t in stock.ready.get("stop_ids") or ()) if n else frozenset()
    eta = Eta("stock forced through an output", n, progress) if n else None
    for side in dict.fromkeys(["A", "B"] + [lab[0] for lab in names]):   # A, B, C, ..
        check = checks.get(side) or OutputCheck(side=side)
        for label in (lab for lab in names if lab[0] == side):
            for rid, got in replies[label].items():
                exp = expected[rid]
                argmax = margin = None   # None: the reference itself, nothing to check
                if forcible(exp, got):
                    argmax, margin = forced_pass(stock, f"force-{label}-{rid}", exp, got, chunk)
                    eta.done()
                elif got != exp.tokens:   # none, or more than asked: a fault unforced
                    argmax, margin = [], []
                check_forced(check, exp, got, argmax, margin, tol.epsilon, budget, stop_ids)
        checks[side] = check
    return checks
