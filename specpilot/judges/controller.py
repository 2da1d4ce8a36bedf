"""The controller: is B really faster than A? A paired benchmark on clean checkouts.

Each system is exported from git objects at its commit (never from a live worktree) and
served by its own worker process (specpilot/judges/worker_proc.py), which proves the options in
effect and the system tree hash it runs. Both systems serve identical requests:

- one device: rounds alternate A B B A (per request: A then B, then B then A next round);
- two devices: A and B run side by side, one per device, swapping devices every round
  (on CPU, `cpu:0,cpu:1` are one pinned core each, standing in for two GPUs).

Warm-up rounds run first and are never counted. Every request's time is measured by the
controller around the channel and kept. The gain, its one-sided lower bound and the
adoption decision come from specpilot/judges/stats.py; σ comes from an A/A run of A against itself
with the same procedure, cached per deployment under .specpilot/cache/noise/.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from specpilot.judges import stats
from specpilot.config import Config, load_config
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges.worker_proc import Checkout, Reply, Worker, clean_checkout

SCHEMA_VERSION = 1
NOISE_DIR = Path(".specpilot") / "cache" / "noise"
RUNS_DIR = Path(".specpilot") / "runs"


class Side(BaseModel):
    rev: str
    commit: str
    tree: str
    options: dict          # asked
    effective: dict = {}   # reported by the worker
    drafter: str | None = None   # the drafter class the worker reports serving (None: AR)


class Paired(BaseModel):
    """Raw paired times: [round][request] seconds, and outputs per request."""
    schema_version: int = SCHEMA_VERSION
    times_a: list[list[float]]
    times_b: list[list[float]]
    placement: list[str]   # per measured round: "A,B" order, or "A@dev,B@dev"
    diverged: bool         # B's tokens differ from A's on some request
    hardware: str
    round_wall_s: list[float] = []   # per measured round: wall time of the whole round

    def flat(self) -> tuple[list[float], list[float]]:
        return ([t for row in self.times_a for t in row], [t for row in self.times_b for t in row])


class NoiseRecord(BaseModel):
    schema_version: int = SCHEMA_VERSION
    key: dict
    sigma: float
    estimate: stats.GainEstimate
    created: str


class Comparison(BaseModel):
    schema_version: int = SCHEMA_VERSION
    a: Side
    b: Side
    model: str
    devices: list[str]
    mode: str              # "alternate" (one device) | "side-by-side"
    requests: list[str]
    max_new: int
    drafter: str
    rounds: int
    warmup_rounds: int
    paired: Paired
    drafter_b: str | None = None   # B's drafter when it differs from A's
    estimate: stats.GainEstimate
    sigma: float
    sigma_source: str
    decision: stats.Decision


@dataclass
class Job:
    """What to measure: requests (id, prompt or token ids), budget, drafter, devices."""
    requests: list[tuple[str, str | None, list[int] | None]]
    max_new: int
    drafter: str
    devices: list[str]
    rounds: int
    warmup_rounds: int
    model: str
    max_context: int | None = None
    drafter_b: str | None = None   # B's drafter when not A's (e.g. block against ngram)

    def drafter_of(self, label: str) -> str:
        return self.drafter_b if label == "B" and self.drafter_b else self.drafter


def pick_requests(model: str, count: int, source: str = "dev") -> list[tuple]:
    """Requests from the controller's own copy (never from a candidate's checkout)."""
    if model.startswith("random:"):
        rng = random.Random(0)
        return [(f"rand-{i}", None, [rng.randrange(1, 256) for _ in range(16)])
                for i in range(count)]
    from specpilot.requests import load_dev, load_jsonl, spread
    from specpilot.requests.sealed import ensure_sealed

    if source == "dev":
        reqs = load_dev()
    elif source == "sealed":
        reqs = load_jsonl(ensure_sealed())
    else:
        reqs = load_jsonl(source)
    chosen = spread(reqs, count)
    return [(r.id, r.prompt, None) for r in chosen]


def _spawn(label: str, co: Checkout, options: dict, device: str, job: Job, cfg: Config,
           log_dir: Path) -> Worker:
    w = Worker(label, co, cfg.system_paths, job.model, dict(options), device,
               log_dir / f"{label}-{device.replace(':', '')}.log",
               None if job.drafter_of(label) == "ar" else job.drafter_of(label),
               job.max_context)
    try:
        w.start()
    except BaseException:
        w.stop()
        raise
    return w


def paired_run(co_a: Checkout, opts_a: dict, co_b: Checkout, opts_b: dict, job: Job,
               cfg: Config, log_dir: Path,
               progress: Callable[[str], None] = lambda s: None) -> tuple[Paired, dict, dict]:
    """Run the paired design; returns the times and each side's worker `ready` report
    (options in effect, tree, drafter)."""
    workers: dict[tuple[str, str], Worker] = {}
    try:
        for dev in job.devices:
            workers["A", dev] = _spawn("A", co_a, opts_a, dev, job, cfg, log_dir)
            workers["B", dev] = _spawn("B", co_b, opts_b, dev, job, cfg, log_dir)
        hardware = workers["A", job.devices[0]].ready.get("hardware", "?")
        run = _alternate if len(job.devices) == 1 else _side_by_side
        times_a, times_b, placement, walls, tokens = [], [], [], [], {}
        for r in range(job.warmup_rounds + job.rounds):
            measured = r >= job.warmup_rounds
            m = r - job.warmup_rounds
            progress(f"round {m + 1}/{job.rounds}" if measured else "warm-up")
            if not measured:  # warm every worker: both placements when side by side
                for swap in range(len(job.devices)):
                    run(workers, job, swap, tokens)
                continue
            t0 = time.perf_counter()
            row_a, row_b, where = run(workers, job, m, tokens)
            walls.append(time.perf_counter() - t0)
            times_a.append(row_a)
            times_b.append(row_b)
            placement.append(where)
        diverged = any(tokens[rid]["A"] != tokens[rid]["B"] for rid in tokens)
        paired = Paired(times_a=times_a, times_b=times_b, placement=placement,
                        diverged=diverged, hardware=hardware, round_wall_s=walls)
        return paired, workers["A", job.devices[0]].ready, workers["B", job.devices[0]].ready
    finally:
        for w in workers.values():
            w.stop()


def _call(w: Worker, req, job: Job) -> Reply:
    rid, prompt, ids = req
    return w.run(rid, job.max_new, prompt=prompt, ids=ids)


def _note(tokens: dict, rid: str, side: str, reply: Reply) -> None:
    seen = tokens.setdefault(rid, {}).setdefault(side, reply.tokens)
    if seen != reply.tokens:
        raise SpecPilotError(f"system {side} is not deterministic on request {rid}")


def _alternate(workers, job: Job, m: int, tokens: dict):
    dev = job.devices[0]
    order = ("A", "B") if m % 2 == 0 else ("B", "A")
    row = {"A": [], "B": []}
    for req in job.requests:
        for side in order:
            reply = _call(workers[side, dev], req, job)
            row[side].append(reply.seconds)
            _note(tokens, req[0], side, reply)
    return row["A"], row["B"], ",".join(order)


def _side_by_side(workers, job: Job, m: int, tokens: dict):
    d0, d1 = job.devices[m % 2], job.devices[(m + 1) % 2]
    row_a, row_b = [], []
    with ThreadPoolExecutor(2) as pool:
        for req in job.requests:
            fa = pool.submit(_call, workers["A", d0], req, job)
            fb = pool.submit(_call, workers["B", d1], req, job)
            ra, rb = fa.result(), fb.result()
            row_a.append(ra.seconds)
            row_b.append(rb.seconds)
            _note(tokens, req[0], "A", ra)
            _note(tokens, req[0], "B", rb)
    return row_a, row_b, f"A@{d0},B@{d1}"


def noise_key(job: Job, hardware: str) -> dict:
    return {"model": job.model, "hardware": hardware, "requests": [r[0] for r in job.requests],
            "max_new": job.max_new, "drafter": job.drafter, "devices": len(job.devices),
            "rounds": job.rounds}


def _noise_path(root: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return root / NOISE_DIR / f"{digest}.json"


def load_noise(root: Path, key: dict) -> NoiseRecord | None:
    path = _noise_path(root, key)
    if not path.is_file():
        return None
    try:
        rec = NoiseRecord.model_validate_json(path.read_text())
    except ValueError:
        return None
    return rec if rec.schema_version == SCHEMA_VERSION and rec.key == key else None


def save_noise(root: Path, key: dict, est: stats.GainEstimate) -> NoiseRecord:
    rec = NoiseRecord(key=key, sigma=stats.sigma_from_aa(est), estimate=est,
                      created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path = _noise_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rec.model_dump_json(indent=1))
    return rec


def _default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def compare(root: Path, rev_a: str, rev_b: str, opts_a: dict | None = None,
            opts_b: dict | None = None, devices: list[str] | None = None,
            rounds: int | None = None, model: str | None = None, requests: int | None = None,
            max_new: int | None = None, sigma: float | None = None, source: str = "dev",
            progress: Callable[[str], None] = lambda s: None, *, drafter_a: str | None = None,
            drafter_b: str | None = None) -> Comparison:
    """Compare B against A; 'stock' names HEAD. σ: given, cached, or measured (A/A).
    Both sides use the configured drafter unless `drafter_a` / `drafter_b` name others
    (e.g. `ngram` against `block`; `ar` for none); σ is always A's own A/A."""
    cfg = load_config(root)
    cc = cfg.controller
    store = GitStore(root)
    opts_a, opts_b = dict(opts_a or {}), dict(opts_b or {})
    co_a = clean_checkout(store, "HEAD" if rev_a == "stock" else rev_a, cfg.system_paths, root)
    co_b = clean_checkout(store, "HEAD" if rev_b == "stock" else rev_b, cfg.system_paths, root)
    model = model or cfg.model.path
    job = Job(pick_requests(model, requests or cc.requests, source), max_new or cc.max_new,
              drafter_a or cc.drafter, devices or [_default_device()], rounds or cc.rounds,
              cc.warmup_rounds, model)
    if drafter_b and drafter_b != job.drafter:
        job.drafter_b = drafter_b
    if not job.requests:
        raise SpecPilotError("no requests to compare on")
    if len(job.devices) > 2 or len(set(job.devices)) != len(job.devices):
        raise SpecPilotError("--devices takes one device or two different ones")
    log_dir = root / RUNS_DIR / time.strftime("compare-%Y%m%d-%H%M%S")
    paired, ready_a, ready_b = paired_run(co_a, opts_a, co_b, opts_b, job, cfg, log_dir,
                                          progress)
    eff_a, eff_b = ready_a["options"], ready_b["options"]
    est = stats.estimate(*paired.flat(), cc)
    key = noise_key(job, paired.hardware)
    is_aa = co_a.tree == co_b.tree and eff_a == eff_b and job.drafter_b is None
    if sigma is not None:
        source_s = "given"
    elif is_aa:
        sigma, source_s = save_noise(root, key, est).sigma, "this A/A run (cached)"
    elif (rec := load_noise(root, key)) is not None:
        sigma, source_s = rec.sigma, f"cached A/A of {rec.created}"
    else:
        progress("A/A for σ")
        aa_job = dataclasses.replace(job, drafter_b=None)
        aa, _, _ = paired_run(co_a, opts_a, co_a, opts_a, aa_job, cfg, log_dir / "aa", progress)
        sigma = save_noise(root, key, stats.estimate(*aa.flat(), cc)).sigma
        source_s = "A/A run now (cached)"
    decision = stats.decide(est, sigma, paired.diverged, cc)
    report = Comparison(
        a=Side(rev=rev_a, commit=co_a.commit, tree=co_a.tree, options=opts_a, effective=eff_a,
               drafter=ready_a.get("drafter")),
        b=Side(rev=rev_b, commit=co_b.commit, tree=co_b.tree, options=opts_b, effective=eff_b,
               drafter=ready_b.get("drafter")),
        model=model, devices=job.devices,
        mode="alternate" if len(job.devices) == 1 else "side-by-side",
        requests=[r[0] for r in job.requests], max_new=job.max_new, drafter=job.drafter,
        drafter_b=job.drafter_b,
        rounds=job.rounds, warmup_rounds=job.warmup_rounds, paired=paired, estimate=est,
        sigma=sigma, sigma_source=source_s, decision=decision)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "comparison.json").write_text(report.model_dump_json(indent=1))
    return report
