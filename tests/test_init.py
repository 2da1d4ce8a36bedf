"""`specpilot init`: config, refspecs, notes.rewriteRef and hooks; idempotent."""

import os
import subprocess

from memory_fixtures import *  # noqa: F401,F403


def config(project, key):
    return project.git("config", "--get-all", key, check=False).splitlines()


def test_init_sets_everything_up(project, tmp_path):
    (project.path / ".specpilot/config.toml").unlink()
    project.git("remote", "add", "origin", str(tmp_path / "remote.git"))
    project.git("remote", "add", "mirror", str(tmp_path / "mirror.git"))
    result = project.specpilot("init")
    assert result.exit_code == 0, result.output
    assert 'system_paths = ["stock", "kernels"]' in (project.path / ".specpilot/config.toml").read_text()
    for remote in ("origin", "mirror"):
        assert config(project, f"remote.{remote}.fetch")[1:] == [
            "refs/specpilot/*:refs/specpilot/*", "refs/notes/specpilot:refs/notes/specpilot"]
        assert config(project, f"remote.{remote}.push") == [
            "HEAD", "refs/specpilot/*:refs/specpilot/*",
            "refs/notes/specpilot:refs/notes/specpilot"]
    assert config(project, "notes.rewriteRef") == ["refs/notes/specpilot"]
    assert project.git("check-ignore", ".specpilot/worktrees/a", ".specpilot/runs/b").split() \
        == [".specpilot/worktrees/a", ".specpilot/runs/b"]
    for hook in ("pre-commit", "pre-push"):
        text = (project.path / ".git/hooks" / hook).read_text()
        assert "specpilot-managed hook" in text and f"specpilot.hooks {hook}" in text


def test_init_twice_changes_nothing(project, tmp_path):
    project.git("remote", "add", "origin", str(tmp_path / "remote.git"))
    project.specpilot("init")
    before = (project.path / ".git/config").read_text()
    hooks = {p.name: p.read_bytes() for p in (project.path / ".git/hooks").iterdir()}
    result = project.specpilot("init", "--json")
    assert result.exit_code == 0 and '"changes": []' in result.output
    assert (project.path / ".git/config").read_text() == before
    assert {p.name: p.read_bytes() for p in (project.path / ".git/hooks").iterdir()} == hooks


def test_init_keeps_an_existing_config_and_a_foreign_hook(project):
    cfg = project.path / ".specpilot/config.toml"
    cfg.write_text('schema_version = 1\nsystem_paths = ["engine"]\n')
    hook = project.path / ".git/hooks/pre-commit"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\necho mine\n")
    result = project.specpilot("init")
    assert "kept your own" in result.output
    assert hook.read_text() == "#!/bin/sh\necho mine\n"
    assert cfg.read_text() == 'schema_version = 1\nsystem_paths = ["engine"]\n'


def test_refspecs_carry_entries_and_notes_through_push_and_fetch(project, tmp_path):
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    project.git("remote", "add", "origin", str(remote))
    project.specpilot("init")
    project.entry("a", {1: "'a'"})
    project.git("push", "-q", "origin")
    assert project.git("--git-dir", str(remote), "for-each-ref", "--format=%(refname)").split() == [
        "refs/heads/main", "refs/notes/specpilot", "refs/specpilot/entries/a"]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(remote), str(clone)], check=True)
    other = Project(clone)
    os.chdir(clone)
    other.specpilot("init")
    other.git("fetch", "-q", "origin")
    assert other.git("rev-parse", "refs/specpilot/entries/a") == \
        project.git("rev-parse", "refs/specpilot/entries/a")
    assert other.git_specpilot("replay", "a").exit_code == 0


def test_init_generates_sealed_requests_outside_the_repository(project, tmp_path, monkeypatch):
    sealed = tmp_path / "sealed-home"
    monkeypatch.setenv("SPECPILOT_SEALED_DIR", str(sealed))
    result = project.specpilot("init")
    assert result.exit_code == 0, result.output
    path = sealed / "sealed_requests.jsonl"
    assert path.is_file() and (sealed / "seed").is_file()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not str(path.resolve()).startswith(str(project.path.resolve()))
    before = path.read_bytes()
    again = project.specpilot("init", "--json")
    assert '"changes": []' in again.output and path.read_bytes() == before
