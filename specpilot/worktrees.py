"""Worktrees for sub-agents: `.specpilot/worktrees/NAME` on branch `specpilot/NAME`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore

WORKTREES_DIR = Path(".specpilot") / "worktrees"
BRANCH_PREFIX = "specpilot/"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class Worktree:
    name: str
    path: str
    branch: str | None
    head: str | None
    dirty: bool | None      # None: the folder is missing (a stale worktree)
    locked: bool = False

    def to_json(self) -> dict:
        return self.__dict__.copy()


def _main_root(store: GitStore) -> Path:
    """The main worktree's root: every sub-agent worktree lives under it."""
    return store.common_dir.parent if store.common_dir.name == ".git" else store.root


def _check_name(name: str) -> None:
    if not NAME.match(name):
        raise SpecPilotError(f"{name!r} is not a valid worktree name", code=2)


def new(store: GitStore, name: str, from_ref: str = "HEAD") -> Worktree:
    _check_name(name)
    path = _main_root(store) / WORKTREES_DIR / name
    branch = BRANCH_PREFIX + name
    if path.exists():
        raise SpecPilotError(f"worktree {name!r} already exists at {path}")
    if store.resolve(f"refs/heads/{branch}"):
        raise SpecPilotError(f"branch {branch} already exists; pick another name or "
                             f"delete the branch")
    start = store.must_resolve(from_ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.run("worktree", "add", "-b", branch, str(path), start)
    return Worktree(name, str(path), branch, start, False)


def list_all(store: GitStore) -> list[Worktree]:
    base = (_main_root(store) / WORKTREES_DIR).resolve()
    found: list[Worktree] = []
    for block in store.run("worktree", "list", "--porcelain").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" not in fields:
            continue
        path = Path(fields["worktree"])
        if path.parent.resolve() != base:
            continue
        branch = fields.get("branch", "").removeprefix("refs/heads/") or None
        dirty = None
        if path.is_dir():
            dirty = bool(GitStore(path).run("status", "--porcelain").strip())
        found.append(Worktree(path.name, str(path), branch, fields.get("HEAD"), dirty,
                              "locked" in fields))
    return found


def remove(store: GitStore, name: str, force: bool = False) -> Worktree:
    _check_name(name)
    match = [w for w in list_all(store) if w.name == name]
    if not match:
        raise SpecPilotError(f"no worktree {name!r} (see `specpilot worktree list`)", code=2)
    tree = match[0]
    if tree.dirty and not force:
        raise SpecPilotError(f"worktree {name!r} has uncommitted changes; commit them, or "
                             f"remove it with --force (its branch {tree.branch} is kept)")
    args = ["worktree", "remove"] + (["--force", "--force"] if force else []) + [tree.path]
    if tree.dirty is None:
        store.run("worktree", "prune")
    else:
        store.run(*args)
    return tree


def prune(store: GitStore) -> list[Worktree]:
    """Forget worktrees whose folders are gone; returns those forgotten."""
    stale = [w for w in list_all(store) if w.dirty is None]
    store.run("worktree", "prune")
    return stale
