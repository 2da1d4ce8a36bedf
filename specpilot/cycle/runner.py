"""One optimization cycle: Phase 0 analyze -> plan -> Phase 1 explore (parallel sub-agents)
-> Phase 2 integrate -> Phase 3 kernel tuning -> Phase 4 validate. Resumable at any point.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from specpilot import worktrees
from specpilot.agents import sandbox
from specpilot.agents.context import AgentContext
from specpilot.config import load_config
from specpilot.cycle import judges
from specpilot.cycle.context import CycleContext
from specpilot.cycle.devices import device_slots
from specpilot.cycle.entries import record_adopted
from specpilot.cycle.integrate import integrate
from specpilot.cycle.kernel_tuning import tune_kernels
from specpilot.cycle.pipeline import run_direction, worktree_name
from specpilot.cycle.planning import coding_backend, plan
from specpilot.cycle.settings import (controller_for_cycle, explore_settings, gates_for_cycle,
                                      validate_length)
from specpilot.cycle.state import (FINAL, PHASES, DirectionState, RunState, RunStore,
                                   list_runs, new_run_id)
from specpilot.cycle.types import BEST_REF, System
from specpilot.cycle.validate import best_options, validate
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore

class Cycle:
    def __init__(self, root: Path, state: RunState,
                 progress: Callable[[str, str], None] = lambda who, msg: None,
                 client=None):
        self.root = Path(root)
        self.cfg = load_config(self.root)
        self.ex = explore_settings(self.cfg)
        self.cfg = self.cfg.model_copy(update={"controller": controller_for_cycle(self.cfg,
                                                                                   self.ex)})
        self.gates_cfg = gates_for_cycle(self.cfg, self.ex)
        self.validate_length()   # a sealed length below 2 x dev is a config error, now
        state.sandbox = agent_sandbox(self.ex, client)   # refused here, before any work
        self.state = state
        self.runs = RunStore(self.root, state.run_id)
        self.store = GitStore(self.root)
        self._lock = threading.RLock()
        self._progress = progress
        self._refs: dict[str, list] = {}
        self.client = client
        self.spent: dict = {}         # the cycle's API spend, shared by its agents
        self.sleep = time.sleep       # backoff sleeps (tests shorten them)
        self._t0 = time.time()
        self._wall0 = state.wall_s

    # -- bookkeeping ------------------------------------------------------------------

    def save(self) -> None:
        with self._lock:
            self.state.wall_s = round(self._wall0 + time.time() - self._t0, 1)
            self.runs.save(self.state)

    def progress(self, who: str, msg: str) -> None:
        with self._lock:
            log = self.runs.folder / "cycle.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a") as fh:
                fh.write(f"{time.strftime('%H:%M:%S')} [{who}] {msg}\n")
        self._progress(who, msg)

    def stock_commit(self) -> str:
        """Stock: HEAD when the cycle started (a record older than that field: HEAD now)."""
        return self.state.stock or self.store.must_resolve("HEAD")

    def references(self, check: str, device: str | None = None) -> list:
        """Stock's references for the dev or the sealed check, computed once a cycle (on the
        first asker's device) and cached by the judges."""
        with self._lock:
            if check not in self._refs:
                n = self.ex.gate_requests if check == "dev" else self.ex.validate_requests
                length = self.gates_cfg.dev_length if check == "dev" else self.validate_length()
                self._refs[check] = judges.stock_references(
                    self.root, self.cfg, self.gates_cfg, self.stock_commit(), check, n, length,
                    device or judges.default_device(),
                    (self.runs.log_dir("references") if check == "dev" else
                     judges.sealed_logs(self.state.run_id, "references")) / f"stock-{check}.log")
            return self._refs[check]

    def validate_length(self) -> int:
        return validate_length(self.cfg, self.ex)

    def analysis_of(self, system: System) -> dict | None:
        """The cost model's report of `system` made by this cycle (Phase 0 for the base,
        Phase 3 for the integrated system), if any."""
        if system == self.state.base:
            return self.state.analysis
        rep = (self.state.kernel_tuning or {}).get("analysis")
        return rep if rep and rep.get("system") == system.model_dump() else None

    def agent_context(self, ds: DirectionState, device_env: dict) -> AgentContext:
        wt = None
        if ds.direction.backend != "tune":
            name = worktree_name(self.state.run_id, ds.direction.id)
            existing = [w for w in worktrees.list_all(self.store) if w.name == name]
            if existing:   # resumed: start the backend over in a clean worktree
                worktrees.remove(self.store, name, force=True)
                branch = worktrees.BRANCH_PREFIX + name
                self.store.call("branch", "-D", branch)
            wt = Path(worktrees.new(self.store, name, (ds.base or self.state.base).commit).path)
            ds.worktree = str(wt)
        return AgentContext(self.root, self.cfg, self.ex, ds.base or self.state.base,
                            ds.direction, wt,
                            self.runs.transcript(ds.direction.id),
                            self.runs.log_dir(ds.direction.id), device_env,
                            lambda m: self.progress(ds.direction.id, m), self.client,
                            self.spent, self.sleep)

    def record_entry(self, ds: DirectionState) -> str:
        with self._lock:
            entry = record_adopted(self, ds)
            self.state.entries.append(entry)
            return entry

    def context(self) -> CycleContext:
        """What a phase gets: the cycle's settings as they are now, its record, and the
        runner's services."""
        return CycleContext(
            root=self.root, cfg=self.cfg, ex=self.ex, gates_cfg=self.gates_cfg,
            state=self.state, runs=self.runs, store=self.store, lock=self._lock,
            devices=device_slots(self.ex), client=self.client, spent=self.spent,
            sleep=self.sleep, save=self.save, progress=self.progress,
            stock_commit=self.stock_commit, validate_length=self.validate_length,
            references=self.references, analysis_of=self.analysis_of,
            agent_context=self.agent_context, record_entry=self.record_entry)

    # -- phases -----------------------------------------------------------------------

    def run(self, until: str = "done") -> RunState:
        stop = PHASES.index(until)
        while PHASES.index(self.state.phase) < stop:
            phase = self.state.phase
            self.progress("cycle", f"phase {phase}")
            getattr(self, "phase_" + phase.replace("-", "_"))()
            self.state.phase = PHASES[PHASES.index(phase) + 1]
            self.save()
        if self.state.phase == "done" and not self.state.finished:
            self.state.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.save()
        return self.state

    def phase_analyze(self) -> None:
        self.state.analysis = judges.analyze(self.root, self.cfg, self.state.base,
                                             self.ex.analyze_requests, self.ex.analyze_max_new,
                                             self.runs.log_dir("analyze"))
        f = self.state.analysis["factors"]
        self.progress("analyze", "factors " + ", ".join(
            f"{k} {v:.2f}" if v is not None else f"{k} n/a" for k, v in f.items()))

    def phase_plan(self) -> None:
        self.state.directions = [DirectionState(direction=d) for d in plan(self.context())]
        self.progress("plan", f"{len(self.state.directions)} directions: "
                      + ", ".join(d.direction.id for d in self.state.directions))

    def phase_explore(self) -> None:
        todo = [d for d in self.state.directions if d.status not in FINAL]
        ctx = self.context()
        slots = ctx.devices
        free = list(slots)
        lock = threading.Lock()
        # Crash tests: hold (never return) once this many directions have finished, so a
        # test can kill the cycle at a known point instead of racing it.
        hold_after = int(os.environ.get("SPECPILOT_HOLD_AFTER_DIRECTIONS", "0") or 0)
        finished = [0]

        def work(ds):
            with lock:
                env = free.pop(0)
            try:
                run_direction(ctx, ds, env)
            finally:
                with lock:
                    finished[0] += 1
                    free.append(env)
            if hold_after and finished[0] >= hold_after:
                threading.Event().wait()
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            list(pool.map(work, todo))

    def phase_integrate(self) -> None:
        integrate(self.context())

    def phase_tune_kernels(self) -> None:
        tune_kernels(self.context())

    def phase_validate(self) -> None:
        validate(self.context())


