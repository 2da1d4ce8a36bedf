"""The timed path's outputs, checked against stock's greedy reference.

The controller times `generate()` in the candidate's worker; this module judges the very
tokens those timed runs returned, against stock's greedy output for the same prompt computed
by trusted code (a clean checkout of stock at defaults, in its own worker, before any
candidate runs). A candidate that verifies with fewer layers, stops early or trusts its
drafts changes those tokens, whatever its forcing gate said.

A divergence is tolerated only where the *reference's* margin (stock's top-1 minus top-2
logit at that position) is a near-tie (<= epsilon), and only `budget` times in one
comparison. After a tolerated divergence the check goes on through the same timed path: the
candidate generates again from the reference's prefix past the divergence (an ordinary
`run` request, indistinguishable from a timed one), and its output is checked from there;
the controller adds each continuation's time to the request's, so a candidate that serves
garbage after a near-tie saves nothing. Any other difference (another token where stock was sure, fewer tokens, tokens past stock's
end) is a fault, whatever the speed.
"""

from __future__ import annotations

from typing import Callable

from pydantic import BaseModel

SCHEMA_VERSION = 1


class Expected(BaseModel):
    """Stock's greedy output for one request, with its margin at every position."""
    request_id: str
    prompt_ids: list[int]
    max_new: int
    tokens: list[int]
    margins: list[float]
    stop_reason: str


class NearTie(BaseModel):
    request_id: str
    position: int          # index among the new tokens
    got: int
    expected: int
    margin: float          # the reference's top-1 minus top-2 logit there


class OutputCheck(BaseModel):
    """What the outputs of one side's timed runs showed."""
    schema_version: int = SCHEMA_VERSION
    side: str
    requests: int = 0
    tokens: int = 0                  # reference tokens covered
    near_ties: list[NearTie] = []
    restarts: int = 0                # continuations generated past a tolerated near-tie
    continuation_s: dict[str, float] = {}   # per request: the continuations' time
    faults: list[str] = []           # one line each; any fault rejects the side

    @property
    def ok(self) -> bool:
        return not self.faults


def first_difference(got: list[int], want: list[int]) -> int | None:
    """The first index where the two differ, or where one ends before the other."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def check_request(check: OutputCheck, exp: Expected, got: list[int],
                  rerun: Callable[[list[int], int], tuple[list[int] | None, float]],
                  epsilon: float,
                  budget: int) -> None:
    """Judge one timed output `got` against `exp`; `rerun(prompt_ids, max_new)` generates
    through the same worker to continue past a tolerated near-tie and returns the tokens
    (None: two runs of it disagreed) and the seconds charged for it. Updates `check`."""
    check.requests += 1
    check.tokens += len(exp.tokens)
    start, out = 0, list(got)
    while True:
        i = first_difference(out, exp.tokens[start:])
        if i is None:
            return
        at = start + i
        rid = exp.request_id
        if at >= len(exp.tokens):
            check.faults.append(f"{check.side} {rid}: {len(out) - i} token(s) past the end of "
                                f"stock's output ({len(exp.tokens)} tokens, {exp.stop_reason})")
            return
        if i >= len(out):
            check.faults.append(f"{check.side} {rid}: stops after {at} tokens; stock's output "
                                f"has {len(exp.tokens)}")
            return
        margin = exp.margins[at]
        if margin > epsilon:
            check.faults.append(f"{check.side} {rid}: token {at} is {out[i]}, stock's is "
                                f"{exp.tokens[at]} with margin {margin:.3f} > near-tie "
                                f"{epsilon:g}")
            return
        if len(check.near_ties) >= budget:
            check.faults.append(f"{check.side} {rid}: near-tie divergence at token {at} beyond "
                                f"the {budget} tolerated in one comparison")
            return
        check.near_ties.append(NearTie(request_id=rid, position=at, got=out[i],
                                       expected=exp.tokens[at], margin=margin))
        start = at + 1
        if start >= len(exp.tokens):
            return
        check.restarts += 1
        out, seconds = rerun(exp.prompt_ids + exp.tokens[:start], exp.max_new - start)
        check.continuation_s[rid] = check.continuation_s.get(rid, 0.0) + seconds
        if out is None:
            check.faults.append(f"{check.side} {rid}: two runs of its continuation from token "
                                f"{start} gave different tokens")
            return


def near_tie_budget(tokens: int, rate: float) -> int:
    """Tolerated near-tie divergences for `tokens` reference tokens: floor(rate · tokens),
    at least one (a single rounding flip in bf16 must not reject an honest system)."""
    return max(1, int(rate * tokens))
