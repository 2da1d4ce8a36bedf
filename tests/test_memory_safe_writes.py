"""Issue 21, class 6: memory writes that corrupted or orphaned, and the ways back.

- describe / add-result on an entry with two dependencies keep its patch (relative to the
  replay of both, not to its first parent);
- an id that is a slug but not a ref name is refused before anything is written, and a ref
  update that loses a race takes its note back;
- an unreadable or missing note can be repaired (`specpilot memory repair`, or `import`);
- a lock left by a killed writer on this host is recognised as stale.
"""

import socket
import subprocess
import sys
import tomllib

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_forge import write_note
from specpilot.gitstore import GitStore


def one_line_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code >= 1 and len(lines) == 1 and lines[0].startswith("error: "), \
        result.output
    return lines[0]


@pytest.fixture
def diamond(project):
    """a and c on the base; d depends on both."""
    def steps(project):
        project.entry("a", {1: "'a'"})
        project.entry("c", {20: "'c'"})
        project.entry("d", {30: "'d'"}, ["a", "c"])
    return project.build("safe-writes-diamond", steps)


@pytest.mark.parametrize("args", [
    ["describe", "d", "--summary", "measured again"],
    ["add-result", "d", "--gain", "0.05", "--lower-bound", "0.02", "--hardware", "H200",
     "--model", "m", "--verdict", "adopted"],
])
def test_note_rewrites_keep_the_patch_of_an_entry_with_two_dependencies(diamond, args):
    patch = (diamond.path / "memory/d.patch").read_bytes()
    result = diamond.specpilot("memory", *args)
    assert result.exit_code == 0, result.output
    assert (diamond.path / "memory/d.patch").read_bytes() == patch
    verified = diamond.specpilot("memory", "verify")
    assert verified.exit_code == 0, verified.output


@pytest.mark.parametrize("bad_id", ["a..b", "x.lock", "trailing."])
def test_an_id_that_is_not_a_ref_name_is_refused_before_anything_is_written(project, bad_id):
    project.entry("a", {1: "'a'"})
    project.make_commit(project.base, {"stock/sampler.py": "x = 1\n"}, "x", branch="src/x")
    before = snapshot(project.path)
    result = project.specpilot("memory", "record", "--from", "src/x", "--id", bad_id)
    line = one_line_error(result)
    assert "valid git ref name" in line and "another writer" not in line
    assert result.exit_code == 2
    assert snapshot(project.path) == before


def test_a_ref_update_that_loses_a_race_takes_its_note_back(chain_ab, monkeypatch):
    p = chain_ab
    p.make_commit(p.base, {"stock/sampler.py": "x = 1\n"}, "x", branch="src/x")
    notes = p.git("rev-parse", "refs/notes/specpilot")
    real = GitStore.update_ref

    def another_writer_first(self, ref, new, old, reason):
        if ref == "refs/specpilot/entries/x":
            p.git("update-ref", ref, p.base)
        return real(self, ref, new, old, reason)

    monkeypatch.setattr(GitStore, "update_ref", another_writer_first)
    result = p.specpilot("memory", "record", "--from", "src/x", "--id", "x", "--no-files")
    assert "another writer got there first" in one_line_error(result)
    assert p.git("rev-parse", "refs/notes/specpilot") == notes   # no orphan note


# -- unreadable notes: repair --------------------------------------------------------------

def test_repair_restores_an_unreadable_note_from_memory_files(chain_ab):
    p = chain_ab
    write_note(p, "b", b"this is [not toml\n")
    line = one_line_error(p.specpilot("memory", "list"))
    assert "note on refs/specpilot/entries/b: not valid TOML" in line
    assert "specpilot memory repair" in line
    one_line_error(p.specpilot("memory", "verify"))
    one_line_error(p.specpilot("memory", "describe", "a", "--summary", "x"))

    result = p.specpilot("memory", "repair")
    assert result.exit_code == 0, result.output
    assert result.output.split()[:2] == ["restored", "b"]
    note = p.git("notes", "--ref", "refs/notes/specpilot", "show", "refs/specpilot/entries/b")
    assert note + "\n" == (p.path / "memory/b.toml").read_text()
    assert p.specpilot("memory", "verify").exit_code == 0
    again = p.specpilot("memory", "repair")
    assert again.exit_code == 0 and "nothing to repair" in again.output


