"""Rebase onto a changed stock: clean entries move (results stale), conflicts are reported
per entry and lose nothing."""

import json
import tomllib

import pytest

from memory_fixtures import *  # noqa: F401,F403
from memory_fixtures import engine_text
from specpilot.memory.rebase import rebase
from specpilot.memory.verify import verify

RESULTS = '[[results]]\nmetric = "tok/s"\nvalue = 1.25\nhardware = "H200"\n'


@pytest.fixture
def moved(project):
    def steps(project):
        meta = project.path.parent / "meta.toml"
        meta.write_text(RESULTS)
        project.entry("a", {1: "'a'"}, meta_file=meta)      # clean
        project.entry("b", {10: "'b'"}, ["a"])             # clean, on top of a
        project.entry("c", {30: "'c'"})                    # conflicts: stock edits line 30
        project.entry("d", {40: "'d'"}, ["c"])             # blocked behind c
        project.old = {e: project.git("rev-parse", f"refs/specpilot/entries/{e}") for e in "abcd"}
        project.onto = project.make_commit(project.base, {
            "stock/engine.py": engine_text({30: "'stock'", 55: "'stock'"}),
            "README.md": "# new stock\n"}, "new stock", branch="stock2")
        project.results = {r.id: r for r in rebase(project.memory(), "stock2")}
    return project.build("rebase-moved", steps)


def meta_of(project, entry_id):
    return tomllib.loads(project.git("notes", "--ref", "refs/notes/specpilot", "show",
                                     f"refs/specpilot/entries/{entry_id}"))


def test_statuses_per_entry(moved):
    assert {k: r.status for k, r in moved.results.items()} == \
        {"a": "moved", "b": "moved", "c": "conflict", "d": "blocked"}
    assert moved.results["c"].paths == ["stock/engine.py"]
    assert "3-way apply conflicts in stock/engine.py" in moved.results["c"].error
    assert "dependency 'c' was not moved" in moved.results["d"].error


def test_clean_entries_move_onto_the_new_stock(moved):
    a, b = (moved.git("rev-parse", f"refs/specpilot/entries/{e}") for e in "ab")
    assert moved.git("rev-parse", f"{a}^") == moved.onto
    assert moved.git("rev-parse", f"{b}^") == a
    assert meta_of(moved, "a")["base"] == moved.onto
    assert meta_of(moved, "b")["base"] == moved.onto
    engine = moved.git("show", f"{b}:stock/engine.py")
    assert "line_01 = 'a'" in engine and "line_10 = 'b'" in engine
    assert "line_55 = 'stock'" in engine and "line_30 = 'stock'" in engine
    assert moved.git("show", f"{b}:README.md") == "# new stock"


def test_results_become_stale_and_the_move_is_recorded(moved):
    meta = meta_of(moved, "a")
    assert meta["results"][0]["stale"] is True and meta["results"][0]["value"] == 1.25
    assert meta["rebased"][0]["from_base"] == moved.base
    assert meta["rebased"][0]["from_commit"] == moved.old["a"]
    assert tomllib.loads((moved.path / "memory/a.toml").read_text()) == meta


def test_nothing_is_lost(moved):
    for e in "cd":  # conflicting and blocked entries keep their refs
        assert moved.git("rev-parse", f"refs/specpilot/entries/{e}") == moved.old[e]
        assert meta_of(moved, e)["base"] == moved.base
    for e in "ab":  # moved entries keep their old commit in the attic
        assert moved.git("rev-parse", f"refs/specpilot/attic/{e}/{moved.old[e][:12]}") == moved.old[e]
    report = verify(moved.memory())
    assert report.ok, [o.error for _s, o in report.outcomes if not o.ok]


def test_rebase_again_is_a_no_op_for_moved_entries(moved):
    again = {r.id: r.status for r in rebase(moved.memory(), "stock2", ["b"])}
    assert again == {"a": "unchanged", "b": "unchanged"}


def test_rebasing_one_entry_moves_its_ancestors_and_descendants(project):
    project.entry("a", {1: "'a'"})
    project.entry("b", {10: "'b'"}, ["a"])
    project.entry("c", {20: "'c'"}, ["b"])
    project.entry("z", {50: "'z'"})
    project.make_commit(project.base, {"README.md": "new\n"}, "s", branch="stock2")
    moved = {r.id: r.status for r in rebase(project.memory(), "stock2", ["b"])}
    assert moved == {"a": "moved", "b": "moved", "c": "moved"}
    assert verify(project.memory()).ok


def test_a_descendant_brings_its_other_dependencies_along(project):
    """Rebasing b moves d, which also depends on w: w moves with it (d cannot sit on a
    moved b and an unmoved w). It once failed with KeyError 'w' (two-level, of
    w12-weights and tree-verify, when batch-tree-verify was rebased)."""
    project.entry("w", {5: "'w'"})
    project.entry("b", {10: "'b'"})
    project.entry("d", {20: "'d'"}, ["w", "b"])
    project.entry("z", {50: "'z'"})
    project.make_commit(project.base, {"README.md": "new\n"}, "s", branch="stock2")
    moved = {r.id: r.status for r in rebase(project.memory(), "stock2", ["b"])}
    assert moved == {"w": "moved", "b": "moved", "d": "moved"}
    assert verify(project.memory()).ok


def test_rebase_cli_exit_code_and_json(project):
    project.entry("c", {30: "'c'"})
    project.make_commit(project.base, {"stock/engine.py": engine_text({30: "'x'"})}, "s",
                        branch="stock2")
    result = project.specpilot("memory", "rebase", "--onto", "stock2", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)[0]["status"] == "conflict"


