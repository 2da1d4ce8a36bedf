"""What a sub-agent backend gets: the project, the cycle's base system, its worktree."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specpilot.config import Config
from specpilot.cycle.settings import ExploreSection
from specpilot.cycle.state import Candidate, Direction, System
from specpilot.gitstore import GitStore

AGENT_IDENTITY = {"GIT_AUTHOR_NAME": "specpilot-agent", "GIT_AUTHOR_EMAIL": "agent@specpilot",
                  "GIT_COMMITTER_NAME": "specpilot-agent",
                  "GIT_COMMITTER_EMAIL": "agent@specpilot"}


@dataclass
class AgentContext:
    root: Path
    cfg: Config
    ex: ExploreSection
    base: System
    direction: Direction
    worktree: Path | None
    transcript: Path
    log_dir: Path
    device_env: dict = field(default_factory=dict)   # CUDA_VISIBLE_DEVICES for this agent
    progress: Callable[[str], None] = lambda s: None
    client: object | None = None                      # an Anthropic client (or scripted one)
    spent: dict = field(default_factory=dict)         # the cycle's API spend, shared
    sleep: Callable[[float], None] = time.sleep       # backoff sleeps (tests shorten them)


def commit_worktree(ctx: AgentContext, message: str) -> str | None:
    """Commit the worktree's system-path changes (only those); None if nothing changed."""
    wt = GitStore(ctx.worktree)
    paths = ctx.cfg.system_paths
    wt.run("add", "-A", "--", *[p for p in paths if (ctx.worktree / p).exists()])
    if not wt.call("diff", "--cached", "--quiet").rc:
        return None
    wt.run("commit", "-q", "--no-verify", "-m", message, env=AGENT_IDENTITY)
    return wt.run("rev-parse", "HEAD").strip()


def base_candidate(ctx: AgentContext, options: dict, summary: str) -> Candidate:
    return Candidate(commit=ctx.base.commit, options={**ctx.base.options, **options},
                     summary=summary, code_changed=False)
