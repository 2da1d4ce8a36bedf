"""Issue 21, class 2: no git on the host with a configuration the agent can touch. Real git
repositories and worktrees; an agent that rewrites its worktree's `.git` file to a git dir
of its own (fsmonitor, hooks, a clean filter) gets none of it run on the host, and its
files are still captured; symlinks leaving the tree are refused.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cycle_fixtures import head, project, shared_cache  # noqa: F401

from specpilot import worktrees
from specpilot.config import load_config
from specpilot.cycle.state import System
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore


def _worktree(project: Path, name: str) -> Path:
    return Path(worktrees.new(GitStore(project), name, "HEAD").path)


# -- 2. no git with the agent's configuration ---------------------------------------------

def _evil_git_dir(wt: Path, marker: Path) -> None:
    """What an agent can do in its worktree: point `.git` at a git dir of its own whose
    configuration runs `marker`-touching programs (fsmonitor, hooks, a clean filter)."""
    evil = wt / ".evil"
    subprocess.run(["git", "init", "-q", "--bare", str(evil)], check=True)
    script = evil / "touch-marker"
    script.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 0\n")
    script.chmod(0o755)
    hooks = evil / "hooks"
    for hook in ("post-index-change", "pre-commit", "post-commit", "reference-transaction",
                 "pre-auto-gc", "post-checkout"):
        shutil.copy(script, hooks / hook)
    (evil / "config").write_text(
        f"[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = {wt}\n"
        f"\tfsmonitor = {script}\n\thooksPath = {hooks}\n"
        f"[filter \"evil\"]\n\tclean = {script}\n\tsmudge = {script}\n")
    (wt / ".gitattributes").write_text("* filter=evil\n")
    (wt / ".git").write_text(f"gitdir: {evil}\n")


def _ctx(project: Path, wt: Path):
    class Ctx:   # the slice of AgentContext that commit_worktree reads
        root = project
        cfg = load_config(project)
        base = System(commit=head(project))
        worktree = wt
    return Ctx


def test_capture_never_runs_the_agents_git_config_hooks_or_filters(project, tmp_path):
    from specpilot.agents.context import commit_worktree

    wt = _worktree(project, "gitescape")
    marker = tmp_path / "host-ran-agent-code"
    engine = wt / "stock" / "engine.py"
    engine.write_text(engine.read_text() + "\n# agent's change\n")
    (wt / "stock" / "new_module.py").write_text("VALUE = 1\n")
    (wt / "notes.txt").write_text("not a system path\n")
    _evil_git_dir(wt, marker)

    commit = commit_worktree(_ctx(project, wt), "agent: change")
    assert not marker.exists(), marker.read_text()
    store = GitStore(project)
    assert store.parents(commit) == [head(project)]
    assert store.diff_names(head(project), commit, ["."]) == \
        ["stock/engine.py", "stock/new_module.py"]
    assert "# agent's change" in store.run("show", f"{commit}:stock/engine.py")
    # the worktree's listing runs no git inside it either, and still sees it is dirty
    [listed] = [w for w in worktrees.list_all(store) if w.name == "gitescape"]
    assert listed.dirty is True and not marker.exists()
    worktrees.remove(store, "gitescape", force=True)   # git refuses it; removed anyway
    assert not wt.exists() and not marker.exists()


def test_capture_refuses_symlinks_leaving_the_tree(project):
    from specpilot.agents.context import commit_worktree

    for target in ("/etc/passwd", "../../../../../../etc/passwd"):
        wt = _worktree(project, f"link{len(target)}")
        (wt / "stock" / "leak").symlink_to(target)
        with pytest.raises(SpecPilotError, match="leaves the tree"):
            commit_worktree(_ctx(project, wt), "agent: a link out")
    wt = _worktree(project, "innerlink")                  # a link inside the tree is a file
    (wt / "stock" / "alias.py").symlink_to("engine.py")
    commit = commit_worktree(_ctx(project, wt), "agent: a link in")
    assert GitStore(project).diff_names(head(project), commit, ["."]) == ["stock/alias.py"]
