"""Replay: rebuild entries from their base by applying patches in a private index.

An entry is rebuilt by applying, in topological order, the own patch of each of its
ancestors and then its own, starting from its base commit's tree (or another stock given
with `onto`). Trees after each applied prefix are memoized, so verifying a whole DAG costs
about one `git apply` per entry. The outcome compares the system-path tree hash with the
one recorded: reproduced, diverged (with the differing paths) or failed (with why).

Entries from refs carry no patch file: their own patch is regenerated as the canonical diff
from the replay of their dependencies to their commit, and checked against the recorded
sha256; entries from `memory/` are applied from their `.patch` bytes.

What a patch touched is what git says applying it changed (the tree diff before and after,
`GitStore.changed`), never what its headers claim: a change outside the system paths, or a
symbolic link that leads out of them (specpilot/links.py), fails the entry. An entry from
refs reproduces only if its commit's whole tree is the replayed tree, so a commit that also
changes other paths is caught too (`git specpilot replay --worktree` checks that commit out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from specpilot import links
from specpilot.errors import SpecPilotError
from specpilot.gitstore import PrivateIndex
from specpilot.memory import patches
from specpilot.memory.dag import MissingDependencyError, replay_sequence, topo_order
from specpilot.memory.store import Entry, Memory

Status = Literal["reproduced", "diverged", "failed"]


@dataclass
class Outcome:
    id: str
    status: Status
    expected_tree: str | None = None   # recorded source tree (system paths)
    replayed_tree: str | None = None   # system-path tree hash of the replay
    differing_paths: list[str] = field(default_factory=list)
    error: str | None = None
    commit_tree: str | None = None     # the full replayed tree (for checkout), if any

    @property
    def ok(self) -> bool:
        return self.status == "reproduced"

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("commit_tree")
        return data


class Replayer:
    """Replays entries of one source (refs or files) in one private index."""

    def __init__(self, memory: Memory, entries: dict[str, Entry], index: PrivateIndex,
                 onto: str | None = None, patches_from: "Replayer | None" = None):
        self.memory = memory
        self.store = memory.store
        self.entries = entries
        self.index = index
        self.onto = onto  # a commit: replay onto its tree instead of each entry's base
        self.patches_from = patches_from
        self.deps = {eid: e.meta.deps for eid, e in entries.items()}
        self.order = topo_order(self.deps)
        self.patches: dict[str, bytes] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.trees: dict[str, str] = {}          # entry id -> full replayed tree
        self._memo: dict[tuple[str, tuple[str, ...]], str] = {}
        self._starts: dict[str, str | None] = {}

    # -- public -----------------------------------------------------------------------

    def run(self, entry_id: str) -> Outcome:
        """Replay `entry_id` (and, first, each ancestor not yet replayed)."""
        if entry_id not in self.entries:
            raise SpecPilotError(f"no memory entry {entry_id!r}", code=2)
        for eid in replay_sequence(self.deps, self.order, entry_id):
            if eid not in self.outcomes:
                self.outcomes[eid] = self._replay_one(eid)
        return self.outcomes[entry_id]

    def run_all(self, ids: list[str] | None = None) -> list[Outcome]:
        return [self.run(eid) for eid in (ids or self.order)]

    def deps_tree(self, entry_id: str) -> str:
        """The full tree of the replayed dependencies of `entry_id` (its patch's preimage)."""
        seq = replay_sequence(self.deps, self.order, entry_id)[:-1]
        return self._tree_after(self._start(entry_id), seq, entry_id)

    def tree_for_deps(self, deps: list[str], base: str, for_id: str) -> str:
        """The replay of `deps` (which must all reproduce) on `base`: a new entry's preimage."""
        wanted: set[str] = set()
        for dep in deps:
            if dep not in self.entries:
                raise MissingDependencyError(
                    f"entry {for_id!r} depends on {dep!r}, which is not in memory")
            outcome = self.run(dep)
            if not outcome.ok:
                raise SpecPilotError(f"entry {for_id!r}: dependency {dep!r} does not "
                                     f"reproduce: {outcome.error}")
            if self.entries[dep].meta.base != base:
                raise SpecPilotError(f"entry {for_id!r}: dependency {dep!r} is on base "
                                     f"{self.entries[dep].meta.base[:12]}, not {base[:12]}")
            wanted |= set(replay_sequence(self.deps, self.order, dep))
        start = self.store.must_resolve(base, "tree")
        return self._tree_after(start, [e for e in self.order if e in wanted], for_id)

    # -- one entry --------------------------------------------------------------------

    def _replay_one(self, entry_id: str) -> Outcome:
        entry = self.entries[entry_id]
        meta = entry.meta
        try:
            for dep in meta.deps:  # a diverged dependency still gives a tree to build on
                if self.outcomes[dep].status == "failed":
                    raise SpecPilotError(
                        f"entry {entry_id!r}: its dependency {dep!r} failed to replay")
            self._check_base(entry)
            seq = replay_sequence(self.deps, self.order, entry_id)
            start = self._start(entry_id)
            deps_tree = self._tree_after(start, seq[:-1], entry_id)
            patch = self._patch(entry, deps_tree)
            patches.check_format(entry_id, patch)
            self.patches[entry_id] = patch
            tree = self.apply_patch(deps_tree, entry_id, patch)
            self._check_commit(entry, tree)
            self._memo[(start, tuple(seq))] = tree  # dependents start from here
        except SpecPilotError as exc:
            return Outcome(entry_id, "failed", meta.source_tree, error=str(exc))
        self.trees[entry_id] = tree
        replayed = self.store.system_tree(tree, self.memory.system_paths)
        if replayed == meta.source_tree:
            return Outcome(entry_id, "reproduced", meta.source_tree, replayed, commit_tree=tree)
        paths = self._differing(entry, tree)
        return Outcome(entry_id, "diverged", meta.source_tree, replayed, paths,
                       error=f"entry {entry_id!r}: replayed tree {replayed[:12]} differs from "
                             f"the recorded {meta.source_tree[:12]}", commit_tree=tree)

    def _start(self, entry_id: str) -> str:
        base = self.onto or self.entries[entry_id].meta.base
        if base not in self._starts:
            self._starts[base] = self.store.resolve(base, "tree")
        tree = self._starts[base]
        if tree is None:
            raise SpecPilotError(f"entry {entry_id!r}: base commit {base[:12]} is not in this "
                                 f"repository (fetch it, or replay --onto another stock)")
        return tree

    def _check_base(self, entry: Entry) -> None:
        if self.onto:
            return
        for dep in entry.meta.deps:
            dep_base = self.entries[dep].meta.base
            if dep_base != entry.meta.base:
                raise SpecPilotError(
                    f"entry {entry.id!r} is on base {entry.meta.base[:12]} but its dependency "
                    f"{dep!r} is on {dep_base[:12]} (rebase them together)")
        if entry.commit is not None:
            wanted = [self.entries[d].commit for d in entry.meta.deps] or [entry.meta.base]
            if self.store.parents(entry.commit) != wanted:
                raise SpecPilotError(f"entry {entry.id!r}: commit {entry.commit[:12]} has "
                                     f"parents that do not match its deps and base")

    def _check_commit(self, entry: Entry, tree: str) -> None:
        """An entry commit (refs) must hold exactly the replayed tree, not merely the same
        system paths: it is what `replay --worktree` checks out."""
        if entry.commit is None or self.onto:
            return
        committed = self.store.tree_of(entry.commit)
        if committed != tree:
            extra = sorted(self.store.changed(tree, committed))
            raise patches.OutsideSystemPathsError(
                f"entry {entry.id!r}: commit {entry.commit[:12]} is not its replayed tree "
                f"(it also changes {', '.join(extra[:3])}{' …' if len(extra) > 3 else ''})")

    def _patch(self, entry: Entry, deps_tree: str) -> bytes:
        if self.patches_from is not None:
            self.patches_from.run(entry.id)
            if entry.id not in self.patches_from.patches:
                raise SpecPilotError(self.patches_from.outcomes[entry.id].error or "failed")
            return self.patches_from.patches[entry.id]
        if entry.patch is not None:
            patches.check_hash(entry.id, entry.patch, entry.meta.patch_sha256,
                               f"{entry.origin[:-5]}.patch")
            return entry.patch
        patch = self.store.diff_patch(deps_tree, entry.commit, self.memory.system_paths)
        patches.check_hash(entry.id, patch, entry.meta.patch_sha256,
                           f"the diff of commit {entry.commit[:12]} from its dependencies")
        return patch

    def _differing(self, entry: Entry, tree: str) -> list[str]:
        """Paths where the replay differs from the recorded source tree, when that tree
        (written at record/import time) or a commit holding it is in this repository."""
        paths, expected = self.memory.system_paths, entry.meta.source_tree
        if self.store.resolve(expected, "tree"):
            replayed = self.store.write_system_tree(tree, paths)
            if replayed:
                return self.store.diff_names(expected, replayed, ["."])
        for commit in (entry.commit, self.store.resolve(f"refs/specpilot/entries/{entry.id}")):
            if commit and self.store.system_tree(commit, paths) == expected:
                return self.store.diff_names(commit, tree, paths)
        return ["(unknown: the recorded source tree is not in this repository)"]

    # -- trees ------------------------------------------------------------------------

    def _tree_after(self, start: str, seq: list[str], for_id: str) -> str:
        """The tree after applying the patches of `seq`, in order, to `start`."""
        done = 0
        tree = start
        for i in range(len(seq), 0, -1):
            hit = self._memo.get((start, tuple(seq[:i])))
            if hit:
                done, tree = i, hit
                break
        for i in range(done, len(seq)):
            eid, before = seq[i], tree
            try:
                tree = self.apply_patch(before, eid, self.patches[eid])
            except patches.PatchApplyError as exc:
                tree = compose_additions(self.index, before, eid, self.patches[eid])
                if tree is None:
                    raise patches.PatchApplyError(
                        f"entry {for_id!r}: its dependencies do not compose: {exc}") from exc
                check_change(self.store, eid, before, tree, self.memory.system_paths)
            self._memo[(start, tuple(seq[: i + 1]))] = tree
        return tree

    def apply_patch(self, tree: str, entry_id: str, patch: bytes) -> str:
        """The tree after applying `patch` to `tree`; refuses a result that changes paths
        outside the system paths or adds a link leading out of them (git's own account of
        what changed, whatever the patch's headers say)."""
        if not patch.strip():
            return tree
        patches.check_paths(entry_id, self.store.patch_paths(patch), self.memory.system_paths)
        self.index.load(tree)
        res = self.index.apply(patch)
        if res.rc != 0:
            raise patches.PatchApplyError(patches.describe_failure(entry_id, patch, res.err))
        new = self.index.write()
        check_change(self.store, entry_id, tree, new, self.memory.system_paths)
        return new


def compose_additions(index, tree: str, entry_id: str, patch: bytes) -> str | None:
    """`patch` (a dependency's, made on the common base) applied 3-way to `tree` (the base
    plus the dependencies before it in replay order) where a plain apply failed, kept only
    if every conflict is two pure additions at one place (two entries each registering an
    option after the same line of stock/options.py): both kept, the earlier entry's lines
    first, as `rebase` keeps stock's and an entry's. Deterministic, since the replay order
    is; None (and a clean index) when any conflict is of another kind."""
    index.load(tree)
    res = index.apply(patch, three_way=True)
    if res.rc == 0:
        return index.write()
    if not index.unmerged() or not index.resolve_additions():
        index.tree = None
        return None
    return index.write()


def check_change(store, entry_id: str, before: str, after: str, system: list[str]) -> None:
    """Refuse a change from tree `before` to `after` that touches a path outside the system
    paths or leaves a symbolic link leading out of them, by git's account of the change."""
    changed = store.changed(before, after)
    patches.check_paths(entry_id, list(changed), system)
    if any(mode == "120000" for mode in changed.values()):
        links.check(store.links(after, system), system, f"entry {entry_id!r}")
