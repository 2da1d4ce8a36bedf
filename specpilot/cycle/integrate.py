"""Phase 2: integrate the adopted directions of a cycle.

The adopted candidates are stacked onto the cycle's base (the current best system) in order
of measured gain, highest first: code changes by a 3-way apply in a private index of the
project's repository (no worktree), option values by union (a clash with an option the
stack already set drops the later one). A 3-way conflict whose two sides only add lines
(two option registrations at the same place) keeps both; any other conflict goes to the
integration agent (agents/integrator.py) when a client is available, in a fresh worktree
of the stack so far holding git's conflict markers, and its resolution is captured from
that worktree without running git in its configuration (GitStore.capture_tree); without a
client the entry is dropped with a reason. One candidate left is
its own stack (its controller verdict stands); two or more are measured together by the
controller against the base, kept only if adopted, and recorded as a memory entry whose
dependencies are the stacked entries (cycle/entries.record_integration).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from specpilot import worktrees
from specpilot.agents.integrator import resolve
from specpilot.cycle import judges
from specpilot.cycle.context import CycleContext
from specpilot.cycle.entries import record_integration
from specpilot.cycle.types import AGENT_IDENTITY, STACK_REF, System
from specpilot.gitstore import GitStore

def integrate(ctx: CycleContext) -> None:
    state = ctx.state
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
    store = ctx.store
    head = state.base.commit
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
            tree, why = _apply(ctx, head, d, stacked, rec)
            if why:
                rec["dropped"].append({"direction": d.direction.id, "reason": why})
                ctx.progress("integrate", f"dropped {d.direction.id}: {why[:120]}")
                continue
            head = store.commit_tree(tree, [head], f"integrate {d.direction.id}", None,
                                     AGENT_IDENTITY)
            ref = STACK_REF + state.run_id
            store.update_ref(ref, head, store.resolve(ref), f"specpilot integrate {d.direction.id}")
        changed.update(mine)
        options.update(mine)
        stacked.append(d)
        ctx.save()
    rec["stack"] = [d.direction.id for d in stacked]
    if len(stacked) == 1:
        c = stacked[0].candidate
        state.best = System(commit=c.commit, options=c.options)
        rec.update(result="one direction left after drops; its controller verdict stands",
                   verdict=stacked[0].verdict)
        return
    stack = System(commit=head, options=options)
    rec["system"] = stack.model_dump()
    ctx.progress("integrate", f"controller: stack {', '.join(rec['stack'])} against the base")
    verdict = judges.compare(ctx.root, ctx.cfg, state.base, stack, ctx.ex.controller_rounds,
                             ctx.ex.controller_requests, ctx.ex.controller_max_new,
                             progress=lambda m: ctx.progress("integrate", f"controller: {m}"))
    rec["verdict"] = verdict
    why = judges.implausible(verdict, ctx.analysis_of(state.base), ctx.ex.plausible_margin) \
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
        with ctx.lock:
            out = record_integration(ctx, stacked, stack, verdict, rec["resolved"])
            state.entries.append(out["entry"])
        rec.update(out)


def _apply(ctx: CycleContext, head: str, d, stacked: list,
           rec: dict) -> tuple[str | None, str | None]:
    """3-way apply `d`'s patch onto the stack `head` in a private index: (tree, None), or
    (None, why not)."""
    c = d.candidate
    store, paths = ctx.store, ctx.cfg.system_paths
    patch = store.diff_patch(ctx.state.base.commit, c.commit, paths)
    with store.private_index() as index:
        index.load(store.tree_of(head))
        res = index.apply(patch, three_way=True)
        if res.rc == 0:
            return index.write(), None
        conflicted = index.unmerged()
        if not conflicted:
            return None, f"does not apply: {res.err.strip()[:200]}"
        if index.resolve_additions() and not index.unmerged():
            return index.write(), None
    if ctx.client is None:
        return None, (f"3-way conflict in {', '.join(conflicted)}; no integration agent "
                      f"offline (set ANTHROPIC_API_KEY)")
    agents = rec.setdefault("agent_worktrees", [])
    wt = _conflict_worktree(ctx, head, patch, len(agents))
    agents.append(wt.name)
    ctx.progress("integrate", f"conflict in {', '.join(conflicted)}: integration agent")
    why = resolve(ctx, wt, conflicted, stacked, d)
    if why:
        return None, f"3-way conflict in {', '.join(conflicted)}; {why}"
    tree = store.capture_tree(wt, paths, head)   # never git in the agent's worktree
    rec["resolved"].append(d.direction.id)
    return tree, None


def _conflict_worktree(ctx: CycleContext, head: str, patch: bytes, n: int) -> Path:
    """A fresh worktree at the stack `head` with the patch 3-way applied: git's conflict
    markers in the files, for the integration agent. Fresh for every conflict: once an
    agent has written in a worktree, no git runs in it again."""
    name = f"{ctx.state.run_id.removeprefix('run-')}-integrate"[:60] + (f"-{n + 1}" if n else "")
    existing = [w for w in worktrees.list_all(ctx.store) if w.name == name]
    if existing:   # resumed: start that conflict over
        worktrees.remove(ctx.store, name, force=True)
        ctx.store.call("branch", "-D", worktrees.BRANCH_PREFIX + name)
    wt = Path(worktrees.new(ctx.store, name, head).path)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as fh:
        fh.write(patch)
    try:   # a worktree no agent has touched yet: git may run in it
        GitStore(wt).call("apply", "--3way", "--index", "--whitespace=nowarn", fh.name)
    finally:
        Path(fh.name).unlink(missing_ok=True)
    return wt
