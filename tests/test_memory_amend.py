"""`specpilot memory amend`: an entry gets a new change on its base, keeps its identity, and
still reproduces; what cannot be amended is refused with nothing changed."""

import tomllib

from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import engine_text
from specpilot.memory.verify import verify

RESULTS = '[[results]]\nmetric = "tok/s"\nvalue = 1.25\nhardware = "H200"\n'


def _meta(project, entry_id):
    return tomllib.loads(project.git("notes", "--ref", "refs/notes/specpilot", "show",
                                     f"refs/specpilot/entries/{entry_id}"))


def test_amend_replaces_the_change_and_keeps_the_entry(project):
    meta = project.path.parent / "meta.toml"
    meta.write_text('summary = "first"\n' + RESULTS)
    project.entry("a", {1: "'a'"}, meta_file=meta)
    old = project.git("rev-parse", "refs/specpilot/entries/a")
    project.make_commit(project.base, {"stock/engine.py": engine_text({1: "'a2'", 2: "'a2'"})},
                        "a, second take", branch="src/a2")
    res = project.specpilot("memory", "amend", "a", "--from", "src/a2",
                            "--reason", "stock moved a module")
    assert res.exit_code == 0, res.output
    assert "results now stale" in res.output
    new = project.git("rev-parse", "refs/specpilot/entries/a")
    assert new != old and project.git("rev-parse", f"{new}^") == project.base
    engine = project.git("show", f"{new}:stock/engine.py")
    assert "line_01 = 'a2'" in engine and "line_02 = 'a2'" in engine
    m = _meta(project, "a")
    assert m["summary"] == "first" and m["base"] == project.base
    assert [r["stale"] for r in m["results"]] == [True]
    assert m["amended"][0]["from_commit"] == old
    assert m["amended"][0]["reason"] == "stock moved a module"
    assert project.git("rev-parse", f"refs/specpilot/attic/a/{old[:12]}") == old
    assert "line_02 = 'a2'" in (project.path / "memory" / "a.patch").read_text()
    assert verify(project.memory()).ok


def test_amend_refuses_and_changes_nothing(project):
    project.entry("a", {1: "'a'"})
    project.entry("b", {10: "'b'"}, ["a"])
    refs = project.git("for-each-ref")
    # a has a dependent
    res = project.specpilot("memory", "amend", "a", "--from", "src/b", "--reason", "x")
    assert res.exit_code == 2 and "has dependents (b)" in res.output
    # no such entry; the entry's own tree; a source without the entry's base
    res = project.specpilot("memory", "amend", "zz", "--from", "src/b", "--reason", "x")
    assert res.exit_code == 2 and "no memory entry 'zz'" in res.output
    res = project.specpilot("memory", "amend", "b", "--from", "src/b", "--reason", "x")
    assert res.exit_code == 2 and "nothing to amend" in res.output
    other = project.git("commit-tree", project.git("rev-parse", f"{project.base}^{{tree}}"),
                        "-m", "unrelated root")
    res = project.specpilot("memory", "amend", "b", "--from", other, "--reason", "x")
    assert res.exit_code == 2 and "does not contain the entry's base" in res.output
    res = project.specpilot("memory", "amend", "b", "--from", "src/b", "--reason", " ")
    assert res.exit_code == 2 and "--reason is required" in res.output
    assert project.git("for-each-ref") == refs


def test_amend_refuses_a_source_built_on_a_newer_stock(project):
    """SRC replayed onto a newer HEAD (stock changed a system file since the entry's base)
    would fold stock's change into the entry's patch: refused, nothing changed; on a newer
    HEAD that changed only files outside the system paths it is amended."""
    project.entry("a", {1: "'a'"})
    refs = project.git("for-each-ref", "refs/specpilot", "refs/notes")
    newer = project.make_commit(project.base, {"stock/other.py": "moved = 1\n"}, "stock moved")
    project.git("reset", "-q", "--hard", newer)   # HEAD: the newer stock
    project.make_commit(newer, {"stock/engine.py": engine_text({1: "'a2'"})}, "a on it",
                        branch="src/a2")
    res = project.specpilot("memory", "amend", "a", "--from", "src/a2", "--reason", "x")
    assert res.exit_code == 2 and "built on stock" in res.output and "rebase --onto" in res.output
    assert project.git("for-each-ref", "refs/specpilot", "refs/notes") == refs
    docs = project.make_commit(project.base, {"NOTES.md": "notes\n"}, "docs")
    project.git("reset", "-q", "--hard", docs)    # HEAD: stock's system paths as at the base
    project.make_commit(docs, {"stock/engine.py": engine_text({1: "'a3'"})}, "a on docs",
                        branch="src/a3")
    res = project.specpilot("memory", "amend", "a", "--from", "src/a3", "--reason", "x")
    assert res.exit_code == 0, res.output


def test_amend_can_give_the_entry_new_dependencies(project):
    """b, recorded alone, is amended to build on a: its patch becomes what it adds over a,
    the entry's commit gets a's as parent, and the old list stays in its history."""
    project.entry("a", {1: "'a'"})
    project.entry("b", {10: "'b'"})
    # b's new source: a's change and b's, b now also touching a's line
    project.make_commit(project.base, {"stock/engine.py": engine_text(
        {1: "'a'", 10: "'b'", 2: "'b on a'"})}, "b over a", branch="src/b2")
    res = project.specpilot("memory", "amend", "b", "--from", "src/b2", "--deps", "a",
                            "--reason", "b's first pass walks a's trees")
    assert res.exit_code == 0, res.output
    new = project.git("rev-parse", "refs/specpilot/entries/b")
    assert project.git("rev-parse", f"{new}^") == project.git("rev-parse",
                                                              "refs/specpilot/entries/a")
    m = _meta(project, "b")
    assert m["deps"] == ["a"] and m["amended"][0]["from_deps"] == []
    patch = (project.path / "memory" / "b.patch").read_text()
    assert "+line_02 = 'b on a'" in patch and "+line_01" not in patch   # a's line: a's
    assert verify(project.memory()).ok
    # now a has a dependent: amending a is refused; bad lists are one-line errors
    for deps, msg in (("b", "cannot depend on itself"), ("zz", "cannot depend on 'zz'"),
                      ("a,a", "names an entry twice")):
        res = project.specpilot("memory", "amend", "b", "--from", "src/b2", "--deps", deps,
                                "--reason", "x")
        assert res.exit_code == 2 and msg in res.output and "\n" not in res.output.strip()
    res = project.specpilot("memory", "amend", "a", "--from", "src/b2", "--reason", "x")
    assert res.exit_code == 2 and "has dependents (b)" in res.output
