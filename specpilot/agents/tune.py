"""The `tune` backend: search values of a registered option with cheap evidence.

Successive halving over the direction's candidate values: every value gets one short timed
generation (one model load, in this process, with the project's own stock code at the
base's options), paired with a timing of the base's own value on the same request; the
better half gets another request; the best value wins. Its estimated gain is the
pre-screen evidence; the gates and the controller then judge it on clean checkouts.
"""

from __future__ import annotations

import math

from specpilot.agents.context import AgentContext, base_candidate
from specpilot.cycle.state import Candidate


def default_values(name: str, default, count: int) -> list[str]:
    if isinstance(default, bool):
        return [str(not default)]
    if isinstance(default, int):
        raw = [default // 2, default - max(1, default // 4), default + max(1, default // 2),
               default * 2, default + 1, default - 1]
        seen = []
        for v in raw:
            if v >= 1 and v != default and v not in seen:
                seen.append(v)
        return [str(v) for v in seen[:count]]
    return []


def _timer(ctx: AgentContext):
    """A function (options, request index) -> seconds for one short generation."""
    from specpilot.cycle.phase0 import Base

    base = Base(ctx.cfg.model.path)
    max_new = ctx.ex.prescreen_max_new

    def timed(options: dict, i: int) -> float:
        engine = base.engine_with(options)
        ids = base.prompts[i % len(base.prompts)][1]
        drafter = base.drafter(ctx.cfg.controller.drafter, engine)
        return engine.generate(ids, max_new, drafter).decode_s   # prefill is the same
    return timed


def produce(ctx: AgentContext) -> Candidate:
    name = ctx.direction.option
    values = list(ctx.direction.values)
    timed = _timer(ctx)
    base_opts = dict(ctx.base.options)
    scores: dict[str, list[float]] = {v: [] for v in values}
    base_times: list[float] = []
    alive = list(values)
    rounds = max(1, math.ceil(math.log2(max(len(values), 1))) + 1)
    for r in range(rounds):
        base_times.append(timed(base_opts, r))
        for v in alive:
            scores[v].append(math.log(base_times[r] / timed({**base_opts, name: v}, r)))
            ctx.progress(f"{name}={v}: gain {math.exp(sum(scores[v]) / len(scores[v])) - 1:+.1%}")
        alive = sorted(alive, key=lambda v: -sum(scores[v]) / len(scores[v]))
        alive = alive[: max(1, len(alive) // 2)]
        if len(alive) == 1 and r >= 1:
            break
    best = alive[0]
    gain = math.exp(sum(scores[best]) / len(scores[best])) - 1
    cand = base_candidate(ctx, {name: best}, f"tuned {name}={best} (est. {gain:+.1%})")
    cand.predicted_gain = gain
    return cand


def tuning_evidence(cand: Candidate) -> float | None:
    return cand.predicted_gain
