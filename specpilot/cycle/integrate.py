"""Phase 2 (integrate adopted directions) and Phase 3 (kernel tuning).

Integration stacks the adopted candidates onto the base in order of measured gain: code
changes by 3-way apply in an integration worktree (a conflict drops the later entry with a
reason; no integration agent runs offline), options by union (a clash drops the later one).
One adopted candidate is its own stack (its controller verdict stands); two or more are
measured together by the controller and kept only if adopted, then recorded as an entry
whose dependencies are the stacked entries.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from specpilot import worktrees
from specpilot.cycle import judges
from specpilot.cycle.state import System
from specpilot.gitstore import GitStore


def integrate(cycle) -> None:
    state = cycle.state
    adopted = sorted([d for d in state.directions if d.status == "adopted"],
                     key=lambda d: -(d.gain or 0))
    rec: dict = {"order": [d.direction.id for d in adopted], "dropped": [], "stack": None}
    state.integration = rec
    if not adopted:
        rec["result"] = "nothing adopted; the best system stays the base"
        state.best = state.base
        return
    if len(adopted) == 1:
        c = adopted[0].candidate
        state.best = System(commit=c.commit, options=c.options)
        rec.update(stack=[adopted[0].direction.id], result="one adopted direction; its "
                   "controller verdict stands", verdict=adopted[0].verdict)
        return
    name = f"{state.run_id.removeprefix('run-')}-integrate"[:64]
    existing = [w for w in worktrees.list_all(cycle.store) if w.name == name]
    if existing:
        worktrees.remove(cycle.store, name, force=True)
        cycle.store.call("branch", "-D", worktrees.BRANCH_PREFIX + name)
    wt = Path(worktrees.new(cycle.store, name, state.base.commit).path)
    g = GitStore(wt)
    options = dict(state.base.options)
    changed: dict[str, str] = {}      # option values the stack sets away from the base
    stacked = []
    for d in adopted:
        c = d.candidate
        mine = {k: v for k, v in c.options.items() if state.base.options.get(k) != v}
        clash = [k for k, v in mine.items() if k in changed and changed[k] != v]
        if clash:
            rec["dropped"].append({"direction": d.direction.id, "reason": f"option clash {clash}"})
            continue
        if c.code_changed:
            patch = cycle.store.diff_patch(state.base.commit, c.commit, cycle.cfg.system_paths)
            with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as fh:
                fh.write(patch)
            res = g.call("apply", "--3way", "--index", fh.name)
            Path(fh.name).unlink(missing_ok=True)
            if res.rc != 0:
                g.call("reset", "-q", "--hard", "HEAD")
                rec["dropped"].append({"direction": d.direction.id,
                                       "reason": f"3-way conflict: {res.err.strip()[:200]}"})
                continue
            g.run("commit", "-q", "--no-verify", "-m", f"integrate {d.direction.id}",
                  env=_identity())
        changed.update(mine)
        options.update(mine)
        stacked.append(d)
    commit = g.run("rev-parse", "HEAD").strip()
    stack = System(commit=commit, options=options)
    rec["stack"] = [d.direction.id for d in stacked]
    verdict = judges.compare(cycle.root, cycle.cfg, state.base, stack, cycle.ex.controller_rounds,
                             cycle.ex.controller_requests, cycle.ex.controller_max_new)
    rec["verdict"] = verdict
    if verdict["adopted"]:
        state.best = stack
        rec["result"] = "stack adopted"
    else:
        best = stacked[0].candidate
        state.best = System(commit=best.commit, options=best.options)
        rec["result"] = f"stack not adopted ({verdict['verdict']}); best single direction kept"


def _identity() -> dict:
    from specpilot.agents.context import AGENT_IDENTITY

    return AGENT_IDENTITY


def tune_kernels(cycle) -> None:
    """Rank kernel categories by distance from the byte lower bound; autotune needs CUDA."""
    import torch

    a = cycle.state.analysis or {}
    per = {k: v for k, v in (a.get("profile_per_step_ms") or {}).items() if k != "other" and v}
    bound = a.get("weight_bound_ms") or 0
    ranking = sorted(per.items(), key=lambda kv: -kv[1])
    rec = {"ranking": [{"category": k, "ms_per_step": v,
                        "over_weight_bound": round(v / bound, 2) if bound else None}
                       for k, v in ranking]}
    if not torch.cuda.is_available():
        rec["result"] = "skipped: no CUDA device (Triton autotune configurations need one)"
    else:
        rec["result"] = "skipped: no kernels with autotune configurations registered yet"
    cycle.state.kernel_tuning = rec
