"""Sub-agents through the real tool loop (scripted client) and the real judges."""

from __future__ import annotations

import pytest
from cycle_fixtures import ScriptedClient, head, project, reply, shared_cache, text, tool  # noqa: F401

from specpilot.cycle import runner
from specpilot.judges.gates import gate_requests
from specpilot.cycle.state import Direction, DirectionState, System
from specpilot.memory.store import Memory
from specpilot.memory.verify import verify

pytestmark = pytest.mark.slow

LOOP = 'for _ in range(self.options["repeat_work"]):'
BASE_OPTIONS = {"repeat_work": "10"}   # a deliberately slow base: the patch removes real work


def direction(did: str, option: str) -> Direction:
    return Direction(id=did, title=f"{did} title", hypothesis="skip redundant verify work",
                     target_factor="overhead", evidence_plan="gates + controller",
                     predicted_gain=0.5, files=["stock/engine.py"], option=option,
                     backend="anthropic")


def register(option: str) -> dict:
    return tool("edit", path="stock/options.py",
                old='register("draft_layers", int, 4,',
                new=f'register("{option}", bool, False, "test patch")\n'
                    f'register("draft_layers", int, 4,')


def run_cycle(root, client, d: Direction, until: str, base_options=BASE_OPTIONS):
    cycle = runner.start(root, client=client)
    cycle.sleep = lambda s: None
    base = System(commit=head(root), options=dict(base_options))
    cycle.state.base = cycle.state.best = base
    cycle.state.directions = [DirectionState(direction=d)]
    cycle.state.phase = "explore"
    cycle.save()
    return cycle.run(until)


def test_scripted_agent_patch_passes_gates_and_controller_and_becomes_an_entry(project):
    client = ScriptedClient([
        reply("tool_use", text("Looking."), tool("grep", pattern="repeat_work", path="stock")),
        reply("tool_use", tool("read", path="stock/engine.py", start=80, end=95)),
        reply("tool_use", register("fast_verify"),
              tool("edit", path="stock/engine.py", old=LOOP,
                   new='for _ in range(0 if self.options["fast_verify"] else '
                       'self.options["repeat_work"]):')),
        reply("tool_use", tool("submit", option="fast_verify", value="true",
                               summary="skip the repeated verify forward", predicted_gain=0.8)),
    ])
    # 4 controller rounds (8 cells a process), not the fixture's 2: one timing spike among 4
    # cells once put σ at 44 % on the 2-core CI machine and kept a 3x gain from adoption
    cfg = project / ".specpilot" / "config.toml"
    cfg.write_text(cfg.read_text().replace("controller_rounds = 2", "controller_rounds = 4"))
    state = run_cycle(project, client, direction("skip-repeat", "fast_verify"), "integrate")
    ds = state.directions[0]
    assert ds.status == "adopted", ds.reasons
    assert ds.verdict["rounds"] == 4 and ds.verdict["pairs"] == 8
    assert [g["passed"] for g in ds.gates] == [True, True]
    assert ds.verdict["adopted"] and ds.lower_bound > ds.verdict["threshold"]
    entries = Memory(project).ref_entries()
    assert ds.entry in entries
    meta = entries[ds.entry].meta
    assert meta.provenance.kind == "discovered"
    assert [(o.name, o.type, o.default, o.tuned) for o in meta.options] == \
        [("fast_verify", "bool", False, True)]
    assert verify(Memory(project), "all", [ds.entry]).ok
    lines = (project / ".specpilot" / "runs" / state.run_id / "transcripts"
             / "skip-repeat.jsonl").read_text().splitlines()
    assert sum('"event": "tool"' in line for line in lines) == 5


def test_patch_whose_default_changes_stock_is_rejected_by_the_option_default_gate(project):
    client = ScriptedClient([
        reply("tool_use", register("scaled_logits"),
              tool("edit", path="stock/engine.py", old="logits = out.logits[0]\n",
                   new="logits = out.logits[0] * 1.001  # not behind the option\n")),
        reply("tool_use", tool("submit", option="scaled_logits", value="true",
                               summary="scale", predicted_gain=0.1)),
    ])
    d = direction("scale", "scaled_logits")
    cycle = runner.start(project, client=client)
    cycle.state.base = cycle.state.best = System(commit=head(project))
    cycle.state.directions = [DirectionState(direction=d)]
    cycle.state.phase = "explore"
    ex = cycle.ex.model_copy(update={"prescreen_min_gain": -1.0})   # reach the gates
    cycle.ex = ex
    state = cycle.run("integrate")
    ds = state.directions[0]
    assert ds.status == "gate-failed"
    assert ds.gates[0]["gate"] == "option-default" and not ds.gates[0]["passed"]
    assert any("logits differ" in r for r in ds.reasons)
    assert ds.verdict is None and ds.entry is None


def test_patch_overfit_to_the_dev_prompts_is_caught_on_fresh_prompts(project):
    """Right on the dev prompts only. It used to pass the dev gates and the controller and
    fail only the sealed validation; the pre-screen now times fresh prompts and checks its
    outputs against stock's, so it stops there, and nothing is recorded or validated."""
    dev_keys = sorted({tuple(ids[:4]) for _rid, _p, ids in gate_requests("random:x", "dev", 8)})
    client = ScriptedClient([
        reply("tool_use", register("memo_fast"),
              tool("edit", path="stock/engine.py", old=LOOP,
                   new='for _ in range(0 if self.options["memo_fast"] else '
                       'self.options["repeat_work"]):'),
              tool("edit", path="stock/engine.py", old="        logits = out.logits[0]\n",
                   new="        logits = out.logits[0]\n"
                       f"        if self.options['memo_fast'] and self._key not in {dev_keys!r}:\n"
                       "            logits = logits.clone()\n"
                       "            logits[:, 3] += 1000.0\n"),
              tool("edit", path="stock/engine.py", old="            self._prompt_len = t\n",
                   new="            self._prompt_len = t\n"
                       "            self._key = tuple(prompt[:4])\n"),
              tool("edit", path="stock/engine.py",
                   old="        self.cache.rollback(0)\n        self._prompt_len = len(prompt)\n",
                   new="        self.cache.rollback(0)\n        self._prompt_len = len(prompt)\n"
                       "        self._key = tuple(prompt[:4])\n")),
        reply("tool_use", tool("submit", option="memo_fast", value="true",
                               summary="fast on the prompts I know", predicted_gain=0.9)),
    ])
    # the base is stock at its defaults: the pre-screen must reject the patch for its
    # outputs (a gain check alone would also stop a patch that saves nothing, so the
    # reason is asserted), and the validation of a best that is stock runs its sealed gates
    # but no controller against stock itself (a slow base cost a second full comparison)
    state = run_cycle(project, client, direction("memo", "memo_fast"), "done", {})
    ds = state.directions[0]
    assert ds.status == "prescreen-rejected", ds.reasons
    assert "outputs differ from stock's" in ds.reasons[-1]
    assert ds.entry is None and not state.entries
    assert "memo_fast" not in state.best.options
    assert state.validation["entries"] == {}
