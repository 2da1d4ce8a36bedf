"""Run records and the planner (fast: no model runs)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from cycle_fixtures import ScriptedClient, head, project, reply, shared_cache, text  # noqa: F401

from specpilot.agents.planner import anthropic_plan, offline_plan
from specpilot.cli import cli
from specpilot.cycle import runner
from specpilot.cycle.planning import memory_metas
from specpilot.cycle.state import Direction, DirectionState, RunStore, list_runs
from specpilot.errors import SpecPilotError

ANALYSIS = {"factors": {"tau": 1.3, "kernel": 4.0, "overhead": 1.1}}


def test_run_record_round_trips_and_lists(project):
    c = runner.start(project)
    c.state.directions = [DirectionState(direction=offline_plan(ANALYSIS, [], "ngram", 1, 2)[0])]
    c.save()
    again = RunStore(project, c.state.run_id).load()
    assert again == c.state and again.base.commit == head(project)
    assert [r.run_id for r in list_runs(project)] == [c.state.run_id]
    res = CliRunner().invoke(cli, ["runs", "list", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["directions"] == {"tune-draft_len": "pending"}
    res = CliRunner().invoke(cli, ["runs", "show", c.state.run_id, "--json"])
    assert json.loads(res.output)["run_id"] == c.state.run_id


def test_unreadable_or_missing_run_record_is_an_error(project):
    with pytest.raises(SpecPilotError, match="no run"):
        RunStore(project, "run-nope").load()
    c = runner.start(project)
    c.runs.state_path.write_text('{"schema_version": 1}')
    with pytest.raises(SpecPilotError, match="unreadable"):
        RunStore(project, c.state.run_id).load()


def test_offline_plan_reuses_memory_first_then_tunes_by_factor(project):
    metas = memory_metas(project)            # the entries the project ships in memory/
    assert {"fused-rmsnorm", "w12-weights"} <= {m.id for m in metas}
    # an entry with no option of its own (tree-verify-gdn acts through its dependency's
    # tree_budget) is no direction of its own
    # and an entry for the batched engine alone (prompt-admission) is none on this
    # single-request cycle, one on a batched load
    reuses = len([m for m in metas if m.options and m.load != "batched"])
    dirs = offline_plan(ANALYSIS, metas, "ngram", reuses + 2, 2)
    assert {"tree-verify-gdn", "prompt-admission"}.isdisjoint({d.entry for d in dirs})
    # on a batched load every entry with an option of its own is reused, memory first
    every = [m.id for m in metas if m.options]
    batched = offline_plan(ANALYSIS, metas, "ngram", len(every) + 2, 2, load="batched")
    assert {d.entry for d in batched[:len(every)]} == set(every)
    assert "prompt-admission" in every and [d.backend for d in batched[len(every):]] == \
        ["tune", "tune"]
    assert [d.backend for d in dirs] == ["reuse"] * reuses + ["tune", "tune"]
    assert all(d.counted is False for d in dirs[:reuses])
    reuse = {d.entry: d for d in dirs[:reuses]}
    assert reuse["fused-rmsnorm"].option == "rmsnorm_impl"
    assert reuse["fused-rmsnorm"].target_factor == "kernel"
    assert reuse["w12-weights"].option == "weights"
    tune = dirs[reuses]
    # where its verify step fills a graph bucket: 7 and 15 (8 + 1 runs in the 16 bucket)
    assert tune.option == "draft_len" and tune.values == ["7", "15"]
    assert all(d.title and d.hypothesis and d.evidence_plan for d in dirs)
    # the cap keeps the plan's order: memory first
    assert [d.backend for d in offline_plan(ANALYSIS, metas, "ngram", 1, 2)] == ["reuse"]


def test_draft_lengths_are_tried_where_their_step_fills_a_graph_bucket():
    """draft_len + 1 tokens a verify step, run in power-of-two token buckets: nearest the
    default first, within the option's range, never the default."""
    from specpilot.cycle.search import bucket_values

    assert bucket_values(8, 2, 1, 256) == ["7", "15"]
    assert bucket_values(16, 2, 1, 256) == ["15", "31"]
    assert bucket_values(8, 3, 1, 8) == ["7", "3", "1"]
    assert bucket_values(7, 2, 1, 256) == ["3", "15"]


def test_offline_plan_tunes_the_drafter_the_analysis_measured_for_auto():
    """controller.drafter "auto" is resolved by the worker (stock.system.make_drafter); the
    analysis records the drafter it measured, and the tune directions are that drafter's."""
    tunes = lambda analysis: [d.option for d in offline_plan(analysis, [], "auto", 9, 2)]  # noqa
    assert tunes(dict(ANALYSIS, drafter="ngram")) == ["draft_len", "ngram_max", "ngram_min"]
    assert tunes(dict(ANALYSIS, drafter="block")) == ["draft_len"]
    assert tunes(ANALYSIS) == []          # an old record without one: nothing to tune by name


def test_anthropic_plan_is_validated_with_one_repair_retry():
    good = [{"id": "tree-verify", "title": "t", "hypothesis": "h", "target_factor": "tau",
             "evidence_plan": "e", "predicted_gain": 0.2, "files": ["stock/engine.py"],
             "option": "tree_verify", "backend": "anthropic"}]
    bad = [dict(good[0], target_factor="vibes")]
    events = []
    client = ScriptedClient([reply("end_turn", text(json.dumps(bad))),
                             reply("end_turn", text("Here:\n" + json.dumps(good)))])
    dirs, how = anthropic_plan(client, "m", ANALYSIS, [], [], 3, events.append)
    assert how == "anthropic" and dirs == [Direction.model_validate(good[0])]
    assert "invalid" in client.requests[1]["messages"][-1]["content"]
    client = ScriptedClient([reply("end_turn", text("no")), reply("end_turn", text("[{}]"))])
    dirs, how = anthropic_plan(client, "m", ANALYSIS, [], [], 3, events.append)
    assert dirs is None and "offline plan used" in how


def test_integrate_never_reopens_a_finished_run_silently(project, monkeypatch):
    """`specpilot integrate` on a run past integration is a one-line error that leaves the
    record as it was; with --again it re-opens it: phase integrate, the old validation and
    finish cleared, a note saying so."""
    c = runner.start(project)
    c.state.phase, c.state.finished = "done", "2026-12-02 03:00:00"
    c.state.validation = {"passed": True}
    c.save()
    before = c.runs.state_path.read_bytes()
    res = CliRunner().invoke(cli, ["integrate"])
    assert res.exit_code == 2 and "--again" in res.output and "validation passed" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert c.runs.state_path.read_bytes() == before
    seen = {}

    def drive(factory, until, as_json):   # the cycle itself is test_cycle_integrate's
        seen["state"], seen["until"] = factory(lambda who, msg: None).state, until

    monkeypatch.setattr("specpilot.commands.cycle_cmds._drive", drive)
    res = CliRunner().invoke(cli, ["integrate", "--again"])
    assert res.exit_code == 0, res.output
    st = RunStore(project, c.state.run_id).load()
    assert st == seen["state"] and seen["until"] == "validate"
    assert st.phase == "integrate" and st.validation is None and st.finished is None
    assert "--again" in st.notes[-1]
