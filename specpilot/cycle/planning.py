"""Pick the planner (offline, or Claude when a client is available) and run it."""

from __future__ import annotations

import json

from specpilot.agents.planner import anthropic_plan, offline_plan, with_backend
from specpilot.cycle.context import CycleContext
from specpilot.cycle.state import list_runs
from specpilot.errors import SpecPilotError
from specpilot.memory.store import Memory


def memory_metas(root) -> list:
    """The entries a planner may reuse: all but those a cycle recorded and has not validated
    (provisional) or whose validation failed (rejected)."""
    memory = Memory(root)
    metas = {e.id: e.meta for e in memory.file_entries().values()}
    metas.update({e.id: e.meta for e in memory.ref_entries().values()})
    return [metas[k] for k in sorted(metas) if metas[k].reusable]


def past_cycles(root, current: str) -> list[dict]:
    return [{"run": r.run_id, "directions": [(d.direction.id, d.status, d.gain)
                                             for d in r.directions]}
            for r in list_runs(root) if r.run_id != current][-5:]


def coding_backend(ex, client) -> str | None:
    """Who writes code changes this cycle ([explore] backend): the command backend (the
    user's own coding agent, `agent_command`), Claude, or nobody (reuse and tuning only)."""
    if ex.backend == "command":
        return "command"
    if ex.backend == "anthropic":
        if client is None:
            raise SpecPilotError('[explore] backend = "anthropic" needs ANTHROPIC_API_KEY',
                                 code=2)
        return "anthropic"
    if ex.backend == "auto" and client is not None:
        return "anthropic"
    return None


def plan(ctx: CycleContext) -> list:
    ex, state = ctx.ex, ctx.state
    state.load = f"batched, C = {ex.batch}" if ex.batch else "single requests"
    metas = memory_metas(ctx.root)
    coding = coding_backend(ex, ctx.client)
    state.backend = {"command": f"command: {' '.join(ex.agent_command)}",
                     "anthropic": f"anthropic ({ex.model})"}.get(
        coding, "none (reuse and tuning only)")
    offline = lambda: offline_plan(state.analysis, metas, ctx.cfg.controller.drafter,  # noqa
                                   ex.max_directions, ex.tune_values, coding,
                                   load="batched" if ex.batch else "single")
    use_claude = ex.planner == "anthropic" or (ex.planner == "auto" and ctx.client)
    if not use_claude or ctx.client is None:
        state.planner = "offline" + (" (no API key)" if ex.planner != "offline" else "")
        return offline()
    path = ctx.runs.transcript("planner")
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(event: dict) -> None:
        with open(path, "a") as fh:
            fh.write(json.dumps({"schema_version": 1, **event}) + "\n")
    dirs, how = anthropic_plan(ctx.client, ex.model, state.analysis, metas,
                               past_cycles(ctx.root, state.run_id), ex.max_directions, log)
    state.planner = how
    if dirs is None:
        state.notes.append(how)
        return offline()
    dirs, dropped = with_backend(dirs, coding)
    if dropped:
        state.notes.append(f"no coding backend ([explore] backend = {ex.backend!r}): "
                           f"dropped {', '.join(dropped)}")
    return dirs
