"""The `command` backend: an external agent command in the worktree (no model runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cycle_fixtures import head, project, shared_cache  # noqa: F401

from specpilot import worktrees
from specpilot.agents import command
from specpilot.agents.context import AgentContext
from specpilot.config import load_config
from specpilot.cycle.settings import explore_settings
from specpilot.cycle.state import Direction, System
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore

AGENT = ("cat > task.txt; env > env.txt; "
         "printf 'register(\"{option}\", bool, False, \"x\")\\n' >> stock/options.py")


def ctx_for(project, script: str, timeout: float = 20.0) -> AgentContext:
    cfg = load_config(project)
    ex = explore_settings(cfg).model_copy(update={"agent_command": ["/bin/bash", "-c", script],
                                                  "agent_timeout_s": timeout})
    d = Direction(id="ext", title="External", hypothesis="h", target_factor="tau",
                  evidence_plan="e", predicted_gain=0.1, option="ext_opt", backend="command")
    wt = Path(worktrees.new(GitStore(project), "ext", "HEAD").path)
    return AgentContext(project, cfg, ex, System(commit=head(project)), d, wt,
                        project / "t.jsonl", project / "logs", {"CUDA_VISIBLE_DEVICES": "0"})


def test_command_agent_changes_become_the_candidate(project, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-cmd-secret")
    (project / "logs").mkdir()
    ctx = ctx_for(project, AGENT)
    cand = command.produce(ctx)
    assert cand.code_changed and cand.options == {"ext_opt": "true"}
    assert GitStore(project).diff_names(head(project), cand.commit, ["."]) == \
        ["stock/options.py"]                      # task.txt and env.txt are not system paths
    assert "Direction: External" in (ctx.worktree / "task.txt").read_text()
    env = (ctx.worktree / "env.txt").read_text()
    assert "sk-ant-cmd-secret" not in env and "CUDA_VISIBLE_DEVICES=0" in env


def test_command_agent_over_its_time_limit_is_an_error(project):
    (project / "logs").mkdir()
    with pytest.raises(SpecPilotError, match="killed after 1 s"):
        command.produce(ctx_for(project, "sleep 30", timeout=1))
