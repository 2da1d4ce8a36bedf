"""Replay and verify never touch the user's working tree, index or HEAD."""

from memory_fixtures import *  # noqa: F401,F403
from specpilot.memory.verify import verify


def test_dirty_tree_and_index_are_byte_identical_after_replay_and_verify(project):
    project.entry("a", {1: "'a'"})
    project.entry("b", {10: "'b'"}, ["a"])
    project.entry("c", {20: "'c'"}, ["a"])
    project.git("add", "-A")
    project.git("commit", "-qm", "memory files")
    # Staged and unstaged changes, an untracked file, and a system file both staged and
    # edited again after staging.
    project.write("stock/engine.py", "staged = 1\n")
    project.git("add", "stock/engine.py")
    project.write("stock/engine.py", "unstaged = 2\n")
    project.write("kernels/gemm.py", "dirty = 3\n")
    project.write("stock/untracked.py", "new = 4\n")
    before = snapshot(project.path)
    assert "MM stock/engine.py" in before["<status>"]

    assert verify(project.memory()).ok
    for entry in ("a", "b", "c"):
        assert project.git_specpilot("replay", entry).exit_code == 0
    assert project.git_specpilot("replay", "c", "--onto", "HEAD").exit_code == 0
    assert project.specpilot("memory", "verify").exit_code == 0

    assert snapshot(project.path) == before
