"""The cycle's shared types and constants, defined once: what the planner asks for
(Direction), what a sub-agent produces (Candidate), what runs (System), and the refs and
files a cycle writes. Imports nothing of the project (the cycle's and the agents' floor)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1                     # of a run record (state.json) and of its directions

BEST_REF = "refs/specpilot/best"       # the last validated system's commit (Phase 4 moves it)
BEST_FILE = ".specpilot/runs/best.json"   # ... and its options
CANDIDATES_PREFIX = "refs/specpilot/candidates/"   # candidates' commits, kept reachable
STACK_REF = CANDIDATES_PREFIX + "integrate-"       # Phase 2's stack so far (+ run id)
AGENT_IDENTITY = {"GIT_AUTHOR_NAME": "specpilot-agent", "GIT_AUTHOR_EMAIL": "agent@specpilot",
                  "GIT_COMMITTER_NAME": "specpilot-agent",
                  "GIT_COMMITTER_EMAIL": "agent@specpilot"}


def options_text(options: dict | None) -> str:
    """Options as a person reads them in a progress line: `a=1, b=2`, or `defaults`."""
    return ", ".join(f"{k}={v}" for k, v in (options or {}).items()) or "defaults"


class Direction(BaseModel):
    """What the planner asks a sub-agent to try (validated structured data)."""
    schema_version: int = SCHEMA_VERSION
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    title: str
    hypothesis: str
    target_factor: Literal["tau", "kernel", "overhead"]
    evidence_plan: str
    predicted_gain: float = Field(ge=0, le=10)
    files: list[str] = Field(default_factory=list)
    option: str                       # the option that guards (or is) the change
    backend: Literal["reuse", "tune", "anthropic", "command"]
    entry: str | None = None          # reuse: the memory entry to replay
    values: list[str] = Field(default_factory=list)  # tune: candidate values
    counted: bool = True              # reused entries are not counted as discoveries


class Candidate(BaseModel):
    """What a sub-agent produced: a commit of the system and the options that switch it on."""
    commit: str
    options: dict[str, str] = Field(default_factory=dict)
    summary: str = ""
    predicted_gain: float | None = None
    code_changed: bool = True         # False: the current best's code with tuned options


class System(BaseModel):
    """A system: a commit and the option values it runs with."""
    commit: str
    options: dict[str, str] = Field(default_factory=dict)
