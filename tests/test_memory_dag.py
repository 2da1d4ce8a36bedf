"""The dependency DAG: order, cycles, missing dependencies, duplicates, replay sequences."""

import pytest

from specpilot.memory.dag import (CycleError, DuplicateIdError, MissingDependencyError,
                                  check_unique, replay_sequence, topo_order)

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["c", "b"], "e": ["d"], "f": []}


def test_topological_order_puts_dependencies_first_and_is_stable():
    order = topo_order(DIAMOND)
    assert order == ["a", "b", "c", "d", "e", "f"]
    for entry, deps in DIAMOND.items():
        assert all(order.index(d) < order.index(entry) for d in deps)


def test_replay_sequence_of_a_diamond_applies_each_ancestor_once():
    order = topo_order(DIAMOND)
    assert replay_sequence(DIAMOND, order, "e") == ["a", "b", "c", "d", "e"]
    assert replay_sequence(DIAMOND, order, "c") == ["a", "c"]


def test_cycle_is_named():
    with pytest.raises(CycleError, match=r"a -> c -> b -> a"):
        topo_order({"a": ["c"], "b": ["a"], "c": ["b"], "z": []})


def test_missing_dependency_names_entry_and_dependency():
    with pytest.raises(MissingDependencyError, match=r"entry 'b' depends on 'ghost'"):
        topo_order({"a": [], "b": ["a", "ghost"]})


def test_duplicate_id_is_named():
    with pytest.raises(DuplicateIdError, match=r"duplicate entry id 'a'"):
        check_unique(["a", "b", "a"])
