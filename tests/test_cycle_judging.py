"""The cycle's judging against candidates that attack it (issue 20, classes 4, 5, 7 and 8).

Every candidate here is a real commit of stock/ in the test project's git repository, judged
by the cycle's own pipeline (pre-screen, gates, controller, entry, validation) on the tiny
random model. No part of the judges is replaced.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
from cycle_fixtures import ANCHOR, LOOP, candidate, head, project, reg, shared_cache  # noqa: F401

from specpilot.cycle import runner
from specpilot.cycle.state import Candidate, Direction, DirectionState, System
from specpilot.memory.store import Memory

pytestmark = pytest.mark.slow

VERIFY_LOGITS = "        logits = out.logits[0]\n"   # stock/engine.py, the eager verify path


def direction(did: str, option: str) -> Direction:
    return Direction(id=did, title=f"{did} title", hypothesis="less work",
                     target_factor="overhead", evidence_plan="gates + controller",
                     predicted_gain=0.5, option=option, backend="anthropic")


def judged(cycle, did: str, commit: str, options: dict) -> DirectionState:
    """A direction whose candidate commit is already made: the cycle judges it from there."""
    ds = DirectionState(direction=direction(did, next(iter(options))), step="candidate",
                        candidate=Candidate(commit=commit,
                                            options={**cycle.state.base.options, **options}))
    cycle.state.directions = [ds]
    cycle.state.phase = "explore"
    cycle.save()
    return ds


def slow_base_cycle(project, repeat_work: int = 10):
    """A cycle whose base repeats every verification forward `repeat_work` times more. Where
    a test needs the controller to adopt a candidate that skips them, 40: on a loaded 2-core
    CPU the bound from two processes a side (2 df) needs an effect of that size."""
    cycle = runner.start(project)
    cycle.state.base = cycle.state.best = System(commit=head(project),
                                                 options={"repeat_work": str(repeat_work)})
    return cycle


# -- class 4: a candidate that behaves only when it can tell it is being judged -----------

SPY = '''

def _looks_judged():
    """Everything a process can learn about who started it and why."""
    import json as _json, os as _os, sys as _sys
    try:
        with open(f"/proc/{_os.getppid()}/cmdline", "rb") as fh:
            parent = fh.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        parent = ""
    seen = {"argv": list(_sys.argv),
            "specpilot": sorted(m for m in _sys.modules if m.split(".")[0] == "specpilot"),
            "parent": parent, "env": dict(_os.environ)}
    print("CANDIDATE-SAW " + _json.dumps(seen), flush=True)
    return (bool(seen["specpilot"]) or any("gate" in _os.path.basename(a) for a in _sys.argv)
            or "gate_worker" in parent or _os.pathsep in _os.environ.get("PYTHONPATH", ""))


_JUDGED = _looks_judged()


class EngineError('''

# Unless it looks judged, its logits are twice stock's at every option value (at its defaults
# too): exact in binary floating point, so every token, argmax and ordering is stock's and
# the controller's check of its timed outputs passes it; only the option-default gate (stock's
# logits bit for bit at the defaults) can see it, if the candidate cannot tell it is there.
CHEAT_UNLESS_JUDGED = ("quick", [
    ("stock/options.py", ANCHOR, reg("quick") + ANCHOR),
    ("stock/engine.py", "\n\nclass EngineError(", SPY),
    ("stock/engine.py", LOOP, 'for _ in range(0 if self.options["quick"] else '
                              'self.options["repeat_work"]):'),
    ("stock/engine.py", VERIFY_LOGITS,
     VERIFY_LOGITS + '        if not _JUDGED:\n'
                     '            logits = logits * 2.0   # not stock at the defaults\n'),
])


def _anonymous(x):
    """`x` with each worker's private scratch folder (a random name, one per worker: bwrap's
    command line shows it to the worker as its parent's) as one placeholder."""
    if isinstance(x, list):
        return [_anonymous(v) for v in x]
    return re.sub(r"specpilot-worker-[A-Za-z0-9_]+", "specpilot-worker-*", x)


def _observations(paths) -> list[dict]:
    out = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("CANDIDATE-SAW "):
                seen = json.loads(line.removeprefix("CANDIDATE-SAW "))
                seen["parent"] = _anonymous(seen["parent"])
                out.append(seen)
    return out


