"""`specpilot memory verify`: replay every entry and say whether it reproduces.

Both forms are checked where present: the refs + notes (what `git specpilot replay`
uses) and the portable `memory/` folder (what a fresh clone has). Where an entry is in
both, the note must hold the bytes of `memory/<id>.toml` and the regenerated diff must be
the bytes of `memory/<id>.patch`; otherwise one of them was altered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot.errors import SpecPilotError
from specpilot.memory.replay import Outcome, Replayer
from specpilot.memory.store import Memory


@dataclass
class Report:
    outcomes: list[tuple[str, Outcome]] = field(default_factory=list)  # (source, outcome)

    @property
    def ok(self) -> bool:
        return all(o.ok for _s, o in self.outcomes)

    def to_json(self) -> dict:
        return {"ok": self.ok, "checked": len(self.outcomes),
                "entries": [{"source": s, **o.to_json()} for s, o in self.outcomes]}


def verify(memory: Memory, source: str = "all", ids: list[str] | None = None) -> Report:
    report = Report()
    sources = ["refs", "files"] if source == "all" else [source]
    replayers: dict[str, Replayer] = {}
    with memory.store.private_index() as index:
        for name in sources:
            entries = memory.entries(name)
            if not entries:
                continue
            replayer = Replayer(memory, entries, index)
            replayers[name] = replayer
            wanted = [i for i in ids if i in entries] if ids else replayer.order
            for eid in wanted:
                report.outcomes.append((name, replayer.run(eid)))
        missing = [i for i in ids or [] if not any(i in r.entries for r in replayers.values())]
        if missing:
            raise SpecPilotError(f"no memory entry {missing[0]!r}", code=2)
        if len(replayers) == 2:
            _cross_check(memory, replayers["refs"], replayers["files"], report)
    return report


def _cross_check(memory: Memory, refs: Replayer, files: Replayer, report: Report) -> None:
    for eid in sorted(set(refs.entries) & set(files.entries)):
        if not (refs.outcomes.get(eid) and files.outcomes.get(eid)):
            continue
        note, file = refs.entries[eid], files.entries[eid]
        problem = None
        if note.raw != file.raw:
            problem = f"the note on {note.origin} differs from {file.origin}"
        elif eid in refs.patches and refs.patches[eid] != file.patch:
            problem = f"the diff of {note.origin} differs from memory/{eid}.patch"
        if problem:
            report.outcomes.append(("both", Outcome(
                eid, "failed", note.meta.source_tree,
                error=f"entry {eid!r}: {problem} (run `specpilot memory export` or "
                      f"`specpilot memory import --force` to make them agree)")))
