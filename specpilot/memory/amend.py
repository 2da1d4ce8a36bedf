"""`specpilot memory amend ID --from SRC`: give an entry a new change, keeping its identity.

For a change a 3-way rebase cannot make: stock moved a module the entry's patch imports, so
the rebased patch applies but no longer runs. The entry keeps its id, dependencies, base,
options and prose; its patch becomes what SRC (a branch, commit or clean worktree on the
entry's base) adds over the entry's dependencies, which must reproduce SRC's system tree as
`record` demands. Its results are marked stale (they measured the old change), the old commit
stays under `refs/specpilot/attic/<id>/<sha>`, and the move is kept in the entry's history.
An entry that others depend on is refused: amend them from their own sources afterwards.

`deps` gives the entry new dependencies (a change that now builds on another entry, e.g. a
first pass that learned to walk tree-verify's trees): they must be entries on the entry's
base, the patch becomes SRC over their replay, and the old list is kept in the history.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.errors import SpecPilotError
from specpilot.memory import patches
from specpilot.memory.entry import Amended, now
from specpilot.memory.rebase import replace_entry
from specpilot.memory.record import resolve_source
from specpilot.memory.replay import Replayer
from specpilot.memory.store import Memory


@dataclass
class AmendOutcome:
    id: str
    old_commit: str
    new_commit: str
    source_tree: str
    patch_sha256: str
    stale_results: int
    files: list[str]

    def to_json(self) -> dict:
        return self.__dict__.copy()


def amend(memory: Memory, entry_id: str, source: str, reason: str,
          write_files: bool = True, deps: list[str] | None = None) -> AmendOutcome:
    store = memory.store
    refs = memory.ref_entries()
    if entry_id not in refs:
        raise SpecPilotError(f"no memory entry {entry_id!r}", code=2)
    if not reason.strip():
        raise SpecPilotError("--reason is required: say why the change was amended", code=2)
    entry, meta = refs[entry_id], refs[entry_id].meta
    users = sorted(e for e, r in refs.items() if entry_id in r.meta.deps)
    if users:
        raise SpecPilotError(f"entry {entry_id!r} has dependents ({', '.join(users)}); "
                             f"amending it would leave them on its old change", code=2)
    new_deps = list(meta.deps) if deps is None else _check_deps(refs, entry_id, meta, deps)
    source_commit = resolve_source(store, source, memory.system_paths)
    if store.merge_base(source_commit, meta.base) != meta.base:
        raise SpecPilotError(f"{source} does not contain the entry's base {meta.base[:12]}; "
                             f"rebase the entry first (`specpilot memory rebase`)", code=2)
    _refuse_a_newer_stock(store, source, source_commit, meta.base, memory.system_paths)
    with store.private_index() as index:
        replayer = Replayer(memory, refs, index)
        deps_tree = replayer.tree_for_deps(new_deps, meta.base, entry_id)
        patch = store.diff_patch(deps_tree, source_commit, memory.system_paths)
        if not patch:
            raise SpecPilotError(f"entry {entry_id!r}: {source} changes nothing in the "
                                 f"system paths over its base and dependencies", code=2)
        tree = replayer.apply_patch(deps_tree, entry_id, patch)
    source_tree = store.system_tree(source_commit, memory.system_paths)
    if store.system_tree(tree, memory.system_paths) != source_tree:
        raise SpecPilotError(f"entry {entry_id!r}: replaying the new patch does not give the "
                             f"system tree of {source}; not amended")
    if source_tree == meta.source_tree and new_deps == list(meta.deps):
        raise SpecPilotError(f"entry {entry_id!r}: {source} has the entry's own system tree; "
                             f"nothing to amend", code=2)
    new_meta = meta.model_copy(update={
        "deps": new_deps,
        "source_tree": source_tree,
        "patch_sha256": patches.sha256(patch),
        "results": [r.model_copy(update={"stale": True}) for r in meta.results],
        "amended": [*meta.amended, Amended(
            from_commit=entry.commit, reason=reason.strip(), date=now(),
            from_deps=None if new_deps == list(meta.deps) else list(meta.deps))],
    })
    new_meta = type(meta).validate_dict(new_meta.model_dump(), f"amended {entry_id}")
    parents = [refs[d].commit for d in new_deps] or [meta.base]
    with store.writer_lock():
        commit, written = replace_entry(memory, entry_id, entry.commit, tree, new_meta,
                                        parents, patch, write_files, "amend")
    files = [memory.rel(p) for p in written]
    return AmendOutcome(entry_id, entry.commit, commit, source_tree, new_meta.patch_sha256,
                        len(meta.results), files)


def _refuse_a_newer_stock(store, source: str, source_commit: str, base: str,
                          system_paths: list[str]) -> None:
    """SRC made on a newer stock (HEAD's commits past the entry's base that change the system
    paths) would put stock's own changes into the entry's patch, and its replay onto that
    stock would then fail: refused, with the way out."""
    head = store.resolve("HEAD")
    shared = store.merge_base(source_commit, head) if head else None
    if (shared is None or shared == base or store.merge_base(shared, base) != base
            or store.system_tree(shared, system_paths) == store.system_tree(base, system_paths)):
        return
    raise SpecPilotError(f"{source} is built on stock {shared[:12]}, whose system paths moved "
                         f"since the entry's base {base[:12]}: the patch would carry those "
                         f"changes too. Rebase the entry onto it first (`specpilot memory "
                         f"rebase --onto {shared[:12]}`), or make {source} from a replay "
                         f"onto the entry's base", code=2)


def _check_deps(refs: dict, entry_id: str, meta, deps: list[str]) -> list[str]:
    """The new dependency list, checked: known entries, not the entry itself, no repeats,
    every one on the entry's base (a cycle cannot arise: the entry has no dependents)."""
    if len(set(deps)) != len(deps):
        raise SpecPilotError(f"--deps names an entry twice: {', '.join(deps)}", code=2)
    for dep in deps:
        if dep == entry_id:
            raise SpecPilotError(f"entry {entry_id!r} cannot depend on itself", code=2)
        if dep not in refs:
            raise SpecPilotError(f"entry {entry_id!r} cannot depend on {dep!r}: no such entry",
                                 code=2)
        if refs[dep].meta.base != meta.base:
            raise SpecPilotError(f"dependency {dep!r} is on base {refs[dep].meta.base[:12]}, "
                                 f"entry {entry_id!r} on {meta.base[:12]}; rebase first", code=2)
    return list(deps)
