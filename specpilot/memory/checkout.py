"""Replay one entry for `git specpilot replay`, and optionally check the result out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.memory.replay import Outcome, Replayer
from specpilot.memory.store import Memory


@dataclass
class Replayed:
    outcome: Outcome
    source: str                       # refs | files
    onto: str | None
    per_path: list[dict]              # {path, recorded, replayed}
    worktree: str | None = None
    commit: str | None = None

    def to_json(self) -> dict:
        return {"source": self.source, "onto": self.onto, "worktree": self.worktree,
                "commit": self.commit, "paths": self.per_path, **self.outcome.to_json()}


def replay_one(memory: Memory, entry_id: str, onto: str | None = None,
               worktree: Path | None = None) -> Replayed:
    store = memory.store
    refs = memory.ref_entries()
    source, entries = ("refs", refs) if entry_id in refs else ("files", memory.file_entries())
    if entry_id not in entries:
        raise SpecPilotError(f"no memory entry {entry_id!r} (in refs or memory/; "
                             f"run `specpilot memory import` after a fresh clone)", code=2)
    onto_sha = store.must_resolve(onto) if onto else None
    if worktree is not None and Path(worktree).exists():
        raise SpecPilotError(f"{worktree} already exists", code=2)
    with store.private_index() as index, store.private_index() as onto_index:
        original = Replayer(memory, entries, index)
        replayer = original
        if onto_sha:
            replayer = Replayer(memory, entries, onto_index, onto=onto_sha, patches_from=original)
        outcome = replayer.run(entry_id)
    entry = entries[entry_id]
    recorded_tree = entry.commit or store.resolve(f"refs/specpilot/entries/{entry_id}")
    per_path = []
    for path in memory.system_paths:
        row = {"path": path, "recorded": None, "replayed": None}
        if recorded_tree:
            row["recorded"] = store.system_tree(recorded_tree, [path])
        if outcome.commit_tree:
            row["replayed"] = store.system_tree(outcome.commit_tree, [path])
        per_path.append(row)
    result = Replayed(outcome, source, onto_sha, per_path)
    if worktree is not None and outcome.commit_tree:
        if outcome.ok and not onto_sha and entry.commit:
            commit = entry.commit
        else:
            parent = onto_sha or entry.meta.base
            commit = store.commit_tree(outcome.commit_tree, [parent],
                                       f"specpilot replay of {entry_id}\n",
                                       entry.meta.git_date())
        store.run("worktree", "add", "--detach", str(worktree), commit)
        result.worktree, result.commit = str(Path(worktree).resolve()), commit
    return result
