"""Phase 2, `specpilot integrate`: adopted entries stacked onto the base by measured gain,
conflicts to the integration agent (scripted client) or dropped offline, the stack measured
by the real controller and recorded as an entry whose dependencies are the stacked entries.
Real git repos; the tiny random model."""

from __future__ import annotations

import json

import pytest
from cycle_fixtures import (BASE_OPTIONS, BOTH, LOOP, A, B, C, ScriptedClient,  # noqa: F401
                            edited, head, project, reply, setup_adopted, shared_cache, tool)

from specpilot.cycle.state import System
from specpilot.gitstore import GitStore
from specpilot.memory.store import Memory
from specpilot.memory.verify import verify

pytestmark = pytest.mark.slow

def file_at(root, commit, path) -> str:
    return GitStore(root).run("show", f"{commit}:{path}")


def test_clean_stack_by_gain_measured_and_recorded_with_the_stacked_entries_as_deps(
        project, tmp_path):
    cycle = setup_adopted(project, tmp_path, [(A, 0.3), (B, 0.6)])
    da, db = cycle.state.directions
    state = cycle.run("tune-kernels")
    rec = state.integration
    assert rec["order"] == [db.direction.id, da.direction.id]      # highest gain first
    assert rec["stack"] == rec["order"] and rec["dropped"] == []
    stack = System.model_validate(rec["system"])
    engine = file_at(project, stack.commit, "stock/engine.py")
    assert A[1][1][2] in engine and B[1][1][2] in engine
    assert stack.options == {**BASE_OPTIONS, "skip_a": "true", "cap_b": "true"}
    v = rec["verdict"]
    assert v["a"] == head(project) and v["b"] == stack.commit and v["pairs"] >= 2
    assert v["adopted"], v                      # the stack removes the base's repeated work
    assert state.best == stack and rec["result"] == "stack adopted"
    entries = Memory(project).ref_entries()
    meta = entries[rec["entry"]].meta
    assert rec["deps"] == [db.entry, da.entry] and meta.deps == rec["deps"]
    assert rec["carried"] == [] and rec["entry"] in state.entries
    assert {o.name: o.tuned for o in meta.options} == {"skip_a": True, "cap_b": True}
    assert meta.results[0].value == v["gain"]
    assert verify(Memory(project), "all", [rec["entry"]]).ok
    # `specpilot integrate` again: the same stack is the same entry, not a second one
    from specpilot.cycle.entries import record_integration

    again = record_integration(cycle, [db, da], stack, v, [])
    assert again == {"entry": rec["entry"], "deps": rec["deps"], "carried": []}
    assert len(Memory(project).ref_entries()) == len(entries)


def test_conflict_without_a_key_drops_the_entry_with_a_reason(project, tmp_path):
    cycle = setup_adopted(project, tmp_path, [(A, 0.6), (C, 0.3)])
    da, dc = cycle.state.directions
    state = cycle.run("tune-kernels")
    rec = state.integration
    assert rec["stack"] == [da.direction.id]
    [drop] = rec["dropped"]
    assert drop["direction"] == dc.direction.id
    assert "3-way conflict in stock/engine.py" in drop["reason"] and "offline" in drop["reason"]
    assert state.best == System(commit=da.candidate.commit, options=da.candidate.options)
    assert "verdict stands" in rec["result"] and "entry" not in rec


def test_conflict_goes_to_the_integration_agent_and_the_resolved_stack_is_recorded(
        project, tmp_path):
    resolved = edited(project, [A[1][0], C[1][0], ("stock/engine.py", LOOP, BOTH)])
    client = ScriptedClient([
        reply("tool_use", tool("grep", pattern="<<<<<<<", path="stock")),
        reply("tool_use", *[tool("write", path=p, content=t) for p, t in resolved.items()],
              tool("submit", option="half_c", value="true", summary="both loops, one line",
                   predicted_gain=0)),
    ])
    cycle = setup_adopted(project, tmp_path, [(C, 0.3), (A, 0.6)], client)
    dc, da = cycle.state.directions
    state = cycle.run("tune-kernels")
    rec = state.integration
    assert rec["order"] == [da.direction.id, dc.direction.id]
    assert rec["dropped"] == [] and rec["resolved"] == [dc.direction.id]
    task = client.requests[0]["messages"][0]["content"]
    assert "stock/engine.py" in task and dc.direction.id in task
    found = client.tool_results()[0]["content"]
    assert "<<<<<<<" in found                 # the agent saw the real conflict markers
    stack = System.model_validate(rec["system"])
    assert BOTH in file_at(project, stack.commit, "stock/engine.py")
    assert rec["verdict"]["adopted"], rec["verdict"]
    # A and C's own patches do not compose by a plain apply: A is the dependency and the
    # integration's own patch carries C as resolved
    assert rec["deps"] == [da.entry] and rec["carried"] == [dc.entry]
    assert verify(Memory(project), "all", [rec["entry"]]).ok
    lines = [json.loads(x) for x in (project / ".specpilot" / "runs" / state.run_id
                                     / "transcripts" / "integrate.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines][0] == "conflict" and lines[-1]["event"] == "resolved"


def test_recording_an_adopted_direction_again_returns_the_same_entry(project, tmp_path):
    from specpilot.cycle.entries import record_adopted
    from specpilot.memory.store import Memory

    cycle = setup_adopted(project, tmp_path, [(A, 0.3)])
    ds = cycle.state.directions[0]
    before = Memory(project).ref_entries()
    assert ds.entry in before
    assert record_adopted(cycle, ds) == ds.entry        # a resumed cycle, integrate again
    assert Memory(project).ref_entries().keys() == before.keys()
    other = ds.model_copy(deep=True)
    other.candidate.commit = head(project)               # same id, a different system
    with pytest.raises(RuntimeError, match="different system tree"):
        record_adopted(cycle, other)
