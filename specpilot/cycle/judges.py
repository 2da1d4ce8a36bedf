"""The one adapter between the cycle and the judges (gates, controller, stats, cost model).

Every call the cycle makes into specpilot/judges/forcing.py, controller.py, worker_proc.py,
stats.py and analyze.py goes through here, so a change of their API touches this file only.
The judges always run the project's own code (this process's `specpilot`); every system is
served from a clean checkout of its commit (never from an agent's worktree) by the judges'
one worker program (`specpilot/judges/worker_main.py`, started by `worker_proc.Worker`),
which imports nothing of specpilot: gates, references, the controller, Phase 0's
measurements and the tuner's timings alike. What is computed from the workers' replies
(verdicts, factors, the tuner's search) is computed here, in the judges' process.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import numpy as np

from specpilot.judges import controller, costmodel, prompts, stats
from specpilot.judges import gates as judge_gates
from specpilot.config import Config, GatesSection
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges.worker_proc import Worker, WorkerError, clean_checkout

from specpilot.cycle.devices import default_device
from specpilot.cycle.search import halving
from specpilot.cycle.types import System
from specpilot.judges.analyze import report
from specpilot.judges.hardware import for_device


@contextlib.contextmanager
def _served(root: Path, cfg: Config, system: System, device: str | None, log: Path):
    """`system` served by the judges' worker (the gates' and the controller's program) from a
    clean checkout of its commit at its options."""
    co = clean_checkout(GitStore(root), system.commit, cfg.system_paths, root)
    worker = Worker("system", co, cfg.system_paths, cfg.model.path, dict(system.options),
                    device or default_device(), log, judge_gates.worker_drafter(cfg),
                    confine=cfg.judges.confine)
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()


def _prompts(worker: Worker, requests: list[tuple]) -> list[tuple[str, list[int]]]:
    """(id, token ids) of the controller's requests: a prompt is tokenized by the system's
    own tokenizer and keeps its last 1024 tokens."""
    return [(rid, ids if ids is not None else
             worker.call("tokenize", rid, prompt=prompt)["ids"][-1024:])
            for rid, prompt, ids in requests]


def _finite(x):
    """NaN and infinities as null: the report as the run record's JSON holds it (keys of
    the τ curve as text), so a report read back equals the one kept in memory."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def analyze(root: Path, cfg: Config, system: System, requests: int, max_new: int,
            log_dir: Path, device: str | None = None) -> dict:
    """Phase 0: the judges' cost model (`specpilot analyze`, specpilot/judges/analyze.py) of
    `system` at its options: measured by the judges' worker on its clean checkout, the
    factors computed here; the report as a dict."""
    t0 = time.perf_counter()
    reqs = prompts.pick_requests(cfg.model.path, requests, "dev")
    device = device or default_device()
    with _served(root, cfg, system, device, log_dir / "analyze.log") as worker:
        asked = _prompts(worker, reqs)
        measured = worker.call("measure", "measure", prompts=[ids for _, ids in asked],
                               max_new=max_new)
        registry = worker.call("registry", "registry")["registry"]
    rep = report(measured, cfg.model.path, for_device(device, root), [r for r, _ in asked])
    out = json.loads(json.dumps(_finite(rep.model_dump(mode="python")), default=str))
    out["registered_options"] = registry
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["source"] = "specpilot.judges.analyze (cost model) on a clean checkout of the base"
    out["system"] = system.model_dump()
    return out


def tune_options(root: Path, cfg: Config, system: System, configs: list[dict], max_new: int,
                 log_dir: Path, device: str | None = None, requests: int = 4) -> dict:
    """Successive halving (cycle/search.halving) of option `configs` over `system`, timed by
    short generations of the judges' worker on the system's clean checkout (one model load
    for the whole search); the search itself runs here."""
    t0 = time.perf_counter()
    reqs = prompts.pick_requests(cfg.model.path, requests, "dev")
    lines: list[str] = []
    with _served(root, cfg, system, device, log_dir / "tune.log") as worker:
        asked = _prompts(worker, reqs)
        calls = [0]

        def timed(options: dict, i: int) -> dict:
            calls[0] += 1
            return worker.call("timed", f"t{calls[0]}", options=options,
                               ids=asked[i % len(asked)][1], max_new=max_new)
        # warm-up, not counted: on CUDA every prompt once, so that no timed call pays the
        # first compile of a T bucket (stock's `compile` option: seconds a T) for the others
        if timed(system.options, 0)["uses_graphs"]:
            for i in range(1, len(asked)):
                timed(system.options, i)
        res = halving(configs, dict(system.options), lambda o, i: timed(o, i)["decode_s"],
                      lines.append)
    res["log"] = lines
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def stock_references(root: Path, cfg: Config, gates: GatesSection, stock_commit: str,
                     check: str, count: int, length: int, device: str,
                     log_path: Path) -> list:
    """Stock's references for a check: the judges' one reference computation (as for
    `specpilot gate`), by stock at its defaults in a worker on a clean checkout of the stock
    commit, cached by the judges."""
    reqs = judge_gates.gate_requests(cfg.model.path, check, count)
    return judge_gates.stock_references(root, cfg, gates, stock_commit, reqs, length, device,
                                        log_path, check)


def sealed_logs(run_id: str, name: str) -> Path:
    """A run's log folder for workers that see sealed requests: outside the repository,
    beside the secret seed (judges/gates.log_folder)."""
    return judge_gates.log_folder(Path("."), "sealed", f"{run_id}/{name}")


