"""The `tune` backend: search values of registered options with cheap evidence.

Successive halving over candidate configurations (option values): every configuration gets
one short timed generation, paired with a timing of the base's own options on the same
request; the better half gets another request; the best configuration wins. The timings
come from the judges' worker on a clean checkout of the system being tuned (its "timed"
command, through `cycle/judges.tune_options`; the search itself, cycle/search.halving, runs
in the judges' process), so a system with code changes (Phase 3 tunes the integrated one) is
timed with its own code. The estimated gain is the pre-screen evidence; the gates and the
controller then judge it on clean checkouts.
"""

from __future__ import annotations

from specpilot.agents.context import AgentContext, base_candidate
from specpilot.cycle import judges
from specpilot.cycle.devices import slot_device
from specpilot.cycle.search import _label
from specpilot.cycle.types import Candidate


def produce(ctx: AgentContext) -> Candidate:
    name = ctx.direction.option
    configs = [{name: v} for v in ctx.direction.values]
    res = judges.tune_options(ctx.root, ctx.cfg, ctx.base, configs, ctx.ex.prescreen_max_new,
                              ctx.log_dir, slot_device(ctx.device_env)
                              if "CUDA_VISIBLE_DEVICES" in ctx.device_env else None)
    for s in res["scores"]:
        ctx.progress(f"{_label(s['config'])}: gain {s['gain']:+.1%} ({s['requests']} requests)")
    best, gain = res["config"][name], res["gain"]
    cand = base_candidate(ctx, {name: best}, f"tuned {name}={best} (est. {gain:+.1%})")
    cand.predicted_gain = gain
    return cand


def tuning_evidence(cand: Candidate) -> float | None:
    return cand.predicted_gain