def agent_sandbox(ex, client) -> str:
    """The run record's line on how agent commands are confined. An LLM-agent backend
    (anthropic, command) without a working bubblewrap is refused (a one-line error) unless
    the user opted out ([explore] agent_sandbox = false); the offline backends run no agent
    command and need none."""
    if coding_backend(ex, client) is not None:
        sandbox.policy(ex.agent_sandbox)
    return sandbox.describe(ex.agent_sandbox)


def start(root: Path, progress=lambda who, msg: None, client=None) -> Cycle:
    """A new cycle from the previous validated best (refs/specpilot/best), else stock HEAD."""
    store = GitStore(root)
    head = store.must_resolve("HEAD")
    paths = load_config(root).system_paths
    dirty = store.run("status", "--porcelain", "--", *paths).strip()
    if dirty:   # stock (HEAD) is the references' source: what runs must be what is committed
        raise SpecPilotError(f"uncommitted changes in the system paths ({', '.join(paths)}); "
                             f"commit or stash them before a cycle:\n{dirty}", code=2)
    base = System(commit=head)
    best = store.resolve(BEST_REF)
    if best:
        base = System(commit=best, options=best_options(root))
    state = RunState(run_id=new_run_id(), created=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                 time.gmtime()),
                     base=base, best=base, stock=head)
    cycle = Cycle(root, state, progress, client)
    cycle.save()
    return cycle


def resume(root: Path, run_id: str, progress=lambda who, msg: None, client=None) -> Cycle:
    state = RunStore(root, run_id).load()
    state.resumed += 1
    for ds in state.directions:   # an interrupted direction restarts its unfinished step
        if ds.status == "running":
            ds.status = "pending"
    cycle = Cycle(root, state, progress, client)
    cycle.progress("cycle", f"resumed at phase {state.phase} (resume #{state.resumed})")
    cycle.save()
    return cycle


def find_run(root: Path, run_id: str | None) -> str:
    if run_id:
        return run_id
    runs = list_runs(root)
    if not runs:
        raise SpecPilotError("no runs yet; run `specpilot explore` first", code=2)
    return runs[-1].run_id


