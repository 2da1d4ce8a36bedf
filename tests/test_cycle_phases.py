"""Phase 0 (the judges' cost model on the base) and Phase 3 (kernel tuning), on the tiny
random model and real git."""

from __future__ import annotations

import pytest
from cycle_fixtures import head, project, shared_cache  # noqa: F401

from specpilot.cycle import runner

pytestmark = pytest.mark.slow


def test_phase0_runs_the_cost_model_on_the_base_and_stores_its_report(project):
    cycle = runner.start(project)
    cycle.run("plan")
    a = cycle.state.analysis
    assert a["source"].startswith("specpilot.analyze")
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
