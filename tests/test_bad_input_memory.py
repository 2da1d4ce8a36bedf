"""Issue 21, the memory part of the bad-input suite: each kind of bad memory input (memory
files, notes, refs, locks) run through the real CLI gives one line `error: …`, a non-zero
exit, and leaves the repository byte-identical (working tree, index, HEAD, refs, notes and
every file under .git but its objects and logs).

Repairs change the repository on purpose; they are tested in test_memory_safe_writes.py.
"""

import errno
import os
import socket

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_forge import (drop_refs, forge, link_entry, with_binary_section,
                          with_readme_section, write_note)


@pytest.fixture
def both(project):
    """Entries a and b (b depends on a): refs, notes and memory/ files, plus a source
    branch src/x for a new entry."""
    def steps(project):
        project.entry("a", {1: "'a'"})
        project.entry("b", {10: "'b'"}, ["a"])
        project.make_commit(project.base, {"stock/sampler.py": "x = 1\n"}, "x",
                            branch="src/x")
    return project.build("bad-input-both", steps)


@pytest.fixture
def files(both):
    """The same entries in memory/ only, as a fresh clone has them before `import`."""
    drop_refs(both)
    return both


def truncate_patch(p):
    patch = (p.path / "memory/a.patch").read_bytes()
    forge(p, "a", patch[: len(patch) // 2])


def flip_patch_byte(p):
    path = p.path / "memory/a.patch"
    path.write_bytes(path.read_bytes().replace(b"+line_01 = 'a'", b"+line_01 = 'A'"))


def lock(text):
    def setup(p):
        (p.path / ".git/specpilot.lock").write_text(text)
    return setup


def disk_full_on_lock(p, monkeypatch):
    real = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("specpilot.lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def rename_file(p, old, new):
    for suffix in (".toml", ".patch"):
        (p.path / f"memory/{old}{suffix}").rename(p.path / f"memory/{new}{suffix}")


RESULT = ["add-result", "a", "--gain", "0.05", "--lower-bound", "0.01", "--hardware", "H200",
          "--model", "m", "--verdict", "adopted"]

# kind: (fixture, setup(project[, monkeypatch]), command, what the error must say)
CASES = {
    "id with '..'": ("both", None, ["record", "--from", "src/x", "--id", "a..b"],
                     "valid git ref name"),
    "id ending in .lock": ("both", None, ["record", "--from", "src/x", "--id", "x.lock"],
                           "valid git ref name"),
    "id ending in '.'": ("both", None, ["record", "--from", "src/x", "--id", "x."],
                         "valid git ref name"),
    "unreadable note": ("both", lambda p: write_note(p, "a", b"not = [toml\n"), ["list"],
                        "not valid TOML"),
    "note naming another entry": ("both", lambda p: write_note(
        p, "b", (p.path / "memory/a.toml").read_bytes()), ["verify"],
        "its note names the entry 'a'"),
    "note that breaks the schema": ("both", lambda p: write_note(
        p, "a", b'id = "a"\ntitle = "t"\n'), RESULT, "does not match the entry schema"),
    "missing note": ("both", lambda p: p.git("notes", "--ref", "refs/notes/specpilot",
                                             "remove", "refs/specpilot/entries/b"),
                     ["describe", "b", "--summary", "s"], "has no note"),
    "live lock": ("both", lock(f"pid {os.getpid()} on {socket.gethostname()}\n"), RESULT,
                  "running"),
    "lock of another host": ("both", lock("pid 1 on some-other-host\n"),
                             ["describe", "a", "--summary", "s"], "another host"),
    "unreadable lock": ("both", lock("\0\0garbage"), ["describe", "a", "--summary", "s"],
                        "delete the file if no writer is running"),
    "disk full writing the lock": ("both", disk_full_on_lock,
                                   ["describe", "a", "--summary", "s"],
                                   "No space left on device"),
    "missing import dir": ("files", None, ["import", "--dir", "no-such-folder"],
                           "no-such-folder: no such folder"),
    "truncated .patch": ("files", truncate_patch, ["import"], "patch does not apply"),
    "mismatched sha256": ("files", flip_patch_byte, ["import"],
                          "memory/a.patch has sha256"),
    "plain diff section outside the system paths": (
        "files", with_readme_section, ["import"], "patch touches 'README.md'"),
    "binary section outside the system paths": (
        "files", with_binary_section, ["import"], "patch touches 'specpilot/evil.bin'"),
    "symlink out of the tree": ("files", lambda p: link_entry(p, "l", "stock/x", "/etc/passwd"),
                                ["import", "l"], "leads outside the system paths"),
    "symlink to a non-system path": ("files", lambda p: link_entry(
        p, "l", "stock/x", "../README.md"), ["verify", "l", "--json"], None),
    "memory file that is not TOML": ("files", lambda p: (p.path / "memory/b.toml").write_text(
        "[[["), ["list"], "memory/b.toml: not valid TOML"),
    "memory file named for another id": ("files", lambda p: rename_file(p, "b", "c"),
                                         ["import"], "file name does not match its id"),
    "memory file with a ref-invalid id": ("files", lambda p: forge(
        p, "x.lock", (p.path / "memory/a.patch").read_bytes()), ["verify"],
        "valid git ref name"),
    "add-result on a missing entry": ("both", None, [*RESULT[:1], "zz", *RESULT[2:]],
                                      "no memory entry 'zz'"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_bad_memory_input_is_one_line_and_changes_nothing(kind, request, monkeypatch):
    fixture, setup, command, message = CASES[kind]
    project = request.getfixturevalue(fixture)
    if setup is disk_full_on_lock:
        before = snapshot(project.path)
        setup(project, monkeypatch)
    else:
        if setup:
            setup(project)
        before = snapshot(project.path)
    result = project.specpilot("memory", *command)
    assert result.exit_code >= 1, result.output
    assert "Traceback" not in result.output
    if message is None:   # a report (--json): the entry is failed, not reproduced
        assert '"status": "failed"' in result.output and "leads outside" in result.output
    else:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        assert message in lines[0], lines[0]
    assert snapshot(project.path) == before
