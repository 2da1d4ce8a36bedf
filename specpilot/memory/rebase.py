"""`specpilot memory rebase --onto`: move entries onto a new stock with a 3-way apply.

Each entry's own patch (from the old replay) is applied with `git apply --3way --cached`
onto the new stock plus its already-moved ancestors, in a private index. A clean entry gets
a new commit, base, source tree, patch hash and note; its results are marked stale until
re-measured; its old commit stays reachable under `refs/specpilot/attic/<id>/<sha>`. An
entry that conflicts keeps its old ref untouched and is reported with the conflicting paths;
entries that depend on it are reported as blocked. Rebasing chosen ids moves their
ancestors and descendants with them (and the descendants' other ancestors).

A conflict is resolved by hand and given back: `resolved={id: SRC}` (the CLI's
`--resolved ID=SRC`), SRC a branch, commit or clean worktree on the new stock with the
entry's moved dependencies and its change merged by hand (`git specpilot replay DEP --onto
NEW --worktree DIR`, edit, commit). Its change is then what SRC adds over them, which must
replay to SRC's system tree; the move records the resolution's commit. The entries
blocked behind it move in the same run: where their old replay can no longer be made (an
ancestor moved in the earlier run), their change is their recorded patch (memory/<id>.patch
with the patch_sha256 their note names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.errors import SpecPilotError
from specpilot.gitstore import ENTRY_PREFIX
from specpilot.memory import patches
from specpilot.memory.dag import replay_sequence
from specpilot.memory.entry import Rebased, now
from specpilot.memory.portable import _closure, _keep_in_attic
from specpilot.memory.record import resolve_source
from specpilot.memory.replay import Replayer, check_change, compose_additions
from specpilot.memory.store import Memory, write_file_entry

OK = ("moved", "unchanged")


@dataclass
class RebaseOutcome:
    id: str
    status: str                       # moved | unchanged | conflict | blocked | failed
    old_commit: str | None = None
    new_commit: str | None = None
    paths: list[str] = field(default_factory=list)
    error: str | None = None
    kept_both: list[str] = field(default_factory=list)  # pure-addition conflicts resolved

    def to_json(self) -> dict:
        return self.__dict__.copy()


def rebase(memory: Memory, onto: str, ids: list[str] | None = None,
           write_files: bool = True, resolved: dict[str, str] | None = None
           ) -> list[RebaseOutcome]:
    store = memory.store
    onto = store.must_resolve(onto)
    onto_tree = store.must_resolve(onto, "tree")
    refs = memory.ref_entries()
    resolutions = _resolutions(memory, onto, refs, resolved or {})
    results: dict[str, RebaseOutcome] = {}
    with store.private_index() as old_index, store.private_index() as index, \
            store.writer_lock():
        old = Replayer(memory, refs, old_index)
        new_commits: dict[str, str] = {}
        new_patches: dict[str, bytes] = {}
        memo: dict[tuple[str, ...], str] = {(): onto_tree}
        for eid in _selection(refs, old.order, ids):
            entry, meta = refs[eid], refs[eid].meta
            out = RebaseOutcome(eid, "failed", old_commit=entry.commit)
            results[eid] = out
            blocked = [d for d in meta.deps if results[d].status not in OK]
            if blocked:
                out.status, out.error = "blocked", f"dependency {blocked[0]!r} was not moved"
                continue
            outcome = old.run(eid) if eid not in resolutions else None
            if outcome is not None and not outcome.ok:   # (a resolution replaces the change)
                recorded = _recorded_patch(memory, refs, old, eid)
                if recorded is None:
                    out.error = f"does not reproduce on its old base: {outcome.error}"
                    continue
                old.patches[eid] = recorded
            if meta.base == onto and all(results[d].status == "unchanged" for d in meta.deps):
                out.status, out.new_commit = "unchanged", entry.commit
                new_commits[eid], new_patches[eid] = entry.commit, old.patches[eid]
                continue
            seq = tuple(replay_sequence(old.deps, old.order, eid)[:-1])
            try:
                deps_tree = _tree_after(memo, seq, new_patches, index, eid)
            except SpecPilotError as exc:
                out.error = str(exc)
                continue
            index.load(deps_tree)
            if eid in resolutions:   # the user's merge: what it adds over the moved deps
                res = index.apply(store.diff_patch(deps_tree, resolutions[eid],
                                                   memory.system_paths))
            else:
                res = index.apply(old.patches[eid], three_way=True)
            if res.rc != 0 and index.unmerged():
                out.kept_both = index.resolve_additions()
            if res.rc != 0 and not out.kept_both:
                conflicted = index.unmerged()
                index.tree = None
                if conflicted:
                    out.status, out.paths = "conflict", conflicted
                    out.error = f"entry {eid!r}: 3-way apply conflicts in {', '.join(conflicted)}"
                else:
                    out.error = patches.describe_failure(eid, old.patches[eid], res.err)
                continue
            tree = index.write()
            if eid in resolutions and store.system_tree(tree, memory.system_paths) != \
                    store.system_tree(resolutions[eid], memory.system_paths):
                out.error = (f"entry {eid!r}: the resolution does not sit on the moved "
                             f"dependencies (its change over them does not give its tree)")
                continue
            try:
                check_change(store, eid, deps_tree, tree, memory.system_paths)
            except SpecPilotError as exc:
                out.error = str(exc)
                continue
            patch = store.diff_patch(deps_tree, tree, memory.system_paths)
            if not patch:
                out.error = f"entry {eid!r}: its change is already in {onto[:12]} (empty patch)"
                continue
            memo[seq + (eid,)] = tree
            new_meta = meta.model_copy(update={
                "base": onto,
                "source_tree": store.system_tree(tree, memory.system_paths),
                "patch_sha256": patches.sha256(patch),
                "results": [r.model_copy(update={"stale": True}) for r in meta.results],
                "rebased": [*meta.rebased, Rebased(from_base=meta.base, to_base=onto,
                                                   from_commit=entry.commit, date=now(),
                                                   resolved_from=resolutions.get(eid))],
            })
            new_meta = type(meta).validate_dict(new_meta.model_dump(), f"rebased {eid}")
            parents = [new_commits[d] for d in meta.deps] or [onto]
            commit, _ = replace_entry(memory, eid, entry.commit, tree, new_meta, parents,
                                      patch, write_files, "rebase")
            if eid in resolutions:   # the hand merge stays reachable beside the old commit
                _keep_in_attic(memory, eid, resolutions[eid])
            new_commits[eid], new_patches[eid] = commit, patch
            out.status, out.new_commit = "moved", commit
    return list(results.values())


def _recorded_patch(memory: Memory, refs, old, eid: str) -> bytes | None:
    """An entry's change when its old replay cannot be made because an ancestor already
    moved (an earlier rebase moved it while this entry waited behind a conflict): its
    recorded patch, memory/<id>.patch, if that is the change its note names (the same
    patch_sha256). None otherwise (the replay failed for another reason)."""
    meta = refs[eid].meta
    ancestors = replay_sequence(old.deps, old.order, eid)[:-1]
    if all(refs[a].meta.base == meta.base for a in ancestors):
        return None
    path = memory.folder / f"{eid}.patch"
    if not path.is_file():
        return None
    patch = path.read_bytes()
    return patch if patches.sha256(patch) == meta.patch_sha256 else None


def _resolutions(memory: Memory, onto: str, refs, resolved: dict[str, str]) -> dict[str, str]:
    """Each hand resolution's commit; it must be an entry's and contain the new stock."""
    out = {}
    for eid, source in resolved.items():
        if eid not in refs:
            raise SpecPilotError(f"--resolved {eid}={source}: no memory entry {eid!r}", code=2)
        commit = resolve_source(memory.store, source, memory.system_paths)
        if memory.store.merge_base(commit, onto) != onto:
            raise SpecPilotError(f"--resolved {eid}={source}: it does not contain the new "
                                 f"stock {onto[:12]}; resolve on top of it", code=2)
        out[eid] = commit
    return out


def replace_entry(memory: Memory, eid: str, old_commit: str, tree: str, new_meta, parents,
                  patch: bytes, write_files: bool, verb: str) -> tuple[str, list]:
    """Publish `tree` as entry `eid`'s new commit with `new_meta` (its note), keeping the old
    commit in the attic; rewrite memory/<id>.toml/.patch when asked. (commit, files written).
    The caller holds the writer lock. Used by rebase and amend."""
    store = memory.store
    raw = new_meta.to_toml()
    commit = store.commit_tree(tree, parents, new_meta.commit_message(), new_meta.git_date())
    store.write_system_tree(tree, memory.system_paths)
    _keep_in_attic(memory, eid, old_commit)
    store.publish(ENTRY_PREFIX + eid, commit, old_commit, raw, new_meta.git_date(),
                  f"specpilot {verb} {eid}")
    files = write_file_entry(memory.folder, raw, eid, patch) if write_files else []
    return commit, files


def _selection(refs, order: list[str], ids: list[str] | None) -> list[str]:
    """The chosen entries with their ancestors (they move first) and their descendants
    (which would otherwise be left depending on moved entries from the old base), and the
    descendants' other ancestors too, until nothing is added (a descendant of several
    dependencies cannot sit on moved and unmoved ones at once)."""
    chosen = set(_closure(refs, order, ids))
    while True:
        grown = set(chosen)
        for eid in order:
            if any(dep in grown for dep in refs[eid].meta.deps):
                grown.add(eid)
        grown = set(_closure(refs, order, sorted(grown)))
        if grown == chosen:
            return [e for e in order if e in chosen]
        chosen = grown


def _tree_after(memo, seq, new_patches, index, for_id) -> str:
    """The new stock plus the moved patches of `seq`, memoized by prefix."""
    done = max(i for i in range(len(seq) + 1) if seq[:i] in memo)
    tree = memo[seq[:done]]
    for i in range(done, len(seq)):
        index.load(tree)
        res = index.apply(new_patches[seq[i]])
        composed = (compose_additions(index, tree, seq[i], new_patches[seq[i]])
                    if res.rc != 0 else None)
        if res.rc != 0 and composed is None:
            raise patches.PatchApplyError(
                f"entry {for_id!r}: moved dependencies do not compose: "
                + patches.describe_failure(seq[i], new_patches[seq[i]], res.err))
        tree = composed or index.write()
        memo[seq[: i + 1]] = tree
    return tree
