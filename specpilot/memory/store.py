"""Where entries live: refs + notes in git, or the portable `memory/` folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpilot.config import load_config
from specpilot.errors import SpecPilotError
from specpilot.gitstore import ENTRY_PREFIX, GitStore
from specpilot.memory.dag import DuplicateIdError
from specpilot.memory.entry import EntryMeta, SchemaError

MEMORY_DIR = "memory"


@dataclass
class Entry:
    meta: EntryMeta
    raw: bytes                 # the exact TOML bytes (note text or file content)
    origin: str                # "memory/<id>.toml" or "refs/specpilot/entries/<id>"
    patch: bytes | None = None  # files: the .patch bytes; refs: regenerated on replay
    commit: str | None = None   # refs: the entry commit

    @property
    def id(self) -> str:
        return self.meta.id


@dataclass
class Broken:
    """An entry ref whose note is missing or cannot be read."""

    id: str
    ref: str
    commit: str
    reason: str


class Memory:
    """One project's memory: its git store, system paths and `memory/` folder."""

    def __init__(self, root: Path | str | None = None):
        self.store = GitStore(root or Path.cwd())
        self.root = self.store.root
        self.config = load_config(self.root)
        self.system_paths = list(self.config.system_paths)
        self.folder = self.root / MEMORY_DIR

    # -- refs + notes -----------------------------------------------------------------

    def ref_entries(self) -> dict[str, Entry]:
        """Every entry in refs + notes; the first unreadable note is an error that says how
        to recover (`specpilot memory repair`)."""
        entries, broken = self.scan_refs()
        if broken:
            first = broken[min(broken)]
            raise SchemaError(f"{first.reason}; `specpilot memory repair` restores the note "
                              f"from memory/{first.id}.toml")
        return entries

    def scan_refs(self) -> tuple[dict[str, Entry], dict[str, "Broken"]]:
        """(readable entries, {id: Broken} for refs whose note is missing or unreadable)."""
        refs = self.store.refs(ENTRY_PREFIX.rstrip("/"))
        notes = self.store.notes()
        blobs = self.store.read_blobs(sorted({notes[c] for c in refs.values() if c in notes}))
        entries: dict[str, Entry] = {}
        broken: dict[str, Broken] = {}
        for ref, commit in sorted(refs.items()):
            entry_id = ref[len(ENTRY_PREFIX):]
            if commit not in notes:
                broken[entry_id] = Broken(entry_id, ref, commit, (
                    f"{ref}: entry commit {commit[:12]} has no note in refs/notes/specpilot "
                    f"(fetch the notes ref)"))
                continue
            raw = blobs[notes[commit]]
            try:
                meta = EntryMeta.from_toml(raw, f"note on {ref}")
                if meta.id != entry_id:
                    raise SchemaError(f"{ref}: its note names the entry {meta.id!r}")
            except SchemaError as exc:
                broken[entry_id] = Broken(entry_id, ref, commit, str(exc))
                continue
            entries[entry_id] = Entry(meta, raw, ref, commit=commit)
        return entries, broken

    # -- memory/ folder ---------------------------------------------------------------

    def file_entries(self, folder: Path | None = None) -> dict[str, Entry]:
        folder = folder or self.folder
        entries: dict[str, Entry] = {}
        if not folder.is_dir():
            return entries
        for path in sorted(folder.glob("*.toml")):
            entry = read_file_entry(path)
            if entry.id in entries:
                raise DuplicateIdError(
                    f"duplicate entry id {entry.id!r}: {entries[entry.id].origin} and {path.name}")
            entries[entry.id] = entry
        for entry in entries.values():
            stem = Path(entry.origin).stem
            if stem != entry.id:
                raise SchemaError(f"{entry.origin}: file name does not match its id {entry.id!r}")
        return entries

    def entries(self, source: str) -> dict[str, Entry]:
        if source == "refs":
            return self.ref_entries()
        if source == "files":
            return self.file_entries()
        raise SpecPilotError(f"unknown source {source!r} (refs or files)", code=2)

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)


def read_file_entry(path: Path) -> Entry:
    raw = path.read_bytes()
    meta = EntryMeta.from_toml(raw, f"{MEMORY_DIR}/{path.name}")
    patch_path = path.with_suffix(".patch")
    if not patch_path.is_file():
        raise SpecPilotError(f"{MEMORY_DIR}/{path.name}: its patch {patch_path.name} is missing")
    return Entry(meta, raw, f"{MEMORY_DIR}/{path.name}", patch=patch_path.read_bytes())


def write_file_entry(folder: Path, meta_raw: bytes, entry_id: str, patch: bytes) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, data in ((".toml", meta_raw), (".patch", patch)):
        path = folder / f"{entry_id}{suffix}"
        if not path.exists() or path.read_bytes() != data:
            tmp = path.with_suffix(suffix + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        written.append(path)
    return written
