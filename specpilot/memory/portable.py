"""Import and export between refs + notes and the portable `memory/` folder.

Export writes each note's bytes as `<id>.toml` and the canonical own diff as `<id>.patch`;
import replays the files, refuses anything that does not reproduce, and re-creates the
entry commits. Entry commits have a fixed identity and the entry's `created` date, so an
import re-creates the very commit hashes of the exporting repository, and an export of an
import gives back the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.gitstore import ATTIC_PREFIX, ENTRY_PREFIX
from specpilot.memory.dag import DuplicateIdError, replay_sequence
from specpilot.memory.replay import Replayer
from specpilot.memory.store import Entry, Memory, write_file_entry


@dataclass
class Moved:
    id: str
    action: str          # created | replaced | unchanged | written
    commit: str | None = None
    files: list[str] | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _closure(entries: dict[str, Entry], order: list[str], ids: list[str] | None) -> list[str]:
    if not ids:
        return list(order)
    deps = {eid: e.meta.deps for eid, e in entries.items()}
    wanted: set[str] = set()
    for eid in ids:
        if eid not in entries:
            raise SpecPilotError(f"no memory entry {eid!r}", code=2)
        wanted |= set(replay_sequence(deps, order, eid))
    return [e for e in order if e in wanted]


def replayed_commits(memory: Memory, files: dict[str, Entry], index, ids: list[str] | None,
                     verb: str = "imported"):
    """(id, file entry, replayed tree, entry commit) for `ids` and their dependencies, in
    dependency order: each must reproduce from its files and its patch must be the canonical
    diff. The commit objects are written (objects only: no ref, no note)."""
    store = memory.store
    replayer = Replayer(memory, files, index)
    commits: dict[str, str] = {}
    for eid in _closure(files, replayer.order, ids):
        entry = files[eid]
        outcome = replayer.run(eid)
        if not outcome.ok:
            raise SpecPilotError(f"not {verb}: {outcome.error}")
        deps_tree = replayer.deps_tree(eid)
        canonical = store.diff_patch(deps_tree, outcome.commit_tree, memory.system_paths)
        if canonical != entry.patch:
            raise SpecPilotError(
                f"entry {eid!r}: {entry.origin[:-5]}.patch applies but is not the canonical "
                f"diff (git diff --binary --full-index); re-record or re-export it")
        meta = entry.meta
        parents = [commits[d] for d in meta.deps] or [meta.base]
        commit = store.commit_tree(outcome.commit_tree, parents, meta.commit_message(),
                                   meta.git_date())
        commits[eid] = commit
        store.write_system_tree(outcome.commit_tree, memory.system_paths)
        yield eid, entry, outcome.commit_tree, commit


def import_entries(memory: Memory, folder: Path | None = None, ids: list[str] | None = None,
                   force: bool = False) -> list[Moved]:
    """Every entry is checked (and its commit built) before any ref or note is written, so
    a refused import changes nothing. An entry whose ref exists with an unreadable note is
    repaired (its note rewritten) when the files give that very commit."""
    store = memory.store
    if folder is not None and not Path(folder).is_dir():
        raise SpecPilotError(f"{folder}: no such folder (import --dir takes the folder that "
                             f"holds <id>.toml and <id>.patch)", code=2)
    files = memory.file_entries(folder)
    moved: list[Moved] = []
    writes: list[tuple[Entry, str, str | None]] = []   # (file entry, commit, old commit)
    with store.private_index() as index, store.writer_lock():
        refs, broken = memory.scan_refs()
        for eid, entry, _tree, commit in replayed_commits(memory, files, index, ids):
            old, bad = refs.get(eid), broken.get(eid)
            old_commit = old.commit if old else (bad.commit if bad else None)
            if old and old.commit == commit and old.raw == entry.raw:
                moved.append(Moved(eid, "unchanged", commit))
                continue
            if bad and bad.commit == commit:
                moved.append(Moved(eid, "repaired", commit))
                writes.append((entry, commit, commit))
                continue
            if old_commit and not force:
                why = (f"its note is unreadable ({bad.reason}) and memory/{eid}.toml gives "
                       f"another commit" if bad else "with different content")
                raise DuplicateIdError(
                    f"entry id {eid!r} already exists in {ENTRY_PREFIX}{eid} {why}; use "
                    f"--force to replace it (the old commit is kept in the attic)")
            moved.append(Moved(eid, "replaced" if old_commit else "created", commit))
            writes.append((entry, commit, old_commit))
        for entry, commit, old_commit in writes:
            if old_commit == commit:  # an unreadable note on the very commit: rewrite it
                store.set_note(commit, entry.raw, entry.meta.git_date())
                continue
            if old_commit:
                _keep_in_attic(memory, entry.id, old_commit)
            store.publish(ENTRY_PREFIX + entry.id, commit, old_commit, entry.raw,
                          entry.meta.git_date(), f"specpilot import {entry.id}")
    return moved


def export_entries(memory: Memory, folder: Path | None = None,
                   ids: list[str] | None = None) -> list[Moved]:
    folder = folder or memory.folder
    refs = memory.ref_entries()
    moved: list[Moved] = []
    with memory.store.private_index() as index:
        replayer = Replayer(memory, refs, index)
        for eid in _closure(refs, replayer.order, ids):
            outcome = replayer.run(eid)
            if not outcome.ok:
                raise SpecPilotError(f"not exported: {outcome.error}")
            paths = write_file_entry(folder, refs[eid].raw, eid, replayer.patches[eid])
            moved.append(Moved(eid, "written", refs[eid].commit, [memory.rel(p) for p in paths]))
    return moved


def _keep_in_attic(memory: Memory, entry_id: str, commit: str) -> None:
    ref = f"{ATTIC_PREFIX}{entry_id}/{commit[:12]}"
    if memory.store.resolve(ref) != commit:
        memory.store.update_ref(ref, commit, None, f"specpilot: keep old {entry_id}")
