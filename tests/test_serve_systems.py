"""specpilot/serve/systems.py: what `specpilot serve --system NAME` resolves a name to, in a
real git project with recorded memory entries (tests/memory_fixtures.py)."""

from __future__ import annotations

import pytest

from memory_fixtures import *  # noqa: F401,F403 - the fixtures
from specpilot.errors import SpecPilotError
from specpilot.serve.systems import named_system, option_values


def _meta(project, name: str, options: list[tuple[str, str, object, object]]):
    path = project.path.parent / f"{name}.toml"
    path.write_text("".join(
        f'[[options]]\nname = "{n}"\ntype = "{t}"\ndefault = {d!r}\ntuned = {v!r}\n'
        .replace("True", "true").replace("False", "false") for n, t, d, v in options))
    return path


def test_an_entry_names_its_commit_and_its_chains_tuned_options(project):
    project.entry("a", {1: "'a'"}, meta_file=_meta(project, "a", [("x", "int", 0, 3),
                                                                  ("z", "int", 0, 5)]))
    project.entry("b", {10: "'b'"}, ["a"], meta_file=_meta(
        project, "b", [("y", "bool", False, True), ("z", "int", 0, 7)]))
    memory = project.memory()
    entries = memory.ref_entries()
    b = named_system(memory, "b")
    assert b.commit == entries["b"].commit and b.what == "memory entry b"
    assert b.options == {"x": "3", "z": "7", "y": "true"}   # its own value of z wins
    assert named_system(memory, "a").options == {"x": "3", "z": "5"}
    main = named_system(memory, "main")
    assert main.commit == project.base and main.options == {}
    with pytest.raises(SpecPilotError, match="no validated system yet"):
        named_system(memory, "best")
    project.git("update-ref", "refs/specpilot/best", entries["a"].commit)
    project.write(".specpilot/runs/best.json", '{"options": {"x": 4}}')
    best = named_system(memory, "best")
    assert (best.commit, best.options) == (entries["a"].commit, {"x": "4"})


def test_option_values_are_passed_on_raw_and_the_command_line_wins(tmp_path):
    f = tmp_path / "o.toml"
    f.write_text('[options]\ntree_budget = 8\ncompile = false\n')
    assert option_values(str(f), ("tree_budget=16", "draft_len= 7")) == \
        {"tree_budget": "16", "compile": "false", "draft_len": " 7"}
    with pytest.raises(SpecPilotError, match="expected name=value"):
        option_values(None, ("tree_budget",))