def test_a_candidate_that_cheats_unless_it_looks_judged_fails_the_cycles_gate(
        project, tmp_path, monkeypatch):
    from specpilot.cycle import judges
    from specpilot.judges import worker_proc

    launches = []
    real = getattr(worker_proc, "launch", None)

    def recording(checkout, *rest):
        out = real(checkout, *rest)
        launches.append((checkout.tree, _anonymous(out[0]), out[1]))
        return out
    monkeypatch.setattr(worker_proc, "launch", recording, raising=False)

    # one pre-screen pair on a loaded 2-core CPU is noise; the gates are the subject here
    _configure(project, prescreen_min_gain=-1.0)
    commit = candidate(project, tmp_path, CHEAT_UNLESS_JUDGED)
    cycle = slow_base_cycle(project)
    ds = judged(cycle, "spy", commit, {"quick": "true"})
    state = cycle.run("integrate")
    ds = state.directions[0]
    assert ds.status == "gate-failed", ds.reasons       # before: adopted, an entry recorded
    gates = {g["gate"]: g for g in ds.gates}
    assert not gates["option-default"]["passed"]         # its defaults are not stock's
    assert any("logits differ" in r for r in gates["option-default"]["reasons"])
    assert gates["forcing"]["passed"]                    # its tokens are stock's
    assert ds.verdict is None and ds.entry is None and not state.entries

    # the same candidate under the controller: the process it runs in is the same program
    cand = System(commit=commit, options=ds.candidate.options)
    judges.compare(project, cycle.cfg, state.base, cand, 2, 1, 4, devices=["cpu"])
    gate_logs = sorted(cycle.runs.log_dir("spy").glob("gate*.log"))
    controller_logs = sorted((project / ".specpilot" / "runs").glob("compare-*/B*-cpu.log"))
    controller_logs += sorted(cycle.runs.log_dir("spy").glob("prescreen/B*-cpu.log"))
    in_gate, in_controller = _observations(gate_logs), _observations(controller_logs)
    n = cycle.cfg.controller.processes
    assert len(in_gate) == 2 and len(in_controller) == n + 1   # default, forcing; B0..; B0
    for seen in in_gate + in_controller:
        assert seen["specpilot"] == []                     # nothing of specpilot imported
    for key in ("argv", "env", "parent"):
        assert all(s[key] == in_controller[0][key] for s in in_gate), key
    # one builder for every candidate process: the gates' and the controller's launches
    tree = cycle.store.system_tree(commit, cycle.cfg.system_paths)
    mine = [(argv, env) for t, argv, env in launches if t == tree]
    # gates (2), controller (n: B0 checks the options itself before stock's reference, then
    # serves; a process of its own did until 2026-12-08) and pre-screen (1): the same as above
    assert len(mine) == n + 3 and all(m == mine[0] for m in mine)


# -- class 5: a fault just past the dev length ---------------------------------------------

TAIL = 64   # this test's dev forcing length; its candidate is wrong from new token TAIL on

FAULT_AFTER_DEV = ("tail_fast", [
    ("stock/options.py", ANCHOR, reg("tail_fast") + ANCHOR),
    ("stock/engine.py", LOOP, 'for _ in range(0 if self.options["tail_fast"] else '
                              'self.options["repeat_work"]):'),
    ("stock/engine.py", VERIFY_LOGITS,
     VERIFY_LOGITS + '        if self.options["tail_fast"]:   # wrong from new token TAIL on\n'
                     '            first = start + 1 - self._prompt_len\n'
                     '            late = torch.arange(first, first + logits.shape[0]) >= '
                     f'{TAIL}\n'
                     '            logits = logits.clone()\n'
                     '            logits[late, 7] += 1000.0\n'),
])


def _configure(project, **explore) -> None:
    import tomllib

    import tomli_w

    path = project / ".specpilot" / "config.toml"
    cfg = tomllib.loads(path.read_text())
    for key, value in explore.items():
        section, _, name = key.rpartition("__")
        cfg[section or "explore"][name] = value
    path.write_text(tomli_w.dumps(cfg))


