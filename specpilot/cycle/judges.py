"""The one adapter between the cycle and the judges (gates, controller, stats, cost model).

Every call the cycle makes into specpilot/judges/forcing.py, controller.py, worker_proc.py,
stats.py and analyze.py goes through here, so a change of their API touches this file only.
The judges always run the project's own code (this process's `specpilot`); systems are served
from clean checkouts of their commits, never from an agent's worktree.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import specpilot
from specpilot.judges import controller, prompts, stats
from specpilot.config import Config, GatesSection
from specpilot.errors import SpecPilotError
from specpilot.judges.forcing import ReferenceCache, compute_reference, references, stock_tree_of
from specpilot.gitstore import GitStore
from specpilot.judges.worker_proc import SCRUB_ENV, clean_checkout

from specpilot.cycle.state import System

PACKAGE_ROOT = Path(specpilot.__file__).resolve().parents[1]
GATE_WORKER = Path(__file__).with_name("gate_worker.py")
SYSTEM_WORKER = Path(__file__).with_name("system_worker.py")


def _system_job(root: Path, cfg: Config, system: System, task: str, job: dict, log: Path,
                env_extra: dict | None = None, timeout_s: float = 3600) -> dict:
    """Run `cycle/system_worker.py` on `system`'s clean checkout at its options."""
    co = clean_checkout(GitStore(root), system.commit, cfg.system_paths, root)
    job = {"task": task, "checkout": str(co.path), "cache_root": str(root),
           "model": cfg.model.path, "options": dict(system.options),
           "drafter": cfg.controller.drafter,
           "max_context": max(2048, 1024 + job.get("max_new", 0) + 64), **job}
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
        env.update(env_extra or {})
        env.update(PYTHONPATH=f"{co.path}{os.pathsep}{PACKAGE_ROOT}", PYTHONNOUSERSITE="1")
        with open(log, "wb") as fh:
            proc = subprocess.run([sys.executable, "-P", "-B", "-s", str(SYSTEM_WORKER),
                                   str(job_path), str(out_path)], cwd=co.path, env=env,
                                  stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.is_file():
            tail = log.read_text(errors="replace")[-600:].strip()
            raise SpecPilotError(f"{task} worker on {system.commit[:12]} exited "
                                 f"{proc.returncode}: {tail}")
        return json.loads(out_path.read_text())


def analyze(root: Path, cfg: Config, system: System, requests: int, max_new: int,
            log_dir: Path) -> dict:
    """Phase 0: the judges' cost model (`specpilot analyze`, specpilot/judges/analyze.py) run on
    `system`'s clean checkout at its options; the report as a dict."""
    reqs = prompts.pick_requests(cfg.model.path, requests, "dev")
    rep = _system_job(root, cfg, system, "analyze", {"requests": reqs, "max_new": max_new},
                      log_dir / "analyze.log")
    rep["source"] = "specpilot.judges.analyze (cost model) on a clean checkout of the base"
    rep["system"] = system.model_dump()
    return rep


def tune_options(root: Path, cfg: Config, system: System, configs: list[dict], max_new: int,
                 log_dir: Path, env_extra: dict | None = None, requests: int = 4) -> dict:
    """Successive halving (agents/tune.halving) of option `configs` over `system`, timed by
    short generations in one worker on the system's clean checkout."""
    reqs = prompts.pick_requests(cfg.model.path, requests, "dev")
    return _system_job(root, cfg, system, "tune", {"requests": reqs, "max_new": max_new,
                                                   "configs": configs},
                       log_dir / "tune.log", env_extra)


def _random_requests(count: int, seed: int) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    return [(f"{'rand' if seed == 0 else 'sealed-rand'}-{i}",
             [rng.randrange(1, 256) for _ in range(16)]) for i in range(count)]


def stock_references(root: Path, cfg: Config, gates: GatesSection, check: str, count: int,
                     length: int) -> list:
    """Stock's references (the project's own stock at defaults), cached by the judges."""
    import torch
    from stock.options import Options

    model = cfg.model.path
    tree = stock_tree_of(system_paths=cfg.system_paths)
    cache = ReferenceCache(root)
    if model.startswith("random:"):
        from stock.config import PRESETS
        from stock.engine import Engine
        from stock.model import Transformer

        engine = None
        out = []
        for rid, ids in _random_requests(count, 0 if check == "dev" else 1):
            ref = cache.get(model, tree, rid, length)
            if ref is None:
                if engine is None:
                    engine = Engine(Transformer.random(PRESETS[model[7:]]), Options(),
                                    len(ids) + length + 64, set())
                ref = compute_reference(engine, ids, rid, length, model, tree, gates)
                cache.put(ref)
            out.append(ref)
        return out
    from specpilot.judges.gates import check_requests
    from stock.system import load_system

    reqs = check_requests(check, count)
    longest = max(len(r.prompt) for r in reqs)
    system = load_system(model, Options(), "cpu" if not torch.cuda.is_available() else None,
                         longest + length + 64)
    return references(system, reqs, length, cache, model, tree, gates)


def run_gates(root: Path, cfg: Config, gates: GatesSection, commit: str, options: dict,
              refs: list, check: str, default_gate: bool, log_dir: Path,
              timeout_s: float = 3600, env_extra: dict | None = None) -> list[dict]:
    """The option-default and/or token-forcing gate on `commit`'s clean checkout."""
    co = clean_checkout(GitStore(root), commit, cfg.system_paths, root)
    ctx = max(len(r.prompt_ids) + r.length for r in refs) + 64
    job = {"checkout": str(co.path), "references": [r.model_dump(mode="json") for r in refs],
           "gates": gates.model_dump(), "model": cfg.model.path, "max_context": ctx,
           "options": options, "drafter": cfg.controller.drafter, "check": check,
           "default_gate": default_gate, "forcing_gate": bool(options) or not default_gate}
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
        env.update(env_extra or {})   # a cycle's slot: the one device this direction owns
        env.update(PYTHONPATH=f"{co.path}{os.pathsep}{PACKAGE_ROOT}", PYTHONNOUSERSITE="1")
        with open(log_dir / f"gates-{check}.log", "wb") as log:
            proc = subprocess.run([sys.executable, "-P", "-B", "-s", str(GATE_WORKER),
                                   str(job_path), str(out_path)], cwd=co.path, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.is_file():
            tail = (log_dir / f"gates-{check}.log").read_text(errors="replace")[-600:]
            return [{"gate": "gates", "check": check, "passed": False,
                     "reasons": [f"gate worker exited {proc.returncode}: {tail.strip()}"]}]
        return json.loads(out_path.read_text())


def prescreen(root: Path, cfg: Config, base: System, cand: System, requests: int,
              max_new: int, log_dir: Path, device: str | None = None) -> dict:
    """Cheapest timing evidence: one paired round (A then B per request) on fresh prompts,
    one worker process per side, no σ and no decision (a raw gain), after one warm-up round
    (uncounted): a first request pays CUDA-graph capture and kernel autotuning, which on the
    H200 made a W12 candidate look 91% slower in its pre-screen. The timed outputs are
    checked against stock's, as in the controller."""
    store = GitStore(root)
    co_a = clean_checkout(store, base.commit, cfg.system_paths, root)
    co_b = clean_checkout(store, cand.commit, cfg.system_paths, root)
    co_stock = clean_checkout(store, "HEAD", cfg.system_paths, root)
    device = device or ("cuda:0" if _cuda() else "cpu")
    job = controller.Job(prompts.draw(cfg.model.path, "fresh", 2, requests), max_new,
                         cfg.controller.drafter, [device], 1, 1, cfg.model.path, processes=1)
    job, expected = controller.stock_outputs(co_stock, job, cfg, log_dir, device)
    paired, _, _, checks = controller.paired_run(co_a, base.options, co_b, cand.options, job,
                                                 cfg, log_dir, expected=expected)
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
    among them, so a cycle of many directions does not adopt more false gains)."""
    # the controller refuses fewer than min_pairs pairs per process: buy them with rounds
    rounds = max(rounds, -(-cfg.controller.min_pairs // max(1, requests)))
    rep = controller.compare(root, base.commit, cand.commit, base.options, cand.options,
                             devices, rounds, None, requests, max_new, None, source, progress,
                             family=family)
    return {"adopted": rep.decision.adopted, "verdict": rep.decision.verdict,
            "gain": rep.estimate.gain, "lower_bound": rep.estimate.lower_bound,
            "threshold": rep.decision.threshold, "sigma": rep.sigma,
            "sigma_source": rep.sigma_source, "diverged": rep.paired.diverged,
            "pairs": rep.estimate.pairs, "processes": rep.processes, "family": rep.family,
            "level": rep.estimate.level, "rounds": rep.rounds, "requests": rep.requests,
            "max_new": rep.max_new,
            "a": rep.a.commit, "b": rep.b.commit, "hardware": rep.paired.hardware,
            "faults": rep.faults}


def gates_passed(reports: list[dict]) -> tuple[bool, list[str]]:
    reasons = [f"{r.get('gate')}/{r.get('check')}: {why}" for r in reports
               for why in r.get("reasons", [])]
    return all(r.get("passed") for r in reports) and bool(reports), reasons


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def require(cond: bool, message: str) -> None:
    if not cond:
        raise SpecPilotError(message)
