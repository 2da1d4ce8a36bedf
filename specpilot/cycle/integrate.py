"""Phase 2: integrate the adopted directions of a cycle.

The adopted candidates are stacked onto the cycle's base (the current best system) in order
of measured gain, highest first: code changes by a 3-way apply in an integration worktree,
option values by union (a clash with an option the stack already set drops the later one).
A 3-way conflict whose two sides only add lines (two option registrations at the same
place) keeps both; any other conflict goes to the integration agent (agents/integrator.py)
when a client is available, else the entry is dropped with a reason. One candidate left is
its own stack (its controller verdict stands); two or more are measured together by the
controller against the base, kept only if adopted, and recorded as a memory entry whose
dependencies are the stacked entries (cycle/entries.record_integration).
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
    rec: dict = {"order": [d.direction.id for d in adopted],
                 "gains": {d.direction.id: d.gain for d in adopted},
                 "dropped": [], "resolved": [], "stack": None}
    state.integration = rec
    state.best = state.base
    if not adopted:
        rec["result"] = "nothing adopted; the best system stays the base"
        return
    if len(adopted) == 1:
        c = adopted[0].candidate
        state.best = System(commit=c.commit, options=c.options)
        rec.update(stack=[adopted[0].direction.id], result="one adopted direction; its "
                   "controller verdict stands", verdict=adopted[0].verdict)
        return
    wt = _fresh_worktree(cycle, f"{state.run_id.removeprefix('run-')}-integrate"[:64])
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
            why = _apply(cycle, g, wt, d, stacked, rec)
            if why:
                g.call("reset", "-q", "--hard", "HEAD")
                rec["dropped"].append({"direction": d.direction.id, "reason": why})
                cycle.progress("integrate", f"dropped {d.direction.id}: {why[:120]}")
                continue
            g.run("commit", "-q", "--no-verify", "-m", f"integrate {d.direction.id}",
                  env=_identity())
        changed.update(mine)
        options.update(mine)
        stacked.append(d)
        cycle.save()
    rec["stack"] = [d.direction.id for d in stacked]
    if len(stacked) == 1:
        c = stacked[0].candidate
        state.best = System(commit=c.commit, options=c.options)
        rec.update(result="one direction left after drops; its controller verdict stands",
                   verdict=stacked[0].verdict)
        return
    stack = System(commit=g.run("rev-parse", "HEAD").strip(), options=options)
    rec["system"] = stack.model_dump()
    cycle.progress("integrate", f"controller: stack {rec['stack']} against the base")
    verdict = judges.compare(cycle.root, cycle.cfg, state.base, stack, cycle.ex.controller_rounds,
                             cycle.ex.controller_requests, cycle.ex.controller_max_new,
                             progress=lambda m: cycle.progress("integrate", f"controller: {m}"))
    rec["verdict"] = verdict
    why = judges.implausible(verdict, cycle.analysis_of(state.base), cycle.ex.plausible_margin) \
        if verdict["adopted"] else None
    if not verdict["adopted"] or why:
        best = stacked[0].candidate
        state.best = System(commit=best.commit, options=best.options)
        rec["result"] = (f"stack not adopted ({why or verdict['verdict']}); the best single "
                         f"direction {stacked[0].direction.id} kept")
        return
    state.best = stack
    rec["result"] = "stack adopted"
    if any(d.entry for d in stacked) or stack.commit != state.base.commit:
        from specpilot.cycle.entries import record_integration

        with cycle._lock:
            out = record_integration(cycle, stacked, stack, verdict, rec["resolved"])
            state.entries.append(out["entry"])
        rec.update(out)


def _apply(cycle, g: GitStore, wt: Path, d, stacked: list, rec: dict) -> str | None:
    """3-way apply `d`'s patch onto the stack; None when it is in the index, else why not."""
    from specpilot.agents.reuse import _resolve_additions

    c = d.candidate
    patch = cycle.store.diff_patch(cycle.state.base.commit, c.commit, cycle.cfg.system_paths)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as fh:
        fh.write(patch)
    try:
        res = g.call("apply", "--3way", "--index", "--whitespace=nowarn", fh.name)
    finally:
        Path(fh.name).unlink(missing_ok=True)
    if res.rc == 0:
        return None
    conflicted = sorted({line.split("\t", 1)[1] for line in
                         g.run("ls-files", "-u").splitlines() if "\t" in line})
    if not conflicted:
        return f"does not apply: {res.err.strip()[:200]}"
    if _resolve_additions(g, wt):
        return None
    if cycle.client is None:
        return (f"3-way conflict in {', '.join(conflicted)}; no integration agent offline "
                f"(set ANTHROPIC_API_KEY)")
    from specpilot.agents.integrator import resolve

    cycle.progress("integrate", f"conflict in {', '.join(conflicted)}: integration agent")
    why = resolve(cycle, wt, conflicted, stacked, d)
    if why:
        return f"3-way conflict in {', '.join(conflicted)}; {why}"
    paths = [p for p in cycle.cfg.system_paths if (wt / p).exists()]
    g.run("add", "-A", "--", *paths)
    if g.run("ls-files", "-u").strip():
        return f"3-way conflict in {', '.join(conflicted)}; still unmerged after the agent"
    rec["resolved"].append(d.direction.id)
    return None


def _fresh_worktree(cycle, name: str) -> Path:
    existing = [w for w in worktrees.list_all(cycle.store) if w.name == name]
    if existing:   # resumed: integrate again from the base
        worktrees.remove(cycle.store, name, force=True)
        cycle.store.call("branch", "-D", worktrees.BRANCH_PREFIX + name)
    return Path(worktrees.new(cycle.store, name, cycle.state.base.commit).path)


def _identity() -> dict:
    from specpilot.agents.context import AGENT_IDENTITY

    return AGENT_IDENTITY
