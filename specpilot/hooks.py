"""The logic behind hooks/: `python -m specpilot.hooks pre-commit|pre-push|ci`.

- pre-commit: every staged `memory/*.toml` must match the entry schema, be named for its
  id, and agree with its staged `.patch` (sha256).
- pre-push and ci: `specpilot memory verify`; any entry that does not reproduce fails.
  A repository with no entries passes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.memory.entry import EntryMeta
from specpilot.memory.patches import sha256
from specpilot.memory.store import MEMORY_DIR, Memory
from specpilot.memory.verify import verify


def pre_commit(memory: Memory) -> list[str]:
    """Problems with the staged memory/*.toml files (empty: all good)."""
    store = memory.store
    staged = store.run("diff", "--cached", "--name-only", "-z", "--diff-filter=ACMR",
                       "--", f"{MEMORY_DIR}/")
    problems = []
    for name in filter(None, staged.split("\0")):
        path = Path(name)
        if path.suffix != ".toml" or path.parent.name != MEMORY_DIR:
            continue
        try:
            meta = EntryMeta.from_toml(store.call("show", f":{name}").out, name)
            if meta.id != path.stem:
                raise SpecPilotError(f"{name}: file name does not match its id {meta.id!r}")
            patch = store.call("show", f":{path.with_suffix('.patch')}")
            if patch.rc != 0:
                raise SpecPilotError(f"{name}: {path.stem}.patch is not staged beside it")
            if sha256(patch.out) != meta.patch_sha256:
                raise SpecPilotError(f"{name}: the staged {path.stem}.patch does not match "
                                     f"its patch_sha256")
        except SpecPilotError as exc:
            problems.append(str(exc))
    return problems


def run_verify(memory: Memory) -> int:
    report = verify(memory)
    if not report.outcomes:
        print("specpilot: no memory entries; nothing to verify")
        return 0
    for source, outcome in report.outcomes:
        line = f"{outcome.status:10} {outcome.id} ({source})"
        print(line if outcome.ok else f"{line}: {outcome.error}")
    if report.ok:
        print(f"specpilot: {len(report.outcomes)} checks, all reproduce")
        return 0
    print("specpilot: some memory entries do not reproduce", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("pre-commit", "pre-push", "ci"):
        print("usage: python -m specpilot.hooks pre-commit|pre-push|ci", file=sys.stderr)
        return 2
    try:
        memory = Memory(Path.cwd())
        if argv[0] == "pre-commit":
            problems = pre_commit(memory)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 1 if problems else 0
        return run_verify(memory)
    except SpecPilotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
