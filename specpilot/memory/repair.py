"""`specpilot memory repair`: the way back from an entry ref whose note is missing or
unreadable (every other memory command refuses to run past one).

For each such ref, the note is restored from `memory/<id>.toml` when those files give the
very commit the ref holds (the same check `import` makes: the entry reproduces, its patch is
canonical, and the commit rebuilt from the file is the ref's commit). Anything else is
refused before a note or ref is written, with what to do instead: restore the file, use
`import --force` (the file's version replaces the entry), or `--drop ID`, which moves the
entry's ref to `refs/specpilot/attic/<id>/<sha>` (its commit stays reachable).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.gitstore import ATTIC_PREFIX
from specpilot.memory.portable import _keep_in_attic, replayed_commits
from specpilot.memory.store import Memory


@dataclass
class Repaired:
    id: str
    action: str          # restored | dropped
    commit: str
    reason: str          # what was wrong with the note

    def to_json(self) -> dict:
        return self.__dict__.copy()


def repair(memory: Memory, folder: Path | None = None,
           drop: list[str] | None = None) -> list[Repaired]:
    store = memory.store
    folder = Path(folder) if folder is not None else memory.folder
    drop = list(dict.fromkeys(drop or []))
    with store.private_index() as index, store.writer_lock():
        entries, broken = memory.scan_refs()
        for eid in drop:
            if eid not in broken:
                raise SpecPilotError(f"--drop {eid}: " + (
                    "its note reads fine; only entries with an unreadable note are dropped"
                    if eid in entries else f"no entry ref {eid!r}"), code=2)
            users = sorted(e.id for e in entries.values() if eid in e.meta.deps)
            if users:
                raise SpecPilotError(f"--drop {eid}: {', '.join(users)} depend(s) on it",
                                     code=2)
        restore = [eid for eid in sorted(broken) if eid not in drop]
        files = memory.file_entries(folder) if restore else {}
        for eid in restore:
            if eid not in files:
                raise SpecPilotError(
                    f"{broken[eid].reason}; {memory.rel(folder)}/{eid}.toml is missing, so the "
                    f"note cannot be restored: restore the file (e.g. from git history) and "
                    f"run repair again, or `specpilot memory repair --drop {eid}` moves the "
                    f"entry to {ATTIC_PREFIX}{eid}/")
        rebuilt = {eid: (entry, commit) for eid, entry, _tree, commit
                   in replayed_commits(memory, files, index, restore, "restored")}
        for eid in restore:
            commit = rebuilt[eid][1]
            if commit != broken[eid].commit:
                raise SpecPilotError(
                    f"{broken[eid].reason}; {memory.rel(folder)}/{eid}.toml describes commit "
                    f"{commit[:12]}, not the ref's {broken[eid].commit[:12]}, so it is not "
                    f"that entry's note: `specpilot memory import --force {eid}` replaces the "
                    f"entry with the file's version (the old commit goes to the attic)")
        done = []
        for eid in restore:
            entry, commit = rebuilt[eid]
            store.set_note(commit, entry.raw, entry.meta.git_date())
            done.append(Repaired(eid, "restored", commit, broken[eid].reason))
        for eid in drop:
            bad = broken[eid]
            _keep_in_attic(memory, eid, bad.commit)
            store.delete_ref(bad.ref, bad.commit)
            done.append(Repaired(eid, "dropped", bad.commit, bad.reason))
    return done
