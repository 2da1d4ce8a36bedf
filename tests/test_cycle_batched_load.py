"""A cycle on a batched load ([explore] batch C): the pre-screen and the controller's verdicts
in throughput mode, and the planner offering the batched engine's entries. Real workers on
the tiny random model (CPU); the candidate is stock with its test-only option repeat_work,
a genuinely slower system."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from cycle_fixtures import head, project, shared_cache  # noqa: F401

from specpilot.config import load_config
from specpilot.cycle import judges, planning
from specpilot.cycle.types import System
from specpilot.explore_config import ExploreSection

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="the judges confine workers with bubblewrap")


def _batched(root, c: int) -> None:
    path = root / ".specpilot" / "config.toml"
    path.write_text(path.read_text().replace("[explore]\n", f"[explore]\nbatch = {c}\n", 1))


def test_the_batch_is_a_checked_setting():
    assert ExploreSection().batch == 0   # request by request, as before
    with pytest.raises(ValueError):
        ExploreSection(batch=-1)


@needs_bwrap
def test_prescreen_and_verdict_on_a_batched_load_serve_each_round_together(project):
    _batched(project, 2)
    cfg = load_config(project)
    assert cfg.explore.batch == 2
    base = System(commit=head(project), options={})
    slow = System(commit=head(project), options={"repeat_work": "3"})
    pre = judges.prescreen(project, cfg, base, slow, 3, 4, project / "pre", "cpu")
    # one measured round of 2C = 4 requests served as one batch: one cell a side (request by
    # request it would be 3 cells, one a request)
    assert [len(row) for row in pre["times_a"]] == [1] and pre["pairs"] == 1
    assert pre["gain"] < 0 and not pre["faults"]
    verdict = judges.compare(project, cfg, base, slow, 2, 3, 4, devices=["cpu"])
    rounds: dict[str, int] = {}
    for rid in verdict["requests"]:   # "rand-<round>-<i>"
        rounds[rid.rsplit("-", 1)[0]] = rounds.get(rid.rsplit("-", 1)[0], 0) + 1
    assert verdict["batch"] == 2 and set(rounds.values()) == {4}   # 2C a round, not the 3 asked
    assert verdict["rounds"] >= cfg.controller.min_pairs          # one pair a round
    assert not verdict["adopted"] and verdict["gain"] < 0 and not verdict["faults"]


def test_the_plan_offers_the_batched_engines_entries_only_on_a_batched_load(monkeypatch,
                                                                           tmp_path):
    asked = []
    monkeypatch.setattr(planning, "memory_metas", lambda root: [])
    monkeypatch.setattr(planning, "offline_plan",
                        lambda *a, **k: asked.append(k.get("load")) or [])
    loads = []
    for batch in (0, 16):
        ctx = SimpleNamespace(ex=ExploreSection(planner="offline", batch=batch),
                              state=SimpleNamespace(analysis={}, backend=None, planner=None),
                              root=tmp_path, client=None,
                              cfg=SimpleNamespace(controller=SimpleNamespace(drafter="block")))
        planning.plan(ctx)
        loads.append(ctx.state.load)   # the run record's and the footer's "load:"
    assert asked == ["single", "batched"]
    assert loads == ["single requests", "batched, C = 16"]
