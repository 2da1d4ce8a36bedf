"""The controller: is B really faster than A, with the same outputs? A paired benchmark on
clean checkouts.

Each system is exported from git objects at its commit (never from a live worktree) and
served by its own worker process (specpilot/judges/worker_proc.py), which proves the options
in effect and the system tree hash it runs. Both systems serve identical requests, fresh in
every round (specpilot/judges/prompts.py: drawn with a secret seed, never timed twice, the
warm-up on others):

- one device: rounds alternate A B B A (per request: A then B, then B then A next round);
- two devices: A and B run side by side, one per device, swapping devices every round
  (on CPU, `cpu:0,cpu:1` are one pinned core each, standing in for two GPUs).

Before any candidate runs, a worker on a clean checkout of stock (HEAD, options at defaults)
computes stock's greedy reference for every measured request; the outputs of the timed runs
themselves are checked against it (specpilot/judges/outputs.py), so the path that is timed is
the path whose outputs are checked. A fault rejects, whatever the speed.

Warm-up rounds run first and are never counted. Every request's time is measured by the
controller around the channel and kept. The gain, its one-sided lower bound and the
adoption decision come from specpilot/judges/stats.py; σ comes from an A/A run of A against
itself with the same procedure, cached per deployment under .specpilot/cache/noise/.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from specpilot.config import Config, load_config
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges import prompts, stats
from specpilot.judges.outputs import Expected, OutputCheck, check_request, near_tie_budget
from specpilot.judges.prompts import Req
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
    requests: list[str]    # the measured requests, every round's (each timed once a side)
    source: str = "fresh"  # where the prompts came from (specpilot/judges/prompts.py)
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
    outputs: dict[str, OutputCheck] = {}   # per side: the timed outputs against stock's
    faults: list[str] = []                 # why the outputs reject, one line each


@dataclass
class Job:
    """What to measure: the requests of every round (warm-up rounds first; ids filled in
    by stock's tokenizer before any candidate runs), budget, drafter, devices."""
    round_requests: list[list[Req]]
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

    @property
    def measured(self) -> list[Req]:
        return [r for row in self.round_requests[self.warmup_rounds:] for r in row]


def stock_outputs(co_stock: Checkout, job: Job, cfg: Config, log_dir: Path,
                  device: str) -> tuple[Job, dict[str, Expected]]:
    """Stock's greedy reference for every measured request, from a clean checkout of stock at
    defaults in a worker of its own (run before, never beside, the candidates); prompts are
    tokenized there too, so every worker is sent the same ids. Returns the job with ids."""
    g = cfg.gates
    ref = Worker("stock", co_stock, cfg.system_paths, job.model, {}, device,
                 log_dir / "stock-reference.log", None, job.max_context)
    expected: dict[str, Expected] = {}
    try:
        ref.start()
        rows = []
        for row in job.round_requests:
            rows.append([(rid, text, ids if ids is not None else
                          ref.call("tokenize", rid, prompt=text)["ids"])
                         for rid, text, ids in row])
        job = dataclasses.replace(job, round_requests=rows)
        for rid, _text, ids in job.measured:
            rep = ref.call("reference", rid, ids=ids, length=job.max_new,
                           draft_len=g.reference_draft_len, chunk=g.chunk)
            expected[rid] = Expected(request_id=rid, prompt_ids=ids, max_new=job.max_new,
                                     tokens=rep["tokens"], margins=rep["margin"],
                                     stop_reason=rep["stop_reason"])
    finally:
        ref.stop()
    return job, expected


def check_outputs(workers: dict, job: Job, replies: dict, expected: dict[str, Expected],
                  cfg: Config) -> dict[str, OutputCheck]:
    """Each side's timed outputs against stock's; continuations past a tolerated near-tie
    run in the same worker (as ordinary requests) after the timed rounds."""
    budget = near_tie_budget(sum(len(e.tokens) for e in expected.values()),
                             cfg.controller.near_tie_rate)
    checks = {}
    for side in ("A", "B"):
        w = workers[side, job.devices[0]]
        check = OutputCheck(side=side)
        for rid, got in replies[side].items():
            def rerun(ids, k, w=w, rid=rid):
                # twice: the first pays any compilation for the new prompt length; the
                # faster is charged, and both must agree
                one, two = (w.run(f"{rid}+{len(ids)}.{n}", k, ids=ids) for n in (1, 2))
                same = one.tokens == two.tokens
                return (one.tokens if same else None), min(one.seconds, two.seconds)
            check_request(check, expected[rid], got, rerun, cfg.gates.near_tie_epsilon, budget)
        checks[side] = check
    return checks


def _charge(times: list[list[float]], rows: list[list[Req]], extra: dict[str, float]) -> None:
    """Add each request's continuation time to its timed run (in place)."""
    for r, row in enumerate(rows):
        for i, req in enumerate(row):
            times[r][i] += extra.get(req[0], 0.0)


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
               progress: Callable[[str], None] = lambda s: None,
               expected: dict[str, Expected] | None = None
               ) -> tuple[Paired, dict, dict, dict[str, OutputCheck]]:
    """Run the paired design; returns the times, each side's worker `ready` report
    (options in effect, tree, drafter) and, given stock's `expected` outputs, each side's
    output check (empty without)."""
    workers: dict[tuple[str, str], Worker] = {}
    try:
        for dev in job.devices:
            workers["A", dev] = _spawn("A", co_a, opts_a, dev, job, cfg, log_dir)
            workers["B", dev] = _spawn("B", co_b, opts_b, dev, job, cfg, log_dir)
        hardware = workers["A", job.devices[0]].ready.get("hardware", "?")
        run = _alternate if len(job.devices) == 1 else _side_by_side
        times_a, times_b, placement, walls = [], [], [], []
        replies: dict[str, dict[str, list[int]]] = {"A": {}, "B": {}}
        for r, reqs in enumerate(job.round_requests):
            measured = r >= job.warmup_rounds
            m = r - job.warmup_rounds
            progress(f"round {m + 1}/{job.rounds}" if measured else "warm-up")
            if not measured:  # warm every worker: both placements when side by side
                for swap in range(len(job.devices)):
                    run(workers, job, reqs, swap, {"A": {}, "B": {}})
                continue
            t0 = time.perf_counter()
            row_a, row_b, where = run(workers, job, reqs, m, replies)
            walls.append(time.perf_counter() - t0)
            times_a.append(row_a)
            times_b.append(row_b)
            placement.append(where)
        checks = {}
        if expected is not None:
            progress("outputs against stock's reference")
            checks = check_outputs(workers, job, replies, expected, cfg)
            rows = job.round_requests[job.warmup_rounds:]
            _charge(times_a, rows, checks["A"].continuation_s)
            _charge(times_b, rows, checks["B"].continuation_s)
        diverged = any(replies["A"][rid] != replies["B"][rid] for rid in replies["A"]) or \
            bool(checks and checks["B"].near_ties)
        paired = Paired(times_a=times_a, times_b=times_b, placement=placement,
                        diverged=diverged, hardware=hardware, round_wall_s=walls)
        return (paired, workers["A", job.devices[0]].ready, workers["B", job.devices[0]].ready,
                checks)
    finally:
        for w in workers.values():
            w.stop()


