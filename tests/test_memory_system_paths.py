"""Issue 21, class 4: which paths a patch touches is what git says it touched.

A patch whose headers look like system paths but which `git apply` applies elsewhere (a
plain `--- x/… +++ y/…` section, a binary section under a `diff --git` line without a/ b/
prefixes), or an entry commit that changes more than its patch, must not be reported as
reproduced by verify, the hooks, or `git specpilot replay --worktree`.
"""

import os
import subprocess
import sys

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_forge import (commit_with, drop_refs, with_binary_section,  # noqa: F401
                          with_readme_section)


@pytest.fixture
def files_a(project):
    """Entry a in memory/ only (a fresh clone before import)."""
    def steps(project):
        project.entry("a", {1: "'a'"})
        drop_refs(project)
    return project.build("system-paths-files-a", steps)


FORGERIES = {
    "plain diff section": (with_readme_section, "'README.md'"),
    "binary section": (with_binary_section, "'specpilot/evil.bin'"),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_verify_and_hooks_refuse_what_git_applies_outside_the_system_paths(files_a, forgery):
    forge, path = FORGERIES[forgery]
    forge(files_a)
    result = files_a.specpilot("memory", "verify")
    assert result.exit_code == 1, result.output
    assert f"patch touches {path}, outside the system paths" in result.output
    hook = subprocess.run([sys.executable, "-m", "specpilot.hooks", "ci"], cwd=files_a.path,
                          capture_output=True, text=True, env=os.environ)
    assert hook.returncode == 1, hook.stdout + hook.stderr
    assert "outside the system paths" in hook.stdout


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_replay_worktree_refuses_and_checks_nothing_out(files_a, forgery):
    FORGERIES[forgery][0](files_a)
    wt = files_a.path.parent / "replayed"
    result = files_a.git_specpilot("replay", "a", "--worktree", str(wt))
    assert result.exit_code == 1, result.output
    assert "outside the system paths" in result.output
    assert not wt.exists()


def test_an_entry_commit_that_also_changes_other_paths_does_not_reproduce(chain_ab):
    """The ref keeps its parents and its system tree, but its commit edits README.md: the
    commit `replay --worktree` would check out is not the replayed tree."""
    p = chain_ab
    real = p.git("rev-parse", "refs/specpilot/entries/a")
    note = p.git("notes", "--ref", "refs/notes/specpilot", "show", real) + "\n"
    forged = commit_with(p, real, {"README.md": ("100644", b"# owned\n")}, "work on a")
    # Same parents as the real entry commit (the base), same system tree.
    tree = p.git("rev-parse", f"{forged}^{{tree}}")
    forged = p.git("commit-tree", tree, "-p", p.base, "-m", "work on a")
    p.git("update-ref", "refs/specpilot/entries/a", forged)
    (p.path.parent / "note").write_text(note)
    p.git("notes", "--ref", "refs/notes/specpilot", "add", "-f", "-F",
          str(p.path.parent / "note"), forged)
    result = p.specpilot("memory", "verify", "--source", "refs")
    assert result.exit_code == 1, result.output
    assert "is not its replayed tree (it also changes README.md)" in result.output
    wt = p.path.parent / "replayed"
    replay = p.git_specpilot("replay", "a", "--worktree", str(wt))
    assert replay.exit_code == 1 and not wt.exists(), replay.output
