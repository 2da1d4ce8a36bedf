"""What the phases and a direction's steps get from the runner: a typed context in place of
the runner object itself. The runner (cycle/runner.py) builds one for every phase from its
current settings; the phases import this module and the shared types, never runner.py.

Values are the cycle's settings and records; callables are the runner's services that need
its private state (the run log, the references cache, the record's lock)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specpilot.agents.context import AgentContext
from specpilot.config import Config, GatesSection
from specpilot.cycle.settings import ExploreSection
from specpilot.cycle.state import DirectionState, RunState, RunStore
from specpilot.cycle.types import System
from specpilot.gitstore import GitStore


@dataclass
class CycleContext:
    root: Path                        # the project
    cfg: Config                       # specpilot.toml, the controller as the cycle sets it
    ex: ExploreSection                # [explore]
    gates_cfg: GatesSection           # the gates as the cycle runs them (dev length ...)
    state: RunState                   # the run record (phases change it in place)
    runs: RunStore                    # the run's folder: transcripts, logs
    store: GitStore                   # the project's repository
    lock: threading.RLock             # held while a thread changes the record's shared parts
    devices: list[dict]               # one environment per concurrent sub-agent (slots)
    client: object | None             # an Anthropic client (or a scripted one), or None
    spent: dict                       # the cycle's API spend, shared by its agents
    sleep: Callable[[float], None]    # backoff sleeps (tests shorten them)
    save: Callable[[], None]          # write the run record (atomically)
    progress: Callable[[str, str], None]          # (who, message): the cycle log and display
    stock_commit: Callable[[], str]               # stock: HEAD when the cycle started
    validate_length: Callable[[], int]            # sealed token-forcing length
    references: Callable[..., list]               # (check, device=None): stock's, cached
    analysis_of: Callable[[System], dict | None]  # the cost model's report of a system
    agent_context: Callable[[DirectionState, dict], AgentContext]   # (ds, slot env)
    record_entry: Callable[[DirectionState], str]                   # adopted -> entry id
