"""Phase 2, `specpilot integrate`: adopted entries stacked onto the base by measured gain,
conflicts to the integration agent (scripted client) or dropped offline, the stack measured
by the real controller and recorded as an entry whose dependencies are the stacked entries.
Real git repos; the tiny random model."""

from __future__ import annotations

import json
import subprocess

import pytest
from cycle_fixtures import (GIT_ENV, ScriptedClient, head, project, reply,  # noqa: F401
                            shared_cache, tool)

from specpilot.cycle import runner
from specpilot.cycle.state import Candidate, Direction, DirectionState, System
from specpilot.gitstore import GitStore
from specpilot.memory.store import Memory
from specpilot.memory.verify import verify

pytestmark = pytest.mark.slow

BASE_OPTIONS = {"repeat_work": "10"}   # a deliberately slow base: the patches remove work
LOOP = 'for _ in range(self.options["repeat_work"]):'
KMAX = 'k_max = self.options["draft_len"] if drafter is not None else 0'
ANCHOR = 'register("draft_layers", int, 4,'


def reg(name: str) -> str:
    return f'register("{name}", bool, False, "test patch {name}")\n'


A = ("skip_a", [("stock/options.py", ANCHOR, reg("skip_a") + ANCHOR),
                ("stock/engine.py", LOOP,
                 'for _ in range(0 if self.options["skip_a"] else self.options["repeat_work"]):')])
B = ("cap_b", [("stock/options.py", None, reg("cap_b")),     # None: append
               ("stock/engine.py", KMAX,
                'k_max = (min(self.options["draft_len"], 8) if self.options["cap_b"] else '
                'self.options["draft_len"]) if drafter is not None else 0')])
C = ("half_c", [("stock/options.py", ANCHOR, reg("half_c") + ANCHOR),
                ("stock/engine.py", LOOP, 'for _ in range(self.options["repeat_work"] // '
                                          '(2 if self.options["half_c"] else 1)):')])
BOTH = ('for _ in range(0 if self.options["skip_a"] else self.options["repeat_work"] // '
        '(2 if self.options["half_c"] else 1)):')


def _git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**__import__("os").environ, **GIT_ENV}).stdout


def edited(root, edits) -> dict[str, str]:
    out = {}
    for path, old, new in edits:
        text = out.get(path, (root / path).read_text())
        if old is None:
            text += new
        else:
            assert text.count(old) == 1, (path, old)
            text = text.replace(old, new)
        out[path] = text
    return out


def candidate(root, tmp_path, patch) -> str:
    """A real commit on its own branch: stock with `patch`'s edits."""
    name, edits = patch
    wt = tmp_path / f"wt-{name}"
    _git(root, "worktree", "add", "-q", "-b", f"cand-{name}", str(wt), "HEAD")
    for path, text in edited(wt, edits).items():
        (wt / path).write_text(text)
    _git(wt, "commit", "-qam", f"{name}")
    sha = _git(wt, "rev-parse", "HEAD").strip()
    _git(root, "worktree", "remove", "--force", str(wt))
    return sha


def adopted(cycle, root, tmp_path, patch, gain: float) -> DirectionState:
    """An adopted Phase 1 direction with its memory entry (recorded by the cycle's own code)."""
    name, _ = patch
    d = Direction(id=f"d-{name.replace('_', '-')}", title=name, hypothesis="less work",
                  target_factor="overhead", evidence_plan="e", predicted_gain=gain,
                  option=name, backend="anthropic")
    ds = DirectionState(direction=d, status="adopted", step="recorded", gain=gain,
                        lower_bound=gain / 2,
                        candidate=Candidate(commit=candidate(root, tmp_path, patch),
                                            options={**BASE_OPTIONS, name: "true"}),
                        gates=[{"gate": "forcing", "check": "dev", "passed": True, "reasons": [],
                                "option_specs": {name: {"type": "bool", "default": False,
                                                        "help": f"test patch {name}"}}}],
                        verdict={"adopted": True, "gain": gain, "lower_bound": gain / 2,
                                 "threshold": 0.01, "requests": ["rand-0"], "max_new": 8,
                                 "hardware": "cpu"})
    ds.entry = cycle.record_entry(ds)
    return ds


def setup(project, tmp_path, patches, client=None):
    cycle = runner.start(project, client=client)
    cycle.sleep = lambda s: None
    base = System(commit=head(project), options=BASE_OPTIONS)
    cycle.state.base = cycle.state.best = base
    cycle.state.directions = [adopted(cycle, project, tmp_path, p, g) for p, g in patches]
    cycle.state.phase = "integrate"
    cycle.save()
    return cycle


def file_at(root, commit, path) -> str:
    return GitStore(root).run("show", f"{commit}:{path}")


def test_clean_stack_by_gain_measured_and_recorded_with_the_stacked_entries_as_deps(
        project, tmp_path):
    cycle = setup(project, tmp_path, [(A, 0.3), (B, 0.6)])
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
    cycle = setup(project, tmp_path, [(A, 0.6), (C, 0.3)])
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
    cycle = setup(project, tmp_path, [(C, 0.3), (A, 0.6)], client)
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