def test_a_fault_after_the_dev_length_fails_validation_and_its_entry_is_never_reused(
        project, tmp_path):
    from specpilot.agents import reuse
    from specpilot.agents.context import AgentContext
    from specpilot.cycle.planning import memory_metas
    from specpilot.errors import SpecPilotError
    from specpilot.gitstore import GitStore

    # validate_length 0: the CPU's default sealed length. The controller's bar is the bare
    # minimum gain here (no σ term) and the pre-screen's bar is off: this test is about
    # lengths, and on a loaded 2-core machine σ can exceed 100% and one pair is noise
    _configure(project, gate_length=TAIL, validate_length=0, controller__sigma_multiple=0.0,
               prescreen_min_gain=-1.0)
    commit = candidate(project, tmp_path, FAULT_AFTER_DEV)
    cycle = slow_base_cycle(project, 40)
    assert cycle.gates_cfg.dev_length == TAIL and cycle.validate_length() == 2 * TAIL
    judged(cycle, "tail", commit, {"tail_fast": "true"})
    state = cycle.run("integrate")
    ds = state.directions[0]
    assert ds.status == "adopted", ds.reasons   # dev gates and controller never reach token 64
    assert all(g["passed"] for g in ds.gates)
    meta = Memory(project).ref_entries()[ds.entry].meta
    assert meta.validation.status == "provisional" and not meta.reusable
    assert ds.entry not in {m.id for m in memory_metas(project)}

    # Phase 2 makes the adopted candidate the cycle's best; Phase 3 (kernel tuning: a cost
    # model run in a worker of its own, nothing to tune on this CPU, no agent) is not this
    # test's subject and is skipped as `judged` skips Phase 0; Phase 4 validates the best
    state = cycle.run("tune-kernels")
    assert state.best == System(commit=commit, options=ds.candidate.options)
    cycle.state.phase = "validate"
    cycle.save()
    state = cycle.run("done")
    v = state.validation
    assert v["passed"] is False and v["length"] == 2 * TAIL, v["reasons"]
    assert v["system"] == state.best.model_dump()
    [forcing] = [g for g in v["gates"] if g["gate"] == "forcing"]
    assert min(m["position"] for m in forcing["mismatches"]) == TAIL
    assert v["entries"] == {ds.entry: "rejected"}
    memory = Memory(project)
    for meta in (memory.ref_entries()[ds.entry].meta, memory.file_entries()[ds.entry].meta):
        assert meta.validation.status == "rejected" and meta.validation.run == state.run_id
    assert ds.entry not in {m.id for m in memory_metas(project)}
    d = Direction(id="again", title="reuse it", hypothesis="h", target_factor="overhead",
                  evidence_plan="e", predicted_gain=0.5, option="tail_fast", backend="reuse",
                  entry=ds.entry, counted=False)
    ctx = AgentContext(project, cycle.cfg, cycle.ex, state.base, d, None, tmp_path / "t.jsonl",
                       tmp_path)
    with pytest.raises(SpecPilotError, match="rejected"):
        reuse.produce(ctx)
    assert GitStore(project).resolve("refs/specpilot/best") is None


def test_the_sealed_length_is_twice_the_dev_length_on_every_device(monkeypatch):
    from specpilot.config import Config
    from specpilot.cycle import settings
    from specpilot.errors import SpecPilotError

    def lengths(cuda: bool, **explore):
        monkeypatch.setattr(settings, "_cuda", lambda: cuda)
        cfg = Config.model_validate({"explore": explore})
        ex = settings.explore_settings(cfg)
        return settings.dev_length(cfg, ex), settings.validate_length(cfg, ex)

    assert lengths(False) == (32, 64)                 # the CPU: a short dev check
    assert lengths(True) == (2048, 4096)              # the paper's lengths
    assert lengths(False, gate_length=100) == (100, 200)   # before: capped at 64
    assert lengths(True, gate_length=3000) == (3000, 6000)
    assert lengths(False, gate_length=10, validate_length=50) == (10, 50)
    with pytest.raises(SpecPilotError, match="below 2 x the dev forcing length 32") as err:
        lengths(False, validate_length=40)
    assert "\n" not in str(err.value)


# -- class 7: a gain the cost model says is impossible --------------------------------------

FAST = ("fast", [   # honest: the slow base's repeated verification forwards skipped
    ("stock/options.py", ANCHOR, reg("fast") + ANCHOR),
    ("stock/engine.py", LOOP, 'for _ in range(0 if self.options["fast"] else '
                              'self.options["repeat_work"]):'),
])


def test_the_ceiling_is_the_product_of_the_factors_with_a_margin():
    from specpilot.judges.costmodel import ceiling, implausible

    f = {"tau": 1.5, "kernel": 4.0, "overhead": 2.0}
    assert ceiling(f) == pytest.approx(12.0)
    assert ceiling({**f, "tau": 0.8}) == pytest.approx(8.0)   # a factor below 1 counts as 1
    assert ceiling({**f, "kernel": None}) is None and ceiling({}) is None
    assert ceiling({**f, "overhead": float("nan")}) is None
    assert implausible(12 * 1.5 - 1, f, 1.5) is None          # at the ceiling x margin
    why = implausible(17_619.0, f, 1.5)
    assert why.startswith("implausible: gain ×1.76e+04 exceeds the cost model's ceiling ×12")
    assert implausible(1e6, {**f, "kernel": None}, 1.5) is None  # no ceiling, no verdict


