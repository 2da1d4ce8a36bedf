"""Sibling dependencies whose patches both only add lines at one place (each registering its
option after the same line) compose by keeping both, the earlier in replay order first; any
other overlap still does not compose. Recording, replaying and rebasing agree."""

import pytest

from memory_fixtures import *  # noqa: F401,F403
from specpilot.errors import SpecPilotError
from specpilot.memory.rebase import rebase
from specpilot.memory.verify import verify

OPTS = "a = 1\nb = 2\n"


def _two_siblings(project):
    base = project.make_commit(project.base, {"stock/opts.py": OPTS}, "opts", branch="base2")
    project.entry("x", {1: "'x'"}, base=base, extra={"stock/opts.py": OPTS + "x = 3\n"})
    project.entry("y", {9: "'y'"}, base=base, extra={"stock/opts.py": OPTS + "y = 4\n"})
    return base


def test_an_entry_on_two_siblings_that_both_append_records_replays_and_rebases(project):
    base = _two_siblings(project)
    both = OPTS + "x = 3\ny = 4\nz = 5\n"     # x then y (replay order), then the entry's own
    project.entry("z", {20: "'z'"}, ["x", "y"], base=base, extra={"stock/opts.py": both})
    z = project.git("rev-parse", "refs/specpilot/entries/z")
    assert project.git("show", f"{z}:stock/opts.py") == both.strip()
    assert "+z = 5" in (project.path / "memory" / "z.patch").read_text()
    assert "+x = 3" not in (project.path / "memory" / "z.patch").read_text()
    assert verify(project.memory()).ok
    # a stock that moved elsewhere: x, y and z move; z's siblings compose again
    onto = project.make_commit(base, {"README.md": "# new stock\n"}, "new", branch="stock3")
    res = {r.id: r for r in rebase(project.memory(), onto)}
    assert all(res[e].status == "moved" for e in "xyz"), {e: res[e].error for e in res}
    assert verify(project.memory()).ok


def test_siblings_that_edit_one_line_two_ways_still_do_not_compose(project):
    base = project.make_commit(project.base, {"stock/opts.py": OPTS}, "opts", branch="base2")
    project.entry("x", {1: "'x'"}, base=base, extra={"stock/opts.py": "a = 10\nb = 2\n"})
    project.entry("w", {9: "'w'"}, base=base, extra={"stock/opts.py": "a = 20\nb = 2\n"})
    with pytest.raises(SpecPilotError, match="do not compose"):
        project.entry("z", {20: "'z'"}, ["x", "w"], base=base,
                      extra={"stock/opts.py": "a = 30\nb = 2\n"})
    assert "refs/specpilot/entries/z" not in project.git("for-each-ref")
