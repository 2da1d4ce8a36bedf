"""`specpilot memory record`: turn a branch or worktree into a reproducing memory entry."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from specpilot import worktrees
from specpilot.errors import SpecPilotError
from specpilot.gitstore import ENTRY_PREFIX, GitStore
from specpilot.memory import patches
from specpilot.memory.dag import DuplicateIdError, MissingDependencyError
from specpilot.memory.entry import EntryMeta, check_id, now
from specpilot.memory.replay import Replayer
from specpilot.memory.store import Memory, write_file_entry

# Fields SpecPilot computes; a --meta file may repeat them only with the same value.
COMPUTED = ("schema_version", "id", "deps", "base", "source_tree", "patch_sha256", "created")


@dataclass
class Recorded:
    id: str
    commit: str
    base: str
    source_tree: str
    patch_sha256: str
    files: list[str]
    ignored_paths: list[str]

    def to_json(self) -> dict:
        return self.__dict__.copy()


def record(memory: Memory, source: str, entry_id: str, deps: list[str],
           meta_file: Path | None = None, base: str | None = None,
           write_files: bool = True, allow_empty: bool = False) -> Recorded:
    """`allow_empty`: the entry may add nothing to its dependencies (an integration entry:
    the composition of its dependencies, measured together)."""
    store = memory.store
    try:
        check_id(entry_id)
    except ValueError as exc:
        raise SpecPilotError(str(exc), code=2) from exc
    source_commit = resolve_source(store, source, memory.system_paths)
    refs = memory.ref_entries()
    if entry_id in refs:
        raise DuplicateIdError(f"entry id {entry_id!r} already exists ({ENTRY_PREFIX}{entry_id})")
    if (memory.folder / f"{entry_id}.toml").exists():
        raise DuplicateIdError(f"entry id {entry_id!r} already exists (memory/{entry_id}.toml)")
    for dep in deps:
        if dep not in refs:
            hint = " (run `specpilot memory import` first)" if \
                (memory.folder / f"{dep}.toml").exists() else ""
            raise MissingDependencyError(
                f"entry {entry_id!r} depends on {dep!r}, which is not in memory{hint}")
    base = pick_base(store, source_commit, base, [refs[d].meta.base for d in deps])

    with store.private_index() as index:
        replayer = Replayer(memory, refs, index)
        deps_tree = replayer.tree_for_deps(deps, base, entry_id)
        patch = store.diff_patch(deps_tree, source_commit, memory.system_paths)
        if not patch and not (allow_empty and deps):
            raise SpecPilotError(f"entry {entry_id!r}: {source} changes nothing in the system "
                                 f"paths relative to its dependencies")
        tree = replayer.apply_patch(deps_tree, entry_id, patch)  # checks paths and links
    source_tree = store.system_tree(source_commit, memory.system_paths)
    if store.system_tree(tree, memory.system_paths) != source_tree:
        raise SpecPilotError(f"entry {entry_id!r} does not reproduce: replaying its patch does "
                             f"not give the system tree of {source}; not recorded")
    inside = set(store.diff_names(deps_tree, source_commit, memory.system_paths))
    ignored = [p for p in store.diff_names(deps_tree, source_commit, ["."]) if p not in inside]

    data = _meta_input(meta_file)
    data.setdefault("title", _subject(store, source_commit))
    computed = {"id": entry_id, "deps": deps, "base": base, "source_tree": source_tree,
                "patch_sha256": patches.sha256(patch), "created": now()}
    for key in COMPUTED:
        if key in data and key in computed and data[key] != computed[key]:
            raise SpecPilotError(f"{meta_file}: {key} is computed by specpilot "
                                 f"({computed[key]!r}); remove it from the file", code=2)
    meta = EntryMeta.validate_dict({**data, **computed}, str(meta_file or "metadata"))
    raw = meta.to_toml()

    parents = [refs[d].commit for d in deps] or [base]
    files: list[str] = []
    with store.writer_lock():
        commit = store.commit_tree(tree, parents, meta.commit_message(), meta.git_date())
        store.write_system_tree(tree, memory.system_paths)
        # Note first (a reader that sees the ref must find its note), taken back if the ref
        # cannot be set.
        store.publish(ENTRY_PREFIX + entry_id, commit, None, raw, meta.git_date(),
                      f"specpilot record {entry_id}")
        if write_files:
            files = [memory.rel(p) for p in write_file_entry(memory.folder, raw, entry_id, patch)]
    return Recorded(entry_id, commit, base, source_tree, meta.patch_sha256, files, ignored)


def resolve_source(store: GitStore, source: str, system_paths: list[str]) -> str:
    """A commit from a branch/rev, or from a worktree folder (its HEAD; must be clean). A
    sub-agent's worktree is read without running git inside it (an agent may have rewritten
    its `.git` file): its HEAD as this repository records it, its files by capture_tree."""
    path = Path(source)
    if path.is_dir() and (path / ".git").exists():
        agents = {Path(w.path).resolve(): w for w in worktrees.list_all(store)}
        if path.resolve() in agents:
            head = agents[path.resolve()].head
            if not head or store.capture_tree(path, system_paths, head) != store.tree_of(head):
                raise SpecPilotError(f"worktree {source} has uncommitted changes in the "
                                     f"system paths; commit them first", code=2)
            return head
        other = GitStore(path)
        dirty = other.run("status", "--porcelain", "--", *system_paths)
        if dirty.strip():
            raise SpecPilotError(f"worktree {source} has uncommitted changes in the system "
                                 f"paths; commit them first", code=2)
        return other.run("rev-parse", "HEAD").strip()
    return store.must_resolve(source)


def pick_base(store: GitStore, source: str, base: str | None, dep_bases: list[str]) -> str:
    if base is not None:
        base = store.must_resolve(base)
    if dep_bases:
        if len(set(dep_bases)) > 1:
            raise SpecPilotError("the dependencies are on different bases; rebase them first")
        if base is not None and base != dep_bases[0]:
            raise SpecPilotError(f"--base {base[:12]} differs from the dependencies' base "
                                 f"{dep_bases[0][:12]}", code=2)
        return dep_bases[0]
    if base is not None:
        return base
    head = store.resolve("HEAD")
    fork = store.merge_base(source, head) if head else None
    if fork is None or fork == source:
        raise SpecPilotError("cannot tell the stock commit this entry starts from; "
                             "give --base REF", code=2)
    return fork


def _meta_input(meta_file: Path | None) -> dict:
    if meta_file is None:
        return {}
    try:
        return tomllib.loads(Path(meta_file).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecPilotError(f"{meta_file}: cannot read metadata: {exc}", code=2) from exc


def _subject(store: GitStore, commit: str) -> str:
    return store.run("log", "-1", "--format=%s", commit).strip() or "untitled"
