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


def import_entries(memory: Memory, folder: Path | None = None, ids: list[str] | None = None,
                   force: bool = False) -> list[Moved]:
    store = memory.store
    files = memory.file_entries(folder)
    refs = memory.ref_entries()
    moved: list[Moved] = []
    with store.private_index() as index, store.writer_lock():
        replayer = Replayer(memory, files, index)
        commits: dict[str, str] = {}
        for eid in _closure(files, replayer.order, ids):
            entry = files[eid]
            outcome = replayer.run(eid)
            if not outcome.ok:
                raise SpecPilotError(f"not imported: {outcome.error}")
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
            old = refs.get(eid)
            if old and old.commit == commit and old.raw == entry.raw:
                moved.append(Moved(eid, "unchanged", commit))
                continue
            if old and not force:
                raise DuplicateIdError(
                    f"entry id {eid!r} already exists in {ENTRY_PREFIX}{eid} with different "
                    f"content; use --force to replace it (the old commit is kept in the attic)")
            if old and old.commit != commit:
                _keep_in_attic(memory, eid, old.commit)
            store.set_note(commit, entry.raw, meta.git_date())
            store.update_ref(ENTRY_PREFIX + eid, commit, old.commit if old else None,
                             f"specpilot import {eid}")
            moved.append(Moved(eid, "replaced" if old else "created", commit))
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
