"""`specpilot worktree new|list|rm|prune`."""

import json
import shutil

from memory_fixtures import *  # noqa: F401,F403


def test_new_creates_a_worktree_on_its_own_branch(project):
    result = project.specpilot("worktree", "new", "fast-attn", "--json")
    assert result.exit_code == 0, result.output
    path = project.path / ".specpilot/worktrees/fast-attn"
    assert (path / "stock/engine.py").is_file()
    assert project.git("-C", str(path), "rev-parse", "--abbrev-ref", "HEAD") == "specpilot/fast-attn"
    assert json.loads(result.output)["branch"] == "specpilot/fast-attn"


def test_new_from_a_ref(project):
    other = project.make_commit(project.base, {"stock/x.py": "1\n"}, "other", branch="other")
    project.specpilot("worktree", "new", "w", "--from", "other")
    assert project.git("-C", ".specpilot/worktrees/w", "rev-parse", "HEAD") == other


def test_new_refuses_an_existing_name(project):
    project.specpilot("worktree", "new", "w")
    result = project.specpilot("worktree", "new", "w")
    assert result.exit_code == 1 and "already exists" in result.output


def test_list_shows_clean_and_dirty(project):
    project.specpilot("worktree", "new", "clean")
    project.specpilot("worktree", "new", "dirty")
    (project.path / ".specpilot/worktrees/dirty/stock/engine.py").write_text("x\n")
    data = json.loads(project.specpilot("worktree", "list", "--json").output)
    assert {w["name"]: w["dirty"] for w in data} == {"clean": False, "dirty": True}


def test_rm_refuses_a_dirty_worktree_unless_forced(project):
    project.specpilot("worktree", "new", "w")
    path = project.path / ".specpilot/worktrees/w"
    (path / "stock/new.py").write_text("x\n")
    result = project.specpilot("worktree", "rm", "w")
    assert result.exit_code == 1 and "uncommitted changes" in result.output
    assert path.exists()
    assert project.specpilot("worktree", "rm", "w", "--force").exit_code == 0
    assert not path.exists()
    assert project.git("rev-parse", "--verify", "specpilot/w")  # the branch is kept


def test_rm_a_clean_worktree(project):
    project.specpilot("worktree", "new", "w")
    assert project.specpilot("worktree", "rm", "w").exit_code == 0
    assert project.specpilot("worktree", "list").output.strip() == "(no worktrees)"


def test_prune_forgets_worktrees_whose_folder_is_gone(project):
    project.specpilot("worktree", "new", "gone")
    project.specpilot("worktree", "new", "kept")
    shutil.rmtree(project.path / ".specpilot/worktrees/gone")
    data = json.loads(project.specpilot("worktree", "list", "--json").output)
    assert {w["name"]: w["dirty"] for w in data} == {"gone": None, "kept": False}
    result = project.specpilot("worktree", "prune")
    assert "pruned gone" in result.output
    assert [w["name"] for w in json.loads(project.specpilot("worktree", "list", "--json").output)] == ["kept"]
