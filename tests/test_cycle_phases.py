"""Phase 0 (the judges' cost model on the base) and Phase 3 (kernel tuning), on the tiny
random model and real git."""

from __future__ import annotations

import pytest
from cycle_fixtures import (ANCHOR, LOOP, B, ScriptedClient, head, project, reg,  # noqa: F401
                            reply, setup_adopted, shared_cache, tool)

from specpilot.cycle import runner
from specpilot.cycle.state import System

pytestmark = pytest.mark.slow


def test_phase0_runs_the_cost_model_on_the_base_and_stores_its_report(project):
    cycle = runner.start(project)
    cycle.run("plan")
    a = cycle.state.analysis
    assert a["source"].startswith("specpilot.judges.analyze")
    assert a["system"] == {"commit": head(project), "options": {}}
    assert set(a["factors"]) == {"tau", "kernel", "overhead"}
    assert a["steps"] > 0 and a["requests"] == ["rand-0"]
    cats = {r["category"]: r for r in a["categories"]}
    assert cats["gemm"]["bound_ms"] > 0 and cats["gemm"]["measured_ms"] > 0
    assert cats["gemm"]["ratio"] == pytest.approx(cats["gemm"]["measured_ms"]
                                                  / cats["gemm"]["bound_ms"])
    assert (cycle.runs.folder / "logs" / "analyze" / "analyze.log").is_file()
    saved = cycle.runs.load()
    assert saved.analysis == a and saved.phase == "plan"


def test_phase0_report_is_of_the_base_system_at_its_options(project):
    from specpilot.cycle import judges
    from specpilot.cycle.state import System

    cycle = runner.start(project)
    rep = judges.analyze(project, cycle.cfg, System(commit=head(project),
                                                    options={"draft_len": "1"}),
                         1, 8, cycle.runs.log_dir("analyze"))
    assert rep["system"]["options"] == {"draft_len": "1"}
    assert 1 <= rep["tokens_per_step"] <= 2     # pending token + at most one draft token


def test_phase3_autotunes_the_worst_category_options_then_gates_and_controller(project):
    from specpilot.cycle.settings import ExploreSection

    cycle = runner.start(project)
    # repeat_work repeats every verification forward: declare it as acting on both kernel
    # categories so whichever ranks worst tunes it; the base runs it at 10
    cycle.ex = ExploreSection.model_validate({**cycle.ex.model_dump(), "kernel_categories": 1,
                                              "kernel_configs": 2,
                                              "kernel_options": {"gemm": ["repeat_work"],
                                                                 "attention": ["repeat_work"]}})
    base = System(commit=head(project), options={"repeat_work": "10"})
    cycle.state.base = cycle.state.best = base
    cycle.state.phase = "tune-kernels"
    state = cycle.run("validate")
    rec = state.kernel_tuning
    assert rec["profile"] == "cost model on the integrated system"   # no Phase 0 report here
    assert rec["analysis"]["system"] == base.model_dump()
    ratios = [r["over_bound"] for r in rec["ranking"]]
    assert ratios == sorted(ratios, reverse=True) and rec["ranking"][0]["category"] in (
        "gemm", "attention")
    [cat] = rec["categories"]
    # stock's own options that name the category (attention_kernel, fuse_projections) act on
    # CUDA only: on this CPU only the declared one is tuned
    assert cat["category"] == rec["ranking"][0]["category"] and cat["options"] == ["repeat_work"]
    assert [t["config"] for t in cat["tried"]] == [{"repeat_work": v} for v in
                                                   ("5", "8")]
    assert all(t["requests"] >= 1 for t in cat["tried"])
    assert cat["best_config"] in [t["config"] for t in cat["tried"]]
    if cat["estimated_gain"] >= cycle.ex.prescreen_min_gain:   # went on to gates + controller
        assert [g["passed"] for g in cat["gates"]] == [True]  # repeat_work keeps the logits
        adopted = cat["verdict"]["adopted"]
        assert state.best.options == ({"repeat_work": cat["best_config"]["repeat_work"]}
                                      if adopted else base.options)
    else:
        assert "gates" not in cat and state.best == base
    assert rec["agent"]["result"].startswith("skipped: code changes need an agent")


def test_phase3_hands_the_worst_category_to_an_agent_from_the_integrated_system(project,
                                                                               tmp_path):
    from specpilot.cycle.state import FINAL, DirectionState
    from specpilot.gitstore import GitStore
    from specpilot.memory.store import Memory
    from specpilot.memory.verify import verify

    client = ScriptedClient([
        reply("tool_use", tool("edit", path="stock/options.py", old=ANCHOR,
                               new=reg("fast_k") + ANCHOR),
              tool("edit", path="stock/engine.py", old=LOOP,
                   new='for _ in range(0 if self.options["fast_k"] else '
                       'self.options["repeat_work"]):')),
        reply("tool_use", tool("submit", option="fast_k", value="true",
                               summary="skip the repeated forwards", predicted_gain=0.5)),
    ])
    cycle = setup_adopted(project, tmp_path, [(B, 0.2)], client)
    [db] = cycle.state.directions
    cycle.ex = cycle.ex.model_copy(update={"kernel_categories": 0})
    state = cycle.run("validate")
    best_before = System(commit=db.candidate.commit, options=db.candidate.options)
    rec = state.kernel_tuning
    assert rec["system"] == best_before.model_dump()       # Phase 2: one adopted direction
    assert rec["analysis"]["system"] == best_before.model_dump()
    worst = rec["ranking"][0]
    ds = DirectionState.model_validate(rec["agent"])
    assert ds.direction.id == f"kernel-{worst['category']}"
    assert ds.base == best_before and ds.deps == [db.entry]
    task = client.requests[0]["messages"][0]["content"]
    assert worst["category"] in task and "lower bound" in task
    store = GitStore(project)
    assert store.parents(ds.candidate.commit) == [db.candidate.commit]   # built on the stack
    assert ds.status in FINAL and ds.reasons
    if ds.status == "adopted":
        assert state.best == System(commit=ds.candidate.commit, options=ds.candidate.options)
    else:
        assert state.best == best_before
        if ds.verdict:   # record it anyway: the entry must stand on the integrated system's
            ds.entry = cycle.record_entry(ds)
    if ds.entry:
        meta = Memory(project).ref_entries()[ds.entry].meta
        assert meta.deps == [db.entry]
        assert verify(Memory(project), "all", [ds.entry]).ok


def test_kernel_options_leave_out_those_idle_on_the_device():
    """Options naming a category are tuned only where they act: stock's CUDA-only ones are
    offered on cuda:N and not on the CPU; a declared option is always kept; the registry
    a worker reports carries each option's device types."""
    from specpilot.cycle.kernel_tuning import options_for
    from specpilot.judges.worker_main import registry as registered_options

    registry = registered_options()
    assert registry["attention_kernel"]["devices"] == ["cuda"]
    assert registry["draft_len"]["devices"] is None
    on_gpu = options_for("attention", registry, {}, "cuda:0")
    assert "attention_kernel" in on_gpu
    assert "attention_kernel" not in options_for("attention", registry, {}, "cpu")
    assert "fuse_projections" in options_for("gemm", registry, {}, "cuda")
    assert "fuse_projections" not in options_for("gemm", registry, {}, "cpu")
    declared = options_for("gemm", registry, {"gemm": ["fuse_projections"]}, "cpu")
    assert declared[0] == "fuse_projections"  # declared by the user: kept, first
    assert options_for("attention", registry, {}) == on_gpu  # no device known: all
