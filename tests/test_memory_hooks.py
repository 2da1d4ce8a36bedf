"""hooks/: pre-commit validates memory/*.toml; pre-push and ci run verify."""

import os
import shutil
import subprocess
import sys

from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import REPO


def install(project):
    """The project's own hooks/ folder, as this repository ships it, and `specpilot init`."""
    shutil.copytree(REPO / "hooks", project.path / "hooks")
    assert project.specpilot("init").exit_code == 0


def run_hook(project, name):
    return subprocess.run([str(project.path / "hooks" / name)], cwd=project.path,
                          capture_output=True, text=True,
                          env={**os.environ, "SPECPILOT_PYTHON": sys.executable})


def test_ci_hook_passes_with_zero_entries(project):
    install(project)
    result = run_hook(project, "ci")
    assert result.returncode == 0, result.stderr
    assert "no memory entries" in result.stdout


def test_ci_hook_passes_when_all_reproduce_and_fails_otherwise(project):
    install(project)
    project.entry("a", {1: "'a'"})
    assert run_hook(project, "ci").returncode == 0
    patch = project.path / "memory/a.patch"
    patch.write_bytes(patch.read_bytes().replace(b"'a'", b"'b'"))
    result = run_hook(project, "ci")
    assert result.returncode == 1
    assert "failed" in result.stdout and "do not reproduce" in result.stderr


def test_pre_commit_rejects_an_invalid_entry_file(project):
    install(project)
    project.entry("a", {1: "'a'"})
    env = {**os.environ, "SPECPILOT_PYTHON": sys.executable}
    project.git("add", "-A")
    ok = subprocess.run(["git", "commit", "-qm", "memory a"], cwd=project.path,
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    toml = project.path / "memory/a.toml"
    toml.write_text(toml.read_text().replace('base = "', 'base = "zz'))
    project.git("add", "memory/a.toml")
    bad = subprocess.run(["git", "commit", "-qm", "broken"], cwd=project.path,
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1
    assert "memory/a.toml: does not match the entry schema: base" in bad.stderr


def test_pre_commit_rejects_a_patch_that_does_not_match_its_hash(project):
    install(project)
    project.entry("a", {1: "'a'"})
    patch = project.path / "memory/a.patch"
    patch.write_bytes(patch.read_bytes() + b"\n")
    project.git("add", "-A")
    bad = subprocess.run(["git", "commit", "-qm", "x"], cwd=project.path, capture_output=True,
                         text=True, env={**os.environ, "SPECPILOT_PYTHON": sys.executable})
    assert bad.returncode == 1 and "does not match its patch_sha256" in bad.stderr


def test_pre_push_fails_on_a_non_reproducing_entry(project, tmp_path):
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    project.git("remote", "add", "origin", str(remote))
    install(project)
    env = {**os.environ, "SPECPILOT_PYTHON": sys.executable}
    project.entry("a", {1: "'a'"})
    push = subprocess.run(["git", "push", "-q", "origin"], cwd=project.path,
                          capture_output=True, text=True, env=env)
    assert push.returncode == 0, push.stderr
    commit = project.git("rev-parse", "refs/specpilot/entries/a")
    note = project.git("notes", "--ref", "refs/notes/specpilot", "show", commit)
    sha = note.split('source_tree = "')[1][:40]
    (tmp_path / "n").write_text(note.replace(sha, "0" * 40) + "\n")
    project.git("notes", "--ref", "refs/notes/specpilot", "add", "-f", "-F", str(tmp_path / "n"), commit)
    push = subprocess.run(["git", "push", "-q", "origin"], cwd=project.path,
                          capture_output=True, text=True, env=env)
    assert push.returncode != 0
    assert "diverged" in push.stdout + push.stderr
