"""One direction through the judges: candidate -> pre-screen -> gates -> controller ->
plausibility (the gain against the cost model's ceiling) -> entry.

Each step saves the run record before the next begins; on resume a direction restarts at
its first unfinished step (a candidate commit, once made, is kept and never re-produced).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path

from specpilot.agents import claude, command, reuse, tune
from specpilot.cycle import judges
from specpilot.cycle.context import CycleContext
from specpilot.cycle.devices import slot_device
from specpilot.cycle.state import DirectionState, StepTime
from specpilot.cycle.types import System
from specpilot.errors import SpecPilotError


def backend_for(name: str):
    if name == "reuse":
        return reuse.produce
    if name == "tune":
        return tune.produce
    if name == "anthropic":
        return claude.produce
    if name == "command":
        return command.produce
    raise SpecPilotError(f"unknown sub-agent backend {name!r}")


def run_direction(ctx: CycleContext, ds: DirectionState, device_env: dict) -> None:
    """Drive `ds` to a final status; every exception becomes status 'error' with a reason."""
    ds.attempts += 1
    ds.status = "running"
    ds.started = ds.started or time.time()
    ds.device = slot_device(device_env)
    ctx.save()
    try:
        _steps(ctx, ds, device_env)
    except Exception as exc:  # one direction's failure never stops the cycle
        ds.status = "error"
        ds.reasons.append(f"{type(exc).__name__}: {exc}")
        (ctx.runs.log_dir(ds.direction.id) / "error.txt").write_text(traceback.format_exc())
    ds.finished = time.time()
    ctx.save()
    ctx.progress(ds.direction.id, f"{ds.status}: {'; '.join(ds.reasons[-1:])}")


def _steps(ctx: CycleContext, ds: DirectionState, device_env: dict) -> None:
    d = ds.direction
    ex, cfg, root = ctx.ex, ctx.cfg, ctx.root
    base = ds.base or ctx.state.base
    log_dir = ctx.runs.log_dir(d.id)
    say = lambda msg: ctx.progress(d.id, msg)  # noqa: E731
    device = ds.device or "cpu"
    if ds.step == "start":
        agent_ctx = ctx.agent_context(ds, device_env)
        say(f"{d.backend}: producing a candidate")
        with timed(ds, "candidate"):
            ds.candidate = backend_for(d.backend)(agent_ctx)
        ds.step = "candidate"
        ctx.save()
    cand = ds.candidate
    cand_sys = System(commit=cand.commit, options=cand.options)
    if ds.step == "candidate":
        if not cand.code_changed and cand_sys == base:
            ds.status, ds.step = "prescreen-rejected", "prescreen"
            ds.reasons.append("candidate is the base system itself")
            return
        if d.backend == "tune" and not ex.batch:   # the tuner's search is its pre-screen
            # (single requests: on a batched load its pick is pre-screened batched below)
            gain = cand.predicted_gain or 0.0
            ds.prescreen = {"gain": gain, "source": "tuner (successive halving)"}
        else:
            say(f"pre-screen: one short paired round on {device}")
            with timed(ds, "prescreen"):
                ds.prescreen = judges.prescreen(root, cfg, base, cand_sys,
                                                ex.prescreen_requests, ex.prescreen_max_new,
                                                log_dir / "prescreen", device,
                                                ctx.stock_commit())
            gain = ds.prescreen["gain"]
        ds.step = "prescreen"
        if ds.prescreen.get("faults"):
            ds.status = "prescreen-rejected"
            ds.reasons.append("pre-screen: outputs differ from stock's: "
                              + "; ".join(ds.prescreen["faults"][:3]))
            return
        if gain < ex.prescreen_min_gain:
            ds.status = "prescreen-rejected"
            ds.gain = gain
            ds.reasons.append(f"pre-screen gain {gain:+.1%} < {ex.prescreen_min_gain:.0%}")
            return
        ctx.save()
    if ds.step == "prescreen":
        if ds.status == "prescreen-rejected":
            return
        say("gates: option-default and dev token forcing")
        with timed(ds, "references"):   # shared by all directions, computed once
            refs = ctx.references("dev", device)
        with timed(ds, "gates"):
            ds.gates = judges.run_gates(root, cfg, ctx.gates_cfg, cand.commit, cand.options,
                                        refs, "dev", cand.code_changed, log_dir, device)
        ok, reasons = judges.gates_passed(ds.gates)
        ds.step = "gates"
        if not ok:
            ds.status = "gate-failed"
            ds.reasons += reasons or ["gates did not pass"]
            return
        ctx.save()
    if ds.step == "gates":
        if ds.status == "gate-failed":
            return
        say(f"controller: paired A/B on clean checkouts, on {device}")
        with timed(ds, "controller"):
            ds.verdict = judges.compare(root, cfg, base, cand_sys,
                                        ex.controller_rounds, ex.controller_requests,
                                        ex.controller_max_new,
                                        progress=lambda m: say(f"controller: {m}"),
                                        devices=[device],
                                        family=max(1, len(ctx.state.directions)))
        ds.gain, ds.lower_bound = ds.verdict["gain"], ds.verdict["lower_bound"]
        ds.step = "controller"
        if ds.verdict.get("faults"):
            ds.status = "rejected"
            ds.reasons.append("controller: timed outputs differ from stock's: "
                              + "; ".join(ds.verdict["faults"][:3]))
            return
        if not ds.verdict["adopted"]:
            ds.status = "rejected"
            ds.reasons.append(f"controller: {ds.verdict['verdict']} (gain {ds.gain:+.1%}, "
                              f"lower bound {ds.lower_bound:+.1%} <= threshold "
                              f"{ds.verdict['threshold']:.1%})")
            return
        why = judges.implausible(ds.verdict, ctx.analysis_of(base), ex.plausible_margin)
        if why:   # more than the cost model allows: a measurement fault, never adopted
            ds.status = "implausible"
            ds.reasons.append(why)
            return
        ctx.save()
    if ds.step == "controller":
        if ds.status in ("rejected", "implausible"):
            return
        if cand.code_changed:
            ds.entry = ctx.record_entry(ds)
            ds.reasons.append(f"adopted; memory entry {ds.entry}")
        else:
            ds.reasons.append(f"adopted; options {cand.options} (no code change, no entry)")
        ds.status = "adopted"
        ds.step = "recorded"


@contextlib.contextmanager
def timed(ds: DirectionState, step: str):
    """Record when a step of the direction ran (wall clock), even when it raises."""
    t0 = time.time()
    try:
        yield
    finally:
        ds.timeline.append(StepTime(step=step, start=t0, end=time.time()))


def worktree_name(run_id: str, direction_id: str) -> str:
    return f"{run_id.removeprefix('run-')}-{direction_id}"[:64]


def transcript_path(runs, direction_id: str) -> Path:
    return runs.transcript(direction_id)