def _call(w: Worker, req: Req, job: Job) -> Reply:
    rid, _prompt, ids = req
    return w.run(rid, job.max_new, ids=ids)


def _alternate(workers, job: Job, reqs: list[Req], m: int, replies: dict):
    dev = job.devices[0]
    order = ("A", "B") if m % 2 == 0 else ("B", "A")
    row = {"A": [], "B": []}
    for req in reqs:
        for side in order:
            reply = _call(workers[side, dev], req, job)
            row[side].append(reply.seconds)
            replies[side][req[0]] = reply.tokens
    return row["A"], row["B"], ",".join(order)


def _side_by_side(workers, job: Job, reqs: list[Req], m: int, replies: dict):
    d0, d1 = job.devices[m % 2], job.devices[(m + 1) % 2]
    row_a, row_b = [], []
    with ThreadPoolExecutor(2) as pool:
        for req in reqs:
            fa = pool.submit(_call, workers["A", d0], req, job)
            fb = pool.submit(_call, workers["B", d1], req, job)
            ra, rb = fa.result(), fb.result()
            row_a.append(ra.seconds)
            row_b.append(rb.seconds)
            replies["A"][req[0]] = ra.tokens
            replies["B"][req[0]] = rb.tokens
    return row_a, row_b, f"A@{d0},B@{d1}"


