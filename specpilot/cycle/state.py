"""Run records: `.specpilot/runs/<run-id>/state.json`, one pydantic state machine a cycle.

The state is written atomically after every transition, so a cycle killed at any moment
(crash, Ctrl-C, SIGKILL) resumes from its last saved transition: finished directions keep
their verdicts and are never redone; a direction caught mid-flight restarts from its last
finished step (its candidate commit, once made, is kept).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from specpilot.cycle.types import SCHEMA_VERSION, Candidate, Direction, System  # noqa: F401
from specpilot.errors import SpecPilotError

RUNS_DIR = Path(".specpilot") / "runs"

Phase = Literal["analyze", "plan", "explore", "integrate", "tune-kernels", "validate", "done"]
PHASES: tuple[str, ...] = ("analyze", "plan", "explore", "integrate", "tune-kernels",
                           "validate", "done")
# implausible: adopted by the controller with a gain above the cost model's ceiling (a
# measurement fault), so rejected
Status = Literal["pending", "running", "prescreen-rejected", "gate-failed", "rejected",
                 "implausible", "adopted", "error", "skipped"]
FINAL: tuple[str, ...] = ("prescreen-rejected", "gate-failed", "rejected", "implausible",
                          "adopted", "error", "skipped")


class StepTime(BaseModel):
    """When one step of a direction ran (wall clock, seconds since the epoch)."""
    step: str
    start: float
    end: float


class DirectionState(BaseModel):
    direction: Direction
    status: Status = "pending"
    step: Literal["start", "candidate", "prescreen", "gates", "controller", "recorded"] = "start"
    reasons: list[str] = Field(default_factory=list)
    worktree: str | None = None
    candidate: Candidate | None = None
    prescreen: dict | None = None     # {"gain": .., "values": {...}, ...}
    gates: list[dict] = Field(default_factory=list)   # GateReport dumps
    verdict: dict | None = None       # controller Comparison summary
    entry: str | None = None
    gain: float | None = None
    lower_bound: float | None = None
    started: float | None = None
    finished: float | None = None
    attempts: int = 0
    base: System | None = None        # the system it starts from if not the cycle's base
    deps: list[str] = Field(default_factory=list)   # entries that base is made of
    device: str | None = None         # where its judges ran: cuda:N (its slot) or cpu
    timeline: list[StepTime] = Field(default_factory=list)


class RunState(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    created: str
    phase: Phase = "analyze"
    base: System                      # where this cycle starts (previous best or stock)
    stock: str | None = None          # stock's commit (HEAD at the start): the source of
                                      # the references and what validation measures against
    best: System                      # the best system so far in this cycle
    planner: str = ""
    backend: str = ""
    sandbox: str = ""                 # "bubblewrap" or "none: <why>"
    load: str = ""                    # what it judges: "single requests", "batched, C = 16"
    analysis: dict | None = None      # Phase 0 report
    directions: list[DirectionState] = Field(default_factory=list)
    integration: dict | None = None
    kernel_tuning: dict | None = None
    validation: dict | None = None
    entries: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    resumed: int = 0
    finished: str | None = None
    wall_s: float = 0.0

    def direction(self, did: str) -> DirectionState:
        for d in self.directions:
            if d.direction.id == did:
                return d
        raise SpecPilotError(f"run {self.run_id}: no direction {did!r}")


def runs_dir(root: Path) -> Path:
    return root / RUNS_DIR


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid() % 10000:04d}"


class RunStore:
    """One run's folder: state.json, transcripts/<direction>.jsonl, logs/."""

    def __init__(self, root: Path, run_id: str):
        self.root = Path(root)
        self.folder = runs_dir(self.root) / run_id
        self.run_id = run_id

    @property
    def state_path(self) -> Path:
        return self.folder / "state.json"

    def transcript(self, name: str) -> Path:
        return self.folder / "transcripts" / f"{name}.jsonl"

    def log_dir(self, name: str) -> Path:
        path = self.folder / "logs" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save(self, state: RunState) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(f"state.json.tmp{os.getpid()}")
        tmp.write_text(state.model_dump_json(indent=1))
        os.replace(tmp, self.state_path)

    def load(self) -> RunState:
        if not self.state_path.is_file():
            raise SpecPilotError(f"no run {self.run_id!r} (see `specpilot runs list`)", code=2)
        try:
            state = RunState.model_validate_json(self.state_path.read_text())
        except ValueError as exc:
            raise SpecPilotError(f"{self.state_path}: unreadable run record: "
                                 f"{str(exc).splitlines()[0]}") from exc
        if state.schema_version != SCHEMA_VERSION:
            raise SpecPilotError(f"{self.state_path}: schema {state.schema_version}, "
                                 f"expected {SCHEMA_VERSION}")
        return state


def read_runs(root: Path) -> tuple[list[RunState], list[str]]:
    """Every run record, oldest first, and one line for each that cannot be read (the
    record's path and why: unreadable, not UTF-8, not JSON, not a run record)."""
    folder = runs_dir(root)
    out, bad = [], []
    if folder.is_dir():
        for path in sorted(folder.glob("run-*/state.json")):
            try:
                out.append(RunState.model_validate_json(path.read_bytes()))
            except OSError as exc:
                bad.append(f"{path}: cannot read: {exc.strerror or exc}")
            except ValidationError as exc:   # not JSON, not UTF-8, or not a run record
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"])
                bad.append(f"{path}: unreadable run record: {where + ': ' if where else ''}"
                           f"{err['msg']}")
    return out, bad


def list_runs(root: Path) -> list[RunState]:
    """The readable run records, oldest first (`read_runs` says which are not)."""
    return read_runs(root)[0]


def latest_run(root: Path) -> RunState | None:
    runs = list_runs(root)
    return runs[-1] if runs else None