def test_repair_restores_a_missing_note_and_import_repairs_too(chain_ab):
    p = chain_ab
    p.git("notes", "--ref", "refs/notes/specpilot", "remove", "refs/specpilot/entries/a")
    assert "has no note" in one_line_error(p.specpilot("memory", "list"))
    result = p.specpilot("memory", "import")
    assert result.exit_code == 0, result.output
    assert "repaired  a" in result.output and "unchanged b" in result.output
    assert p.specpilot("memory", "verify").exit_code == 0


def test_repair_without_the_file_changes_nothing_and_says_how_to_drop(chain_ab):
    p = chain_ab
    write_note(p, "b", b'id = "someone-else"\n')
    (p.path / "memory/b.toml").unlink()
    before = snapshot(p.path)
    line = one_line_error(p.specpilot("memory", "repair"))
    assert "memory/b.toml is missing" in line and "--drop b" in line
    assert "reads fine" in one_line_error(p.specpilot("memory", "repair", "--drop", "a"))
    assert snapshot(p.path) == before
    commit = p.git("rev-parse", "refs/specpilot/entries/b")
    dropped = p.specpilot("memory", "repair", "--drop", "b")
    assert dropped.exit_code == 0 and dropped.output.startswith("dropped"), dropped.output
    assert p.git("rev-parse", f"refs/specpilot/attic/b/{commit[:12]}") == commit
    assert p.specpilot("memory", "verify", "--source", "refs").exit_code == 0


def test_repair_will_not_drop_an_entry_others_depend_on(chain_ab):
    p = chain_ab
    write_note(p, "a", b"[[[")
    (p.path / "memory/a.toml").unlink()
    before = snapshot(p.path)
    assert "b depend(s) on it" in one_line_error(p.specpilot("memory", "repair", "--drop", "a"))
    assert snapshot(p.path) == before


def test_import_force_replaces_an_entry_whose_note_is_unreadable(chain_ab):
    p = chain_ab
    old = p.git("rev-parse", "refs/specpilot/entries/a")
    p.git("update-ref", "refs/specpilot/entries/a", p.make_commit(p.base, {}, "other"))
    write_note(p, "a", b"[[[")
    assert "use --force" in one_line_error(p.specpilot("memory", "import"))
    result = p.specpilot("memory", "import", "--force")
    assert result.exit_code == 0, result.output
    assert p.git("rev-parse", "refs/specpilot/entries/a") == old
    assert p.specpilot("memory", "verify").exit_code == 0


# -- locks ---------------------------------------------------------------------------------

def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lock_left_by_a_killed_writer_is_recognised_as_stale(chain_ab):
    p = chain_ab
    lock = p.path / ".git/specpilot.lock"
    lock.write_text(f"pid {dead_pid()} on {socket.gethostname()}\n")
    result = p.specpilot("memory", "describe", "a", "--summary", "after a crash")
    assert result.exit_code == 0, result.output
    assert not lock.exists() and not (p.path / ".git/specpilot.lock.break").exists()
    assert tomllib.loads((p.path / "memory/a.toml").read_text())["summary"] == "after a crash"


def test_a_lock_held_by_a_running_writer_is_respected(chain_ab):
    lock = chain_ab.path / ".git/specpilot.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"pid {holder.pid} on {socket.gethostname()}\n")
        before = snapshot(chain_ab.path)
        line = one_line_error(chain_ab.specpilot("memory", "describe", "a", "--summary", "x"))
        assert f"pid {holder.pid}" in line and "running" in line
        assert snapshot(chain_ab.path) == before
    finally:
        holder.kill()
        holder.wait()
