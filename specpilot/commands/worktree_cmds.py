"""`specpilot worktree new|list|rm|prune`: the folders sub-agents work in."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specpilot import worktrees
from specpilot.gitstore import GitStore

JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _emit(as_json: bool, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


@click.group("worktree")
def worktree_group():
    """Worktrees under .specpilot/worktrees/, one branch specpilot/NAME each."""


@worktree_group.command("new")
@click.argument("name")
@click.option("--from", "from_ref", default="HEAD", show_default=True)
@JSON
def new_cmd(name, from_ref, as_json):
    """Create .specpilot/worktrees/NAME on a new branch specpilot/NAME."""
    tree = worktrees.new(GitStore(Path.cwd()), name, from_ref)
    _emit(as_json, tree.to_json(), f"created {tree.path} on {tree.branch}")


@worktree_group.command("list")
@JSON
def list_cmd(as_json):
    """List SpecPilot worktrees (dirty, clean, or stale: folder gone)."""
    trees = worktrees.list_all(GitStore(Path.cwd()))
    state = {True: "dirty", False: "clean", None: "stale"}
    _emit(as_json, [t.to_json() for t in trees],
          "\n".join(f"{t.name:<24} {state[t.dirty]:<6} {t.branch or '(detached)':<32} {t.path}"
                    for t in trees) or "(no worktrees)")


@worktree_group.command("rm")
@click.argument("name")
@click.option("--force", is_flag=True, help="Remove even with uncommitted changes.")
@JSON
def rm_cmd(name, force, as_json):
    """Remove a worktree (its branch is kept); refuses a dirty one unless --force."""
    tree = worktrees.remove(GitStore(Path.cwd()), name, force)
    _emit(as_json, tree.to_json(), f"removed {tree.path} (branch {tree.branch} kept)")


@worktree_group.command("prune")
@JSON
def prune_cmd(as_json):
    """Forget worktrees whose folders were deleted."""
    stale = worktrees.prune(GitStore(Path.cwd()))
    _emit(as_json, [t.to_json() for t in stale],
          "\n".join(f"pruned {t.name}" for t in stale) or "nothing to prune")


def register(cli: click.Group) -> None:
    cli.add_command(worktree_group)
