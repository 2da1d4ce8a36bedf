"""What `specpilot serve --system NAME` names: a commit and the option values it runs with.

- `best`: the cycle's last validated system (refs/specpilot/best) with its options
  (.specpilot/runs/best.json), as `specpilot validate` left them;
- a memory entry's id: its entry commit (stock with its dependencies and itself applied)
  with the tuned values of its options and its dependencies' (the entry's own last);
- anything else git resolves to a commit (a branch, a tag, a run's candidate), no options.

`--opt` on the command line overrides any of these values.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.cycle.types import BEST_REF
from specpilot.cycle.validate import best_options
from specpilot.errors import SpecPilotError
from specpilot.memory.dag import ancestors, topo_order
from specpilot.memory.store import Memory


@dataclass
class Named:
    commit: str
    options: dict[str, str] = field(default_factory=dict)
    what: str = ""     # one line for the ready message: "memory entry tree-verify", ...


def named_system(memory: Memory, name: str) -> Named:
    store = memory.store
    if name == "best":
        commit = store.resolve(BEST_REF)
        if commit is None:
            raise SpecPilotError("no validated system yet (refs/specpilot/best): "
                                 "`specpilot explore` makes one", code=2)
        return Named(commit, {k: _text(v) for k, v in best_options(memory.root).items()},
                     "the validated best system")
    entries = memory.ref_entries()
    if name in entries:
        entry = entries[name]
        deps = {k: v.meta.deps for k, v in entries.items()}
        below = ancestors(deps, name)
        chain = [e for e in topo_order(deps) if e == name or e in below]
        options: dict[str, str] = {}
        for eid in chain:
            for spec in entries[eid].meta.options:
                if spec.tuned is not None:
                    options[spec.name] = _text(spec.tuned)
        return Named(entry.commit, options, f"memory entry {name}")
    if name in memory.file_entries():
        raise SpecPilotError(f"memory entry {name!r} is in memory/ but not in refs: "
                             f"`specpilot memory import` first", code=2)
    commit = store.resolve(name)
    if commit is None:
        raise SpecPilotError(f"--system {name!r}: not 'best', a memory entry or a commit "
                             f"(`specpilot memory list` lists the entries)", code=2)
    return Named(commit, {}, f"commit {commit[:12]}")


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def option_values(opts_file: str | None, opts: tuple[str, ...]) -> dict[str, str]:
    """--opts-file then --opt as raw values: the named system's own registry checks them
    (its entries may define options this checkout's stock does not know)."""
    values: dict[str, str] = {}
    if opts_file:
        try:
            data = tomllib.loads(Path(opts_file).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SpecPilotError(f"options file {opts_file}: {exc}", code=2) from None
        data = data.get("options", data)
        values.update({k: _text(v) for k, v in data.items()})
    for pair in opts:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise SpecPilotError(f"--opt: expected name=value, got {pair!r}", code=2)
        values[name.strip()] = value
    return values


def resolve_named(name: str, opts_file: str | None, opts: tuple[str, ...]
                  ) -> tuple[Memory, Named, dict[str, str]]:
    """What `--system NAME` with --opts-file and --opt serve: the project's memory, the
    named system and its option values (its own, then the file's, then the command line's).
    Imports neither torch nor the server: a name or an options file that is wrong is a
    one-line error before either loads (`specpilot serve` asks this first)."""
    memory = Memory()
    named = named_system(memory, name)
    return memory, named, {**named.options, **option_values(opts_file, opts)}
