"""The `reuse` backend: replay a memory entry onto the current best and re-tune its options.

The entry's own patch is applied with a 3-way merge in the agent's worktree (which starts at
the cycle's base); its options switch it on at their tuned values. Reused entries are judged
like any other candidate but are not counted as discoveries.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from specpilot.agents.context import AgentContext, commit_worktree
from specpilot.cycle.types import Candidate, options_text
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.memory.store import Memory


def entry_patch(root: Path, entry_id: str) -> tuple[bytes, object]:
    memory = Memory(root)
    refs = memory.ref_entries()
    if entry_id in refs:
        entry = refs[entry_id]
        parent = memory.store.parents(entry.commit)[0]
        return memory.store.diff_patch(parent, entry.commit, memory.system_paths), entry.meta
    files = memory.file_entries()
    if entry_id in files and files[entry_id].patch:
        return files[entry_id].patch, files[entry_id].meta
    raise SpecPilotError(f"no memory entry {entry_id!r}")


def _resolve_additions(wt: GitStore, folder: Path) -> bool:
    """Resolve conflicts where both sides only added lines at the same place (e.g. two
    option registrations appended to stock/options.py): keep ours, then theirs, in the
    worktree and its index. Any other conflict is left alone and reported (False)."""
    merged = wt.union_of_additions()
    if not merged:
        return False
    for path, (_mode, data) in merged.items():
        (folder / path).write_bytes(data)
        wt.run("add", "--", path)
    return True


def produce(ctx: AgentContext) -> Candidate:
    entry_id = ctx.direction.entry or ""
    patch, meta = entry_patch(ctx.root, entry_id)
    if not meta.reusable:
        v = meta.validation
        raise SpecPilotError(f"entry {entry_id} is {v.status} (run {v.run}): not reusable "
                             f"until a cycle's final validation passes it; {v.detail[:200]}")
    wt = GitStore(ctx.worktree)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as fh:
        fh.write(patch)
    try:
        res = wt.call("apply", "--3way", "--whitespace=nowarn", fh.name)
    finally:
        Path(fh.name).unlink(missing_ok=True)
    if res.rc != 0 and _resolve_additions(wt, ctx.worktree):
        ctx.progress(f"{entry_id}: 3-way conflicts were pure additions on both sides; kept both")
    elif res.rc != 0:
        raise SpecPilotError(f"entry {entry_id} does not apply onto {ctx.base.commit[:12]}: "
                             f"{res.err.strip()[:300]}")
    commit = commit_worktree(ctx, f"reuse {entry_id}: {meta.title}")
    if commit is None:
        raise SpecPilotError(f"entry {entry_id} changes nothing on {ctx.base.commit[:12]} "
                             f"(already part of it)")
    options = {o.name: str(o.tuned) for o in meta.options if o.tuned is not None}
    ctx.progress(f"replayed {entry_id}; options {options_text(options)}")
    return Candidate(commit=commit, options={**ctx.base.options, **options},
                     summary=f"replayed {entry_id} ({meta.title})", code_changed=True)