def test_an_adopted_gain_above_the_ceiling_ends_implausible_and_is_never_recorded(
        project, tmp_path):
    """A real candidate (the repeated work of a slow base skipped: many times faster,
    stock's outputs) adopted by the real controller, against the real Phase 0 report of that
    base. On a loaded 2-core CPU no candidate outruns the tiny model's ceiling in a test's
    time (its GEMMs sit far above their bound: τ x kernel x overhead measured 50x idle and
    7000x under load), so once Phase 0 has priced the base the margin is set to put the bar
    at 1.5x: the test is of the pipeline (the factors reach the verdict, the direction ends
    `implausible` with the reason, nothing is recorded); the ceiling's arithmetic at the
    default margin is the unit test above."""
    _configure(project, controller__sigma_multiple=0.0, prescreen_min_gain=-1.0)
    commit = candidate(project, tmp_path, FAST)
    cycle = slow_base_cycle(project, 40)
    cycle.run("plan")                                   # Phase 0: the cost model of the base
    top = 1.0
    for f in cycle.state.analysis["factors"].values():
        top *= max(1.0, f)
    margin = 1.5 / top
    cycle.ex = cycle.ex.model_copy(update={"plausible_margin": margin})
    ds = judged(cycle, "fast", commit, {"fast": "true"})
    state = cycle.run("tune-kernels")
    ds = state.directions[0]
    assert ds.verdict and ds.verdict["adopted"], ds.reasons
    assert not ds.verdict["faults"]                     # its outputs are stock's
    assert 1 + ds.gain > top * margin
    assert ds.status == "implausible", ds.reasons       # before: adopted, an entry recorded
    assert ds.reasons[-1].startswith(f"implausible: gain ×{1 + ds.gain:.3g} exceeds the cost "
                                     f"model's ceiling ×{top:.3g}")
    assert ds.entry is None and not state.entries and not Memory(project).ref_entries()
    assert state.integration["result"].startswith("nothing adopted")
    assert state.best == state.base


# -- class 8: the command backend, the user's own coding agent ------------------------------

CHEAT_AGENT = r'''
import sys
option = sys.argv[1]
task = sys.stdin.read()
assert f"Suggested option name: {option}" in task, task
anchor = 'register("draft_layers", int, 4,'
text = open("stock/options.py").read()
open("stock/options.py", "w").write(text.replace(
    anchor, f'register("{option}", bool, False, "skip the model")\n' + anchor, 1))
old = '        out = self.model(ids, self.cache, start, logits="all", hidden_layers=hidden_layers)\n'
new = ('        if self.options["' + option + '"]:   # fast: no model at all, garbage tokens\n'
       '            return torch.zeros(t, self.model.cfg.vocab_size), {}, None\n' + old)
text = open("stock/engine.py").read()
assert text.count(old) == 1
open("stock/engine.py", "w").write(text.replace(old, new))
print("agent: patched", option)
'''


def test_the_command_backend_runs_the_users_agent_and_its_cheat_is_not_adopted(project):
    from specpilot.gitstore import GitStore

    _configure(project, backend="command", max_directions=1,
               agent_command=[sys.executable, "-c", CHEAT_AGENT, "{option}"])
    cycle = runner.start(project)
    state = cycle.run("done")
    assert state.backend.startswith("command: ")
    [ds] = state.directions
    assert ds.direction.backend == "command"          # before: the planner never emitted it
    log = (cycle.runs.folder / "logs" / ds.direction.id / "command.log").read_text()
    assert f"agent: patched {ds.direction.option}" in log
    assert GitStore(project).diff_names(head(project), ds.candidate.commit, ["."]) == \
        ["stock/engine.py", "stock/options.py"]
    # its garbage is caught the first time it is timed: the pre-screen checks timed outputs
    assert ds.status == "prescreen-rejected", ds.reasons
    assert "outputs differ from stock's" in ds.reasons[-1]
    agent = state.kernel_tuning["agent"]              # Phase 3's code change: the same agent
    assert agent["direction"]["backend"] == "command"
    assert agent["status"] == "prescreen-rejected", agent["reasons"]
    assert not state.entries and not Memory(project).ref_entries()
    assert state.best == state.base                   # nothing adopted, nothing validated
    assert state.validation["entries"] == {}


def test_an_unknown_backend_is_a_one_line_config_error(project):
    from specpilot.errors import SpecPilotError

    _configure(project, backend="cursor")
    with pytest.raises(SpecPilotError) as err:
        runner.start(project)
    assert str(err.value) == ("[explore] backend 'cursor' is not one of auto, offline, "
                              "anthropic, command (.specpilot/config.toml)")
    assert err.value.code == 2