def noise_key(job: Job, hardware: str) -> dict:
    return {"model": job.model, "hardware": hardware, "requests": len(job.measured),
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
            max_new: int | None = None, sigma: float | None = None, source: str = "fresh",
            progress: Callable[[str], None] = lambda s: None, *, drafter_a: str | None = None,
            drafter_b: str | None = None, seed: int | None = None) -> Comparison:
    """Compare B against A; 'stock' names HEAD. σ: given, cached, or measured (A/A).
    Both sides use the configured drafter unless `drafter_a` / `drafter_b` name others
    (e.g. `ngram` against `block`; `ar` for none); σ is always A's own A/A. `source`: where
    the prompts come from (specpilot/judges/prompts.py); `seed` only for tests, a secret one
    otherwise."""
    root = Path(root).resolve()
    cfg = load_config(root)
    cc = cfg.controller
    store = GitStore(root)
    opts_a, opts_b = dict(opts_a or {}), dict(opts_b or {})
    co_a = clean_checkout(store, "HEAD" if rev_a == "stock" else rev_a, cfg.system_paths, root)
    co_b = clean_checkout(store, "HEAD" if rev_b == "stock" else rev_b, cfg.system_paths, root)
    co_stock = clean_checkout(store, "HEAD", cfg.system_paths, root)
    model = model or cfg.model.path
    n_rounds, per_round = rounds or cc.rounds, requests or cc.requests
    devices = devices or [_default_device()]
    if len(devices) > 2 or len(set(devices)) != len(devices):
        raise SpecPilotError("--devices takes one device or two different ones")
    job = Job(prompts.draw(model, source, cc.warmup_rounds + n_rounds, per_round, seed),
              max_new or cc.max_new, drafter_a or cc.drafter, devices, n_rounds,
              cc.warmup_rounds, model)
    if drafter_b and drafter_b != job.drafter:
        job.drafter_b = drafter_b
    log_dir = root / RUNS_DIR / time.strftime("compare-%Y%m%d-%H%M%S")
    progress("stock's reference outputs")
    job, expected = stock_outputs(co_stock, job, cfg, log_dir, devices[0])
    paired, ready_a, ready_b, checks = paired_run(co_a, opts_a, co_b, opts_b, job, cfg,
                                                  log_dir, progress, expected)
    eff_a, eff_b = ready_a["options"], ready_b["options"]
    est = stats.estimate(*paired.flat(), cc)
    key = noise_key(job, paired.hardware)
    is_aa = co_a.tree == co_b.tree and eff_a == eff_b and job.drafter_b is None
    faults = [f for c in checks.values() for f in c.faults]
    if sigma is not None:
        source_s = "given"
    elif is_aa and not faults:
        sigma, source_s = save_noise(root, key, est).sigma, "this A/A run (cached)"
    elif (rec := load_noise(root, key)) is not None:
        sigma, source_s = rec.sigma, f"cached A/A of {rec.created}"
    else:
        progress("A/A for σ")
        aa_job = dataclasses.replace(job, drafter_b=None)
        aa, _, _, _ = paired_run(co_a, opts_a, co_a, opts_a, aa_job, cfg, log_dir / "aa",
                                 progress)
        sigma = save_noise(root, key, stats.estimate(*aa.flat(), cc)).sigma
        source_s = "A/A run now (cached)"
    decision = stats.decide(est, sigma, paired.diverged, cc)
    if faults:   # wrong outputs reject whatever the speed
        decision = decision.model_copy(update=dict(adopted=False, verdict="not adopted"))
    report = Comparison(
        a=Side(rev=rev_a, commit=co_a.commit, tree=co_a.tree, options=opts_a, effective=eff_a,
               drafter=ready_a.get("drafter")),
        b=Side(rev=rev_b, commit=co_b.commit, tree=co_b.tree, options=opts_b, effective=eff_b,
               drafter=ready_b.get("drafter")),
        model=model, devices=job.devices,
        mode="alternate" if len(job.devices) == 1 else "side-by-side",
        requests=[r[0] for r in job.measured], source=source, max_new=job.max_new,
        drafter=job.drafter, drafter_b=job.drafter_b,
        rounds=job.rounds, warmup_rounds=job.warmup_rounds, paired=paired, estimate=est,
        sigma=sigma, sigma_source=source_s, decision=decision, outputs=checks, faults=faults)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "comparison.json").write_text(report.model_dump_json(indent=1))
    return report
