"""What a sub-agent backend gets: the project, the cycle's base system, its worktree."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specpilot.config import Config
from specpilot.cycle.settings import ExploreSection
from specpilot.cycle.types import AGENT_IDENTITY, CANDIDATES_PREFIX, Candidate, Direction, System
from specpilot.gitstore import GitStore



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
    """The worktree's system-path files (only those, committed by the agent or not) as one
    commit on the base; None if they are the base's. Captured from the project's own
    repository (GitStore.capture_tree): git never runs with the worktree's `.git`, its
    configuration or hooks, which the agent could have rewritten. The commit is kept
    reachable under refs/specpilot/candidates/<worktree>."""
    store = GitStore(ctx.root)
    base = ctx.base.commit
    tree = store.capture_tree(ctx.worktree, ctx.cfg.system_paths, base)
    if tree == store.tree_of(base):
        return None
    commit = store.commit_tree(tree, [base], message, None, AGENT_IDENTITY)
    ref = CANDIDATES_PREFIX + Path(ctx.worktree).name
    store.update_ref(ref, commit, store.resolve(ref), f"specpilot candidate {ref}")
    return commit


def base_candidate(ctx: AgentContext, options: dict, summary: str) -> Candidate:
    return Candidate(commit=ctx.base.commit, options={**ctx.base.options, **options},
                     summary=summary, code_changed=False)
