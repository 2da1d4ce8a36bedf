"""`specpilot init`: make a repository ready for memory entries. Running it twice changes
nothing.

- writes `.specpilot/config.toml` if missing (system paths `stock`, `kernels`) and, unless
  they are ignored already, a `.specpilot/.gitignore` for the state folders;
- adds fetch and push refspecs for `refs/specpilot/*` and `refs/notes/specpilot` to every
  remote (git moves neither by default); where a remote had no push refspec, `HEAD` is
  added first so that a plain `git push` still pushes the current branch;
- sets `notes.rewriteRef` so amend and rebase carry SpecPilot notes along;
- installs the pre-commit and pre-push hooks (never overwriting a hook it did not write);
- where the config names no sealed request file, generates the sealed requests of the
  embedded default outside the repository (`specpilot.requests.sealed.ensure_sealed`: a secret seed and
  the requests, mode 0600, under `$SPECPILOT_SEALED_DIR` or the user's data dir).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from specpilot.config import CONFIG_RELPATH, load_config
from specpilot.gitstore import NOTES_REF, GitStore

FETCH = ["refs/specpilot/*:refs/specpilot/*", f"{NOTES_REF}:{NOTES_REF}"]
PUSH = ["refs/specpilot/*:refs/specpilot/*", f"{NOTES_REF}:{NOTES_REF}"]
HOOKS = ("pre-commit", "pre-push")
MARKER = "specpilot-managed hook"
DEFAULT_CONFIG = """\
# SpecPilot deployment configuration (committed). State folders runs/, worktrees/, cache/
# beside this file are git-ignored.
schema_version = 1

# The only paths a memory entry may change; tree hashes for reproduction cover these.
system_paths = ["stock", "kernels"]
"""
STATE_IGNORE = "runs/\nworktrees/\ncache/\n"


def init(path: Path | str = ".") -> list[str]:
    """Returns what it changed, one line each (empty when everything was in place)."""
    store = GitStore(path)
    changes: list[str] = []
    changes += _write_if_missing(store.root / CONFIG_RELPATH, DEFAULT_CONFIG)
    if store.call("check-ignore", "-q", ".specpilot/worktrees/x").rc != 0:
        changes += _write_if_missing(store.root / ".specpilot" / ".gitignore", STATE_IGNORE)
    for remote in store.remotes():
        changes += _add_values(store, f"remote.{remote}.fetch", FETCH)
        push_key = f"remote.{remote}.push"
        if not store.config_get_all(push_key):
            changes += _add_values(store, push_key, ["HEAD"])
        changes += _add_values(store, push_key, PUSH)
    changes += _add_values(store, "notes.rewriteRef", [NOTES_REF])
    for name in HOOKS:
        changes += _install_hook(store, name)
    changes += _ensure_sealed(store.root)
    return changes


def _ensure_sealed(root: Path) -> list[str]:
    # lazy: CLI startup time (specpilot.requests reads the dev set; init loads at every start)
    from specpilot.requests.sealed import default_sealed_dir, ensure_sealed

    if load_config(root).requests.sealed:
        return []  # the user brings their own sealed requests
    folder = default_sealed_dir()
    if (folder / "sealed_requests.jsonl").is_file():
        return []
    return [f"generated sealed requests in {ensure_sealed(folder).parent} (outside the repository)"]


def _write_if_missing(path: Path, text: str) -> list[str]:
    if path.exists():
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return [f"wrote {path}"]


def _add_values(store: GitStore, key: str, values: list[str]) -> list[str]:
    have = store.config_get_all(key)
    changes = []
    for value in values:
        if value not in have and f"+{value}" not in have:
            store.config_add(key, value)
            changes.append(f"git config --add {key} {value}")
    return changes


def hook_text(name: str) -> str:
    python = shlex.quote(sys.executable)
    return (
        "#!/bin/sh\n"
        f"# {MARKER}: written by `specpilot init`; runs the project's hooks/{name},\n"
        "# or SpecPilot's own when the project has none.\n"
        f"SPECPILOT_PYTHON=\"${{SPECPILOT_PYTHON:-{python}}}\"\n"
        "export SPECPILOT_PYTHON\n"
        'root=$(git rev-parse --show-toplevel) || exit 1\n'
        f'if [ -x "$root/hooks/{name}" ]; then exec "$root/hooks/{name}" "$@"; fi\n'
        f'exec "$SPECPILOT_PYTHON" -m specpilot.hooks {name} "$@"\n'
    )


def _install_hook(store: GitStore, name: str) -> list[str]:
    folder = store.hooks_dir()
    path = folder / name
    text = hook_text(name)
    if path.exists():
        current = path.read_text(errors="replace")
        if current == text:
            return []
        if MARKER not in current:
            return [f"kept your own {path}; call hooks/{name} from it to add SpecPilot's checks"]
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return [f"installed {path}"]