def run_gates(root: Path, cfg: Config, gates: GatesSection, commit: str, options: dict,
              refs: list, check: str, default_gate: bool, log_dir: Path,
              device: str | None = None) -> list[dict]:
    """The option-default and/or token-forcing gate on `commit`'s clean checkout: the one
    gate path of `specpilot gate` (judges/gates.judge). Each report carries the candidate's
    own definitions of the options it ran with (`option_specs`). A worker that dies (the
    candidate crashed, ran out of context, ...) fails the gate with the reason."""
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        run = judge_gates.judge(root, cfg, gates, commit, options, refs, check,
                                device or default_device(), log_dir,
                                default_gate=default_gate,
                                forcing=bool(options) or not default_gate)
    except WorkerError as exc:
        return [{"gate": "gates", "check": check, "passed": False,
                 "reasons": [f"gate worker: {exc}"]}]
    out = [r.model_dump(mode="json") for r in run.reports]
    for r in out:
        r["option_specs"] = run.option_specs
    return out


def prescreen(root: Path, cfg: Config, base: System, cand: System, requests: int,
              max_new: int, log_dir: Path, device: str | None = None,
              stock: str = "HEAD") -> dict:
    """Cheapest timing evidence: one paired round (A then B per request) on fresh prompts,
    one worker process per side, no σ and no decision (a raw gain), after one warm-up round
    (uncounted): a first request pays CUDA-graph capture and kernel autotuning, which on the
    H200 made a W12 candidate look 91% slower in its pre-screen. The timed outputs are
    checked against stock's, as in the controller. On a batched load ([explore] batch C)
    the round is 2C requests served together by each side's batched engine: one pair, the
    throughput ratio."""
    store = GitStore(root)
    co_a = clean_checkout(store, base.commit, cfg.system_paths, root)
    co_b = clean_checkout(store, cand.commit, cfg.system_paths, root)
    co_stock = clean_checkout(store, stock, cfg.system_paths, root)
    device = device or default_device()
    batch = cfg.explore.batch   # batched load: one round of 2C requests served together
    job = controller.Job(prompts.draw(cfg.model.path, "fresh", 2,
                                      2 * batch if batch else requests), max_new,
                         cfg.controller.drafter, [device], 1, 1, cfg.model.path, processes=1,
                         batch=batch)
    job, expected = controller.stock_outputs(co_stock, job, cfg, log_dir, device)
    paired, _, _, checks = controller.paired_run(co_a, base.options, co_b, cand.options, job,
                                                 cfg, log_dir, expected=expected,
                                                 co_stock=co_stock)
    ratios = stats.log_ratios(*paired.flat())
    gain = float(np.expm1(np.mean(ratios)))
    return {"gain": gain, "pairs": len(ratios), "diverged": paired.diverged,
            "faults": [f for c in checks.values() for f in c.faults],
            "times_a": paired.times["A0"], "times_b": paired.times["B0"]}


def compare(root: Path, cfg: Config, base: System, cand: System, rounds: int, requests: int,
            max_new: int, source: str = "dev", progress=lambda s: None,
            devices: list[str] | None = None, family: int = 1) -> dict:
    """The controller's paired A/B of cand against base; a summary plus the full report.
    `family`: how many candidates the cycle judges together (the bound's level is split
    among them, so a cycle of many directions does not adopt more false gains). On a
    batched load ([explore] batch C) the controller's throughput mode: 2C requests a round,
    one pair a round and process, so at least min_pairs rounds."""
    batch = cfg.explore.batch
    # the controller refuses fewer than min_pairs pairs per process: buy them with rounds
    per_pair = 1 if batch else max(1, requests)
    rounds = max(rounds, -(-cfg.controller.min_pairs // per_pair))
    rep = controller.compare(root, base.commit, cand.commit, base.options, cand.options,
                             devices, rounds, None, None if batch else requests, max_new, None,
                             source, progress, family=family, batch=batch)
    return {"adopted": rep.decision.adopted, "verdict": rep.decision.verdict,
            "gain": rep.estimate.gain, "lower_bound": rep.estimate.lower_bound,
            "threshold": rep.decision.threshold, "sigma": rep.sigma,
            "sigma_source": rep.sigma_source, "diverged": rep.paired.diverged,
            "pairs": rep.estimate.pairs, "processes": rep.processes, "family": rep.family,
            "batch": rep.batch,
            "level": rep.estimate.level, "rounds": rep.rounds, "requests": rep.requests,
            "max_new": rep.max_new,
            "a": rep.a.commit, "b": rep.b.commit, "hardware": rep.paired.hardware,
            "faults": rep.faults}


def implausible(verdict: dict, analysis: dict | None, margin: float) -> str | None:
    """Why an adopted verdict's gain is a measurement fault (above the cost model's ceiling
    for the base it was measured against, times `margin`), or None; None too when there is
    no report of that base or a factor of it is unknown."""
    if not analysis:
        return None
    return costmodel.implausible(verdict["gain"], analysis.get("factors") or {}, margin)


def gates_passed(reports: list[dict]) -> tuple[bool, list[str]]:
    reasons = [f"{r.get('gate')}/{r.get('check')}: {why}" for r in reports
               for why in r.get("reasons", [])]
    return all(r.get("passed") for r in reports) and bool(reports), reasons


def require(cond: bool, message: str) -> None:
    if not cond:
        raise SpecPilotError(message)
