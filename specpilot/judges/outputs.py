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
`run` request, indistinguishable from a timed one), and its output is checked from there.
The request is charged, of each run, the share of its tokens that the check kept (up to and
including the divergent one): the timed run's share of its time plus the continuations',
so the time is always that of stock's text, and a candidate that steers a near-tie towards
text it serves faster, or serves garbage after one, saves nothing. Any other difference
(another token where stock was sure, fewer tokens, tokens past stock's end) is a fault,
whatever the speed.

The near-tie's width comes from stock itself where its arithmetic is coarse (`tolerance`):
in bf16 stock's own kernels move margins by a few units in the last place of the logits
when only the shape of a step changes (the reference's `noise` pass), and a candidate's
honest rewrite of a kernel moves them by as much; `noise_factor` times the largest such
move, and that factor times the share of positions whose argmax it flipped, widen epsilon
and the rate. Stock's reference worker measures it from a clean checkout before any
candidate runs: no candidate can widen it.

Throughput mode (a round is one batch, timed as a whole) checks by forcing instead
(`check_forced`): a batch's time cannot be split among its requests, and a continuation
run alone costs a single request's time, not a batch's share (on the H100 such charges were
80 % of one verdict's charged time). Stock, in a worker of its own, is forced through each
output that parts from its reference, at the output's own prefix: every token must be
stock's argmax there, or differ where stock's margin is a near-tie (within the same budget),
and an output that ends early must end on a stop token. Every token of the timed output is
then one stock would have given from its prefix (up to near-ties), so the batch is charged
its own time and nothing else; serving garbage after a near-tie is a fault.
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
    noise: list[float] = []        # per position: how far stock's own step shapes moved the margin
    noise_flips: list[int] = []    # positions whose argmax that alone flipped


class Tolerance(BaseModel):
    """The near-tie in force for one comparison: configured, or widened by stock's noise."""
    epsilon: float
    rate: float
    noise_max: float = 0.0         # largest margin move of stock's own (0: not measured)
    noise_flip_rate: float = 0.0   # stock's own flips per position
    widened: bool = False

    def describe(self) -> str:
        why = (f" (stock's own noise: margins moved up to {self.noise_max:.3f}, "
               f"{self.noise_flip_rate:.1%} of argmaxes flipped)" if self.widened else "")
        return f"near-tie epsilon {self.epsilon:.3g}, rate {self.rate:.3g}{why}"


def tolerance(refs, epsilon: float, rate: float, factor: float) -> Tolerance:
    """The near-tie for references `refs` (each with `noise` and `noise_flips`, as
    `Expected`): the configured
    epsilon and rate, each widened to `factor` times stock's own noise where that is larger."""
    noise = [x for r in refs for x in (r.noise or [])]
    positions = sum(len(r.noise or []) for r in refs)
    if not noise or factor <= 0:
        return Tolerance(epsilon=epsilon, rate=rate)
    top, flips = max(noise), sum(len(r.noise_flips) for r in refs) / positions
    eps, rt = max(epsilon, factor * top), min(1.0, max(rate, factor * flips))
    return Tolerance(epsilon=eps, rate=rt, noise_max=top, noise_flip_rate=flips,
                     widened=eps > epsilon or rt > rate)


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
    forced: int = 0                  # outputs checked by forcing stock through them
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
                  budget: int) -> tuple[float, float]:
    """Judge one timed output `got` against `exp`; `rerun(prompt_ids, max_new)` generates
    through the same worker to continue past a tolerated near-tie and returns the tokens
    (None: two runs of it disagreed) and its seconds. Updates `check`; returns what to charge
    the request: (the share of the timed run's time, the continuations' seconds)."""
    check.requests += 1
    check.tokens += len(exp.tokens)
    rid = exp.request_id
    start, out, seconds = 0, list(got), None   # seconds None: the timed run itself
    share, extra = 1.0, 0.0

    def charge(kept: float) -> None:
        nonlocal share, extra
        if seconds is None:
            share = kept
        else:
            extra += seconds * kept
            check.continuation_s[rid] = check.continuation_s.get(rid, 0.0) + seconds * kept

    while True:
        i = first_difference(out, exp.tokens[start:])
        if i is None:
            charge(1.0)
            return share, extra
        at = start + i
        if at >= len(exp.tokens):
            check.faults.append(f"{check.side} {rid}: {len(out) - i} token(s) past the end of "
                                f"stock's output ({len(exp.tokens)} tokens, {exp.stop_reason})")
            return share, extra
        if i >= len(out):
            check.faults.append(f"{check.side} {rid}: stops after {at} tokens; stock's output "
                                f"has {len(exp.tokens)}")
            return share, extra
        margin = exp.margins[at]
        if margin > epsilon:
            check.faults.append(f"{check.side} {rid}: token {at} is {out[i]}, stock's is "
                                f"{exp.tokens[at]} with margin {margin:.3f} > near-tie "
                                f"{epsilon:g}")
            return share, extra
        if len(check.near_ties) >= budget:
            check.faults.append(f"{check.side} {rid}: near-tie divergence at token {at} beyond "
                                f"the {budget} tolerated in one comparison")
            return share, extra
        check.near_ties.append(NearTie(request_id=rid, position=at, got=out[i],
                                       expected=exp.tokens[at], margin=margin))
        charge((i + 1) / len(out))   # its tokens up to the divergent one were stock's text
        start = at + 1
        if start >= len(exp.tokens):
            return share, extra
        check.restarts += 1
        out, seconds = rerun(exp.prompt_ids + exp.tokens[:start], exp.max_new - start)
        if out is None:
            check.faults.append(f"{check.side} {rid}: two runs of its continuation from token "
                                f"{start} gave different tokens")
            return share, extra


def check_forced(check: OutputCheck, exp: Expected, got: list[int], argmax: list[int] | None,
                 margin: list[float] | None, epsilon: float, budget: int,
                 stop_ids: set[int] | frozenset[int]) -> None:
    """Judge one timed output `got` by stock forced through it (throughput mode): `argmax`
    and `margin` are stock's choice and top-1 minus top-2 logit at each of got's positions,
    given the prompt and got's tokens before it (None where got is stock's reference
    output itself: nothing to force). Updates `check`: a token other than stock's argmax is
    a near-tie where stock's margin there is at most `epsilon` (while fewer than `budget`
    were met in the comparison), else a fault; so is an output longer than asked, or one
    that ends early on anything but a stop token (unless stock's own output was cut by the
    context)."""
    check.requests += 1
    check.tokens += len(exp.tokens)
    rid = exp.request_id
    if argmax is None:
        if got != exp.tokens:
            raise ValueError(f"{rid}: an output that parts from the reference needs forcing")
        return
    check.forced += 1
    if len(got) > exp.max_new:   # (not forced: it could pass the context)
        check.faults.append(f"{check.side} {rid}: {len(got)} tokens, {exp.max_new} asked")
        return
    if len(argmax) != len(got) or len(margin or []) != len(got):
        check.faults.append(f"{check.side} {rid}: stock's forced pass covered "
                            f"{len(argmax)} of {len(got)} tokens")
        return
    cut = exp.stop_reason == "context"   # stock itself was cut by the context: no stop owed
    if len(got) < exp.max_new and (not got or got[-1] not in stop_ids) and not cut:
        check.faults.append(f"{check.side} {rid}: stops after {len(got)} tokens without a "
                            f"stop token ({exp.max_new} asked)")
        return
    early = next((i for i, t in enumerate(got[:-1]) if t in stop_ids), None)
    if early is not None:
        check.faults.append(f"{check.side} {rid}: goes on past the stop token at {early}")
        return
    for at, (mine, theirs, m) in enumerate(zip(got, argmax, margin)):
        if mine == theirs:
            continue
        if m > epsilon:
            check.faults.append(f"{check.side} {rid}: token {at} is {mine}, stock's argmax "
                                f"after the same tokens is {theirs} with margin {m:.3f} > "
                                f"near-tie {epsilon:g}")
            return
        if len(check.near_ties) >= budget:
            check.faults.append(f"{check.side} {rid}: near-tie divergence at token {at} beyond "
                                f"the {budget} tolerated in one comparison")
            return
        check.near_ties.append(NearTie(request_id=rid, position=at, got=mine,
                                       expected=theirs, margin=m))


def near_tie_budget(tokens: int, rate: float) -> int:
    """Tolerated near-tie divergences for `tokens` reference tokens: floor(rate · tokens),
    at least one (a single rounding flip in bf16 must not reject an honest system)."""
    return max(1, int(rate * tokens))
