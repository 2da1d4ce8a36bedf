"""memory/ files: export and import round-trip byte for byte; a fresh clone replays."""

import hashlib
import os
import shutil
import subprocess

import pytest

from memory_fixtures import *  # noqa: F401,F403
from specpilot.memory.dag import DuplicateIdError
from specpilot.memory.portable import export_entries, import_entries
from specpilot.memory.verify import verify


@pytest.fixture
def dag(project):
    def steps(project):
        project.entry("a", {1: "'a'"})
        project.entry("b", {10: "'b'"}, ["a"])
        project.entry("c", {20: "'c'"}, ["a"])
        project.entry("d", {30: "'d'"}, ["b", "c"])
    return project.build("portable-diamond", steps)


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def drop_refs(project):
    for ref in project.git("for-each-ref", "--format=%(refname)", "refs/specpilot").split():
        project.git("update-ref", "-d", ref)
    project.git("update-ref", "-d", "refs/notes/specpilot")


def test_export_writes_the_recorded_bytes(dag):
    recorded = folder_bytes(dag.path / "memory")
    out = dag.path.parent / "exported"
    export_entries(dag.memory(), out)
    assert folder_bytes(out) == recorded


def test_import_then_export_round_trips_byte_for_byte(dag):
    refs_before = dag.git("for-each-ref", "refs/specpilot")
    notes_before = dag.git("rev-parse", "refs/notes/specpilot^{tree}")
    original = folder_bytes(dag.path / "memory")
    drop_refs(dag)
    moved = import_entries(dag.memory())
    assert [(m.id, m.action) for m in moved] == [(x, "created") for x in "abcd"]
    # Same commits (fixed identity, `created` date) and same notes as when recorded.
    assert dag.git("for-each-ref", "refs/specpilot") == refs_before
    assert dag.git("rev-parse", "refs/notes/specpilot^{tree}") == notes_before
    out = dag.path.parent / "exported"
    export_entries(dag.memory(), out)
    assert folder_bytes(out) == original


def test_import_twice_changes_nothing(dag):
    assert {m.action for m in import_entries(dag.memory())} == {"unchanged"}


def test_import_refuses_to_replace_a_different_entry_without_force(dag):
    path = dag.path / "memory/b.toml"
    path.write_text(path.read_text().replace('title = "work on b"', 'title = "better b"'))
    old = dag.git("rev-parse", "refs/specpilot/entries/b")
    with pytest.raises(DuplicateIdError, match="entry id 'b' already exists"):
        import_entries(dag.memory())
    moved = import_entries(dag.memory(), force=True)
    assert ("b", "replaced") in [(m.id, m.action) for m in moved]
    assert dag.git("rev-parse", f"refs/specpilot/attic/b/{old[:12]}") == old
    assert verify(dag.memory()).ok


def test_import_refuses_a_patch_that_is_not_canonical(dag):
    drop_refs(dag)
    path = dag.path / "memory/a.patch"
    # Same change, but with one line of context less: applies, yet not the canonical diff.
    lines = path.read_bytes().split(b"\n")
    hunk = next(i for i, line in enumerate(lines) if line.startswith(b"@@"))
    lines[hunk] = b"@@ -1,3 +1,3 @@"
    del lines[hunk + 5]
    patch = b"\n".join(lines)
    path.write_bytes(patch)

    toml = dag.path / "memory/a.toml"
    text = toml.read_text()
    old = text.split('patch_sha256 = "')[1][:64]
    toml.write_text(text.replace(old, hashlib.sha256(patch).hexdigest()))
    with pytest.raises(Exception, match="not the canonical diff"):
        import_entries(dag.memory())


def test_fresh_clone_verifies_then_imports_and_replays(dag, tmp_path):
    dag.git("add", "-A")
    dag.git("commit", "-qm", "memory")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(dag.path), str(clone)], check=True)
    fresh = Project(clone)
    assert fresh.git("for-each-ref", "refs/specpilot") == ""  # refs do not travel

    os.chdir(clone)
    # memory/ alone proves the loop, before any import:
    result = fresh.specpilot("memory", "verify")
    assert result.exit_code == 0, result.output
    assert "(files)" in result.output and "(refs)" not in result.output
    result = fresh.git_specpilot("replay", "d", "--worktree", str(tmp_path / "wt"))
    assert result.exit_code == 0 and "(from files)" in result.output, result.output
    assert "line_30 = 'd'" in (tmp_path / "wt/stock/engine.py").read_text()
    result = fresh.specpilot("memory", "import")
    assert result.exit_code == 0, result.output
    assert fresh.git("for-each-ref", "refs/specpilot") == dag.git("for-each-ref", "refs/specpilot")
    result = fresh.git_specpilot("replay", "d")
    assert result.exit_code == 0, result.output
    assert "reproduced" in result.output
    shutil.rmtree(clone)