def test_conflicts_where_both_sides_only_add_lines_keep_both(project):
    """Every entry registers its option in one file: the new stock and the entry both
    appending a line at its end is a 3-way conflict that loses nothing when both are kept.
    A conflict that edits a common line still stops the entry (test_statuses_per_entry)."""
    opts = "a = 1\nb = 2\n"
    base = project.make_commit(project.base, {"stock/opts.py": opts}, "opts", branch="base2")
    project.entry("x", {}, base=base, extra={"stock/opts.py": opts + "x = 3\n"})
    onto = project.make_commit(base, {"stock/opts.py": opts + "y = 4\n"}, "stock adds y",
                               branch="stock3")
    (res,) = [r for r in rebase(project.memory(), onto) if r.id == "x"]
    assert res.status == "moved" and res.kept_both == ["stock/opts.py"], res.error
    text = project.git("show", "refs/specpilot/entries/x:stock/opts.py")
    assert text.splitlines() == ["a = 1", "b = 2", "y = 4", "x = 3"]
    assert verify(project.memory()).ok


def test_a_conflict_merged_by_hand_moves_with_resolved(moved):
    """c conflicted (stock and c both edit line 30); merged by hand on the new stock it moves
    with --resolved, d (blocked behind it) moves with it, and everything replays."""
    merged = moved.make_commit(moved.onto, {
        "stock/engine.py": engine_text({30: "'stock and c'", 55: "'stock'"})},
        "c merged by hand", branch="c-merged")
    result = moved.specpilot("memory", "rebase", "--onto", "stock2", "--resolved",
                             "c=c-merged", "--json")
    assert result.exit_code == 0, result.output
    status = {r["id"]: r["status"] for r in json.loads(result.output)}
    assert status["c"] == "moved" and status["d"] == "moved"
    c, d = (moved.git("rev-parse", f"refs/specpilot/entries/{e}") for e in "cd")
    assert moved.git("rev-parse", f"{c}^") == moved.onto and moved.git("rev-parse", f"{d}^") == c
    assert "line_30 = 'stock and c'" in moved.git("show", f"{c}:stock/engine.py")
    assert "line_40 = 'd'" in moved.git("show", f"{d}:stock/engine.py")
    assert meta_of(moved, "c")["rebased"][-1]["resolved_from"] == merged
    assert moved.git("rev-parse", f"refs/specpilot/attic/c/{merged[:12]}") == merged
    assert "resolved_from" not in meta_of(moved, "d")["rebased"][-1]   # d moved by 3-way
    assert verify(moved.memory()).ok


def test_after_a_conflict_the_conflicted_entrys_descendants_move_with_its_resolution(project):
    """q (on p) conflicts while p moves; q merged by hand moves with --resolved; r (on q),
    whose old replay can no longer be made (p is on the new stock now), moves by its
    recorded patch (memory/r.patch) only where that is the change its note names."""
    project.entry("p", {1: "'p'"})
    project.entry("q", {30: "'q'"}, ["p"])
    project.entry("r", {40: "'r'"}, ["q"])
    onto = project.make_commit(project.base, {
        "stock/engine.py": engine_text({30: "'stock'"})}, "new stock", branch="stock2")
    first = {r.id: r.status for r in rebase(project.memory(), "stock2")}
    assert first == {"p": "moved", "q": "conflict", "r": "blocked"}
    p_new = project.git("rev-parse", "refs/specpilot/entries/p")
    merged = project.make_commit(p_new, {
        "stock/engine.py": engine_text({1: "'p'", 30: "'stock and q'"})}, "q merged by hand",
        branch="q-merged")
    assert project.git("merge-base", merged, onto) == onto
    recorded = project.path / "memory" / "r.patch"
    good = recorded.read_bytes()
    recorded.write_bytes(good.replace(b"'r'", b"'x'"))   # not the change r's note names
    second = {r.id: (r.status, r.error) for r in rebase(project.memory(), "stock2",
                                                        resolved={"q": "q-merged"})}
    assert second["q"][0] == "moved" and second["r"][0] == "failed", second
    recorded.write_bytes(good)
    third = {r.id: (r.status, r.error) for r in rebase(project.memory(), "stock2")}
    assert third["q"][0] == "unchanged" and third["r"][0] == "moved", third
    r = project.git("rev-parse", "refs/specpilot/entries/r")
    text = project.git("show", f"{r}:stock/engine.py")
    assert "line_30 = 'stock and q'" in text and "line_40 = 'r'" in text
    assert verify(project.memory()).ok


def test_a_resolution_must_sit_on_the_new_stock_and_name_an_entry(moved):
    moved.make_commit(moved.base, {"stock/engine.py": engine_text({30: "'c'"})},
                            "on the old stock", branch="c-old")
    for args, words in ((["c=c-old"], "does not contain the new stock"),
                        (["zz=c-old"], "no memory entry 'zz'"), (["c"], "expected ID=SRC")):
        result = moved.specpilot("memory", "rebase", "--onto", "stock2", "--resolved", *args)
        assert result.exit_code == 2 and words in result.output, result.output
    assert moved.git("rev-parse", "refs/specpilot/entries/c") == moved.old["c"]   # untouched
    plain = moved.specpilot("memory", "rebase", "--onto", "stock2")
    assert plain.exit_code == 1 and "--resolved c=DIR" in plain.output
