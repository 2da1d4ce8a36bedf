"""Worktrees for sub-agents: `.specpilot/worktrees/NAME` on branch `specpilot/NAME`.

An agent may have rewritten anything in its worktree, its `.git` file included, so git is
never run inside one from here: whether it is dirty is its files captured by the project's
own repository (GitStore.capture_tree) against its HEAD as the project's git records it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitError, GitStore

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
            dirty = _dirty(store, path, fields.get("HEAD"))
        found.append(Worktree(path.name, str(path), branch, fields.get("HEAD"), dirty,
                              "locked" in fields))
    return found


def _dirty(store: GitStore, path: Path, head: str | None) -> bool:
    """Do the worktree's files (tracked or not, as its .gitignore says) differ from HEAD?"""
    if not head:
        return True
    try:
        return store.capture_tree(path, ["."], head, strict=False) != store.tree_of(head)
    except SpecPilotError:
        return True


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
        return tree
    res = store.call(*args)
    if res.rc != 0 and not force:
        raise GitError(f"git worktree remove: {res.err.strip()}")
    if res.rc != 0:
        # git refuses a worktree whose `.git` file no longer points back (an agent may
        # rewrite it): delete the folder without following its links, then forget it
        shutil.rmtree(tree.path)
        store.run("worktree", "prune")
    return tree


def prune(store: GitStore) -> list[Worktree]:
    """Forget worktrees whose folders are gone; returns those forgotten."""
    stale = [w for w in list_all(store) if w.dirty is None]
    store.run("worktree", "prune")
    return stale
