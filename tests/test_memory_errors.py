"""Each bad input gives its own clear error naming the entry (memory/ files as input)."""

import hashlib
import re

import pytest

from memory_fixtures import *  # noqa: F401,F403
from specpilot.memory.dag import CycleError, DuplicateIdError, MissingDependencyError
from specpilot.memory.entry import SchemaError
from specpilot.memory.portable import import_entries
from specpilot.memory.verify import verify


@pytest.fixture
def files(project):
    """Three recorded entries (a ← b, c) exported to memory/, refs removed."""
    def steps(project):
        project.entry("a", {1: "'a'"})
        project.entry("b", {10: "'b'"}, ["a"])
        project.entry("c", {20: "'c'"})
        for ref in project.git("for-each-ref", "--format=%(refname)", "refs/specpilot").split():
            project.git("update-ref", "-d", ref)
        project.git("update-ref", "-d", "refs/notes/specpilot")
    project.build("errors-files", steps)
    return project.path / "memory"


def edit_toml(folder, entry_id, pattern, repl):
    path = folder / f"{entry_id}.toml"
    text, n = re.subn(pattern, repl, path.read_text(), flags=re.M)
    assert n, pattern
    path.write_text(text)


def set_patch(folder, entry_id, patch: bytes):
    (folder / f"{entry_id}.patch").write_bytes(patch)
    edit_toml(folder, entry_id, r'^patch_sha256 = ".*"$',
              f'patch_sha256 = "{hashlib.sha256(patch).hexdigest()}"')


def failed(project, entry_id):
    report = verify(project.memory(), "files")
    return next(o for _s, o in report.outcomes if o.id == entry_id)


def test_clean_files_verify(project, files):
    assert verify(project.memory(), "files").ok


def test_cycle(project, files):
    edit_toml(files, "a", r"^deps = \[\]$", 'deps = ["b"]')
    with pytest.raises(CycleError, match="a -> b -> a"):
        verify(project.memory(), "files")
    with pytest.raises(CycleError):
        import_entries(project.memory())


def test_missing_dependency(project, files):
    edit_toml(files, "c", r"^deps = \[\]$", 'deps = ["ghost"]')
    with pytest.raises(MissingDependencyError, match="entry 'c' depends on 'ghost'"):
        verify(project.memory(), "files")


def test_duplicate_id(project, files):
    (files / "c2.toml").write_bytes((files / "c.toml").read_bytes())
    (files / "c2.patch").write_bytes((files / "c.patch").read_bytes())
    with pytest.raises(DuplicateIdError, match="duplicate entry id 'c'"):
        verify(project.memory(), "files")


def test_file_named_for_another_id(project, files):
    (files / "c.toml").rename(files / "z.toml")
    (files / "c.patch").rename(files / "z.patch")
    with pytest.raises(SchemaError, match="z.toml: file name does not match its id 'c'"):
        verify(project.memory(), "files")


def test_schema_violation(project, files):
    edit_toml(files, "c", r'^base = ".*"$', 'base = "not-a-commit"')
    with pytest.raises(SchemaError, match=r"memory/c.toml: does not match the entry schema: base"):
        verify(project.memory(), "files")


def test_patch_outside_system_paths(project, files):
    patch = (files / "c.patch").read_bytes().replace(b"stock/engine.py", b"README.md")
    set_patch(files, "c", patch)
    outcome = failed(project, "c")
    assert outcome.status == "failed"
    assert outcome.error == ("entry 'c': patch touches 'README.md', outside the system paths "
                             "(stock, kernels)")


def test_patch_hash_mismatch(project, files):
    path = files / "c.patch"
    path.write_bytes(path.read_bytes().replace(b"+line_20 = 'c'", b"+line_20 = 'C'"))
    outcome = failed(project, "c")
    assert outcome.status == "failed"
    assert "entry 'c': memory/c.patch has sha256" in outcome.error
    assert "but the entry records patch_sha256" in outcome.error


def test_patch_that_does_not_apply_names_entry_file_and_hunk(project, files):
    patch = (files / "b.patch").read_bytes().replace(b" line_09 = 9", b" line_09 = 99")
    set_patch(files, "b", patch)
    outcome = failed(project, "b")
    assert outcome.status == "failed"
    assert outcome.error.startswith("entry 'b': patch does not apply: stock/engine.py hunk #1 (@@ -7,7")


def test_dependents_of_a_failed_entry_fail(project, files):
    (files / "x.toml").write_text((files / "b.toml").read_text().replace('id = "b"', 'id = "x"')
                                  .replace('deps = [\n    "a",\n]', 'deps = [\n    "b",\n]'))
    (files / "x.patch").write_bytes(b"")
    set_patch(files, "x", b"")
    set_patch(files, "b", (files / "b.patch").read_bytes().replace(b" line_09 = 9", b" line_09 = 0"))
    outcome = failed(project, "x")
    assert outcome.status == "failed" and "dependency 'b' failed to replay" in outcome.error


def test_import_refuses_entries_that_do_not_reproduce(project, files):
    path = files / "c.patch"
    path.write_bytes(path.read_bytes() + b" ")
    with pytest.raises(Exception, match="not imported: entry 'c'"):
        import_entries(project.memory())


def test_verify_cli_exit_code_and_json(project, files):
    path = files / "c.patch"
    path.write_bytes(path.read_bytes().replace(b"'c'", b"'C'"))
    result = project.specpilot("memory", "verify", "--json")
    assert result.exit_code == 1
    assert '"status": "failed"' in result.output and '"ok": false' in result.output
