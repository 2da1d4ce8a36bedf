"""The controller: is B really faster than A, with the same outputs? A paired benchmark on
clean checkouts.

Each system is exported from git objects at its commit (never from a live worktree) and
served by `controller.processes` (P ≥ 2) worker processes per side
(specpilot/judges/worker_proc.py), labelled A0..A{P-1} and B0..B{P-1}; each proves the
options in effect and the system tree hash it runs. Every process serves identical
requests, fresh in every round (specpilot/judges/prompts.py: drawn with a secret seed, never
timed twice by one process, the warm-up on others):

- one device: per request, every worker in the round's order, the interleaved labels
  A0 B0 A1 B1 .. rotated by one each round (so no process is always first, and sides
  alternate: with P = 1 this is A B, B A);
- two devices: each device hosts half of each side (A_i on device i mod 2, B_i on the
  other: A0 B1 on the first, A1 B0 on the second, for P = 2), so a device holds P workers,
  as many as A and B held before; A_i and B_i run side by side, pair after pair in the
  round's rotated order (on CPU, `cpu:0,cpu:1` are one pinned core each, standing in for
  two GPUs). A device's own speed is then part of its processes' offsets: the same-side
  spread counts it, and with P even it cancels from the gain.

Before any candidate runs, a worker on a clean checkout of stock (HEAD, options at defaults)
computes stock's greedy reference for every measured request; the outputs of the timed runs
themselves are checked against it (specpilot/judges/outputs.py), so the path that is timed is
the path whose outputs are checked. A fault rejects, whatever the speed.

Throughput mode (`batch` C): each worker serves a round's requests together through its
system's batched engine (at most C at once; all submitted at the round's start, or with
`rate` R arriving as a Poisson trace of R requests a second, each sent to the worker only
at its arrival time: the same requests and the same arrivals on both sides), and the
controller times the whole batch
around the channel: one cell per round and process, the round's time for the same tokens,
so the gain is the throughput ratio. Every request's batched output is checked against
stock's single-request greedy reference exactly as above (the batched gate: batching must
change no token beyond a tolerated near-tie). In bf16 the near-tie also widens by what
stock's own batched engine moves (`fold_batch_noise`: stock at defaults serves the measured
requests at C in its reference worker, before any candidate runs).

Several candidates (`compare_many`, `specpilot compare A B C ..`): one stock reference and
one A side for all, the candidates' processes sides B, C, .. of the same rounds (one
device; labels A0 B0 C0 A1 B1 C1 .. in the rotation), each judged against A alone
(`side_view`), the bound's level split among them.

While a worker (on two devices, a pair) is timed, every other worker's processes are
stopped (specpilot/judges/quiet.py): a candidate cannot leave work running after its reply
to slow the next timed worker.

Warm-up rounds run first and are never counted. Every request's time is measured by the
controller around the channel and kept, per label (`paired.times[label][round][request]`).
The gain, its lower bound, the run's own σ (same-side processes: stock against stock,
candidate against candidate, in the same rounds) and the adoption decision come from
`stats.judge` (specpilot/judges/stats.py); nothing is cached between runs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from specpilot.config import Config, load_config
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges import prompts, stats
from specpilot.judges.design import (MAX_CANDIDATES, Job, candidate_sides, device_of, labels,
                                     round_order)
from specpilot.judges.eta import Clock, Eta
from specpilot.judges.forced_outputs import force_outputs, to_force
from specpilot.judges.outputs import Expected, OutputCheck, Tolerance, check_request
from specpilot.judges.preparation import (Ahead, hold_workers, prepare, session_groups,
                                          spawn_workers)
from specpilot.judges.prompts import Req
from specpilot.judges.stock_reference import (fold_batch_noise, near_tie, near_tie_and_budget,
                                              stock_outputs)
from specpilot.judges.quiet import alone
from specpilot.judges.worker_proc import Checkout, Reply, Worker, clean_checkout
from specpilot.requests.sealed import logs_dir

SCHEMA_VERSION = 2
RUNS_DIR = Path(".specpilot") / "runs"
# the design, stock's reference and the workers' start-up live in judges/design.py,
# judges/stock_reference.py and judges/preparation.py; their names stay importable from here
# (the cycle, the simulation, tests)
__all__ = ["MAX_CANDIDATES", "Comparison", "Job", "Paired", "Side", "candidate_sides",
           "compare", "compare_many", "device_of", "fold_batch_noise", "labels", "measure",
           "near_tie", "near_tie_and_budget", "paired_run", "prepare", "round_order",
           "run_sides", "side_view", "stock_outputs"]


class Side(BaseModel):
    rev: str
    commit: str
    tree: str
    options: dict          # asked
    effective: dict = {}   # reported by the worker
    drafter: str | None = None   # the drafter class the worker reports serving (None: AR)
    confined: str = ""           # "bubblewrap", or "none: <why>" (the user opted out)


class Paired(BaseModel):
    """Raw times per worker label ("A0", "B1", ...): [round][request] seconds."""
    schema_version: int = SCHEMA_VERSION
    times: dict[str, list[list[float]]]
    placement: list[str]   # per measured round: "A0,B0,A1,B1" order, or "A0@dev,B0@dev;..."
    diverged: bool         # B's tokens differ from A's on some request
    diverged_sides: dict[str, bool] = {}   # each candidate side's own (several candidates)
    hardware: str
    round_wall_s: list[float] = []   # per measured round: wall time of the whole round

    def flat(self, a: str = "A0", b: str = "B0") -> tuple[list[float], list[float]]:
        """Two labels' times as paired flat lists (the pre-screen's one pair of workers)."""
        return ([t for row in self.times[a] for t in row], [t for row in self.times[b] for t in row])


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
    processes: int = 1     # worker processes per side
    batch: int = 0         # throughput mode's concurrency (0: request by request)
    rate: float = 0.0      # throughput mode's Poisson arrivals a second (0: all at once)
    arrivals: list[list[float]] = []   # per measured round, each request's arrival offset
    family: int = 1        # directions judged together: the bound's level is split by it
    sigma: float
    sigma_source: str
    decision: stats.Decision
    outputs: dict[str, OutputCheck] = {}   # per side: the timed outputs against stock's
    faults: list[str] = []                 # why the outputs reject, one line each
    tolerance: Tolerance | None = None     # the near-tie in force (outputs.tolerance)
    candidates: list[str] = []             # every candidate of the run (B is one of them)
    clock_s: dict[str, float] = {}         # where the run's wall time went, by phase


def side_view(paired: "Paired", side: str) -> "Paired":
    """The run's times as an A/B design of A against one candidate `side` (its labels
    renamed B0, B1, ..): what `stats.judge` reads. Placement keeps the run's own labels."""
    times = {label: rows for label, rows in paired.times.items() if label[0] == "A"}
    times.update({"B" + label[1:]: rows for label, rows in paired.times.items()
                  if label[0] == side})
    return paired.model_copy(update=dict(
        times=times, diverged=paired.diverged_sides.get(side, paired.diverged)))


def check_outputs(workers: dict, job: Job, replies: dict, expected: dict[str, Expected],
                  cfg: Config, checks: dict[str, OutputCheck] | None = None
                  ) -> tuple[dict[str, OutputCheck], dict[str, dict[str, tuple[float, float]]]]:
    """Each side's timed outputs against stock's, every process's (`replies` is keyed by
    label); continuations past a tolerated near-tie run in the worker that gave the output
    (as ordinary requests) after the timed rounds. The near-tie budget counts the tokens
    a side's processes returned (P copies of each reference). Returns the checks (one per
    side) and, per label and request, what to charge its timed run (outputs.check_request:
    the share of its time, the continuations' seconds). `checks` from an earlier session of
    the same run are continued (one budget for the whole run)."""
    tol, budget = near_tie_and_budget(job, expected, cfg)
    checks, charges = dict(checks or {}), {}
    for side in job.sides:
        check = checks.get(side) or OutputCheck(side=side)
        for label in (lab for lab in job.names if lab[0] == side):
            w = workers[label]
            charges[label] = {}
            for rid, got in replies[label].items():
                def rerun(ids, k, w=w, rid=rid, label=label):
                    # twice: the first pays any compilation for the new prompt length; the
                    # faster is charged, and both must agree (timed alone, as the rounds)
                    with alone(workers, [label]):
                        one, two = (w.run(f"{rid}+{len(ids)}.{n}", k, ids=ids)
                                    for n in (1, 2))
                    same = one.tokens == two.tokens
                    return (one.tokens if same else None), min(one.seconds, two.seconds)
                charges[label][rid] = check_request(check, expected[rid], got, rerun,
                                                    tol.epsilon, budget)
        checks[side] = check
    return checks, charges


def _charge(times: list[list[float]], rows: list[list[Req]],
            charges: dict[str, tuple[float, float]]) -> None:
    """Charge each request its kept share of the timed run plus its continuations (in place):
    request by request only. A round timed as one batch (throughput mode) is never charged
    so: its time cannot be split among its requests, and a continuation run alone costs a
    single request's seconds, not a batch's share. On the H100 (embedded default, C = 16)
    such charges were 80 % of stock's charged time in one verdict and decided it by which
    side met more near-ties (docs/results.md, 2026-12-06, session 27); throughput mode
    checks its outputs by forcing instead (`_forced_check`) and keeps the batches' times."""
    for r, row in enumerate(rows):
        if len(times[r]) != len(row):
            raise ValueError(f"round {r}: {len(times[r])} times for {len(row)} requests: "
                             "a batched round is checked by forcing, never charged")
        for i, req in enumerate(row):
            share, extra = charges.get(req[0], (1.0, 0.0))
            times[r][i] = times[r][i] * share + extra


def paired_run(co_a: Checkout, opts_a: dict, co_b: Checkout, opts_b: dict, job: Job,
               cfg: Config, log_dir: Path,
               progress: Callable[[str], None] = lambda s: None,
               expected: dict[str, Expected] | None = None, co_stock: Checkout | None = None
               ) -> tuple[Paired, dict, dict, dict[str, OutputCheck]]:
    """Run the paired design of B against A (`run_sides` with two sides); returns the
    times, each side's worker `ready` report (options in effect, tree, drafter) of its first
    process and, given stock's `expected` outputs, each side's output check."""
    paired, ready, checks = run_sides({"A": (co_a, opts_a), "B": (co_b, opts_b)}, job, cfg,
                                      log_dir, progress, expected, co_stock)
    return paired, ready["A0"], ready["B0"], checks


def run_sides(systems: dict[str, tuple[Checkout, dict]], job: Job, cfg: Config, log_dir: Path,
              progress: Callable[[str], None] = lambda s: None,
              expected: dict[str, Expected] | None = None, co_stock: Checkout | None = None,
              ahead: Ahead | None = None, clock: Clock | None = None,
              held: dict[str, Worker] | None = None
              ) -> tuple[Paired, dict[str, dict], dict[str, OutputCheck]]:
    """Run the design over every side of `job.sides` (A, then one letter a candidate; each
    side's checkout and options in `systems`); returns the times, every worker's `ready`
    report by label and, given stock's `expected` outputs, each side's output check. With
    `controller.resident` pairs alive at a time (fewer than P: a target of which only two
    copies fit in a device), the process indices run the same rounds one session after
    another; A_i and every candidate's i-th process always share one.
    In throughput mode the outputs are checked by forcing stock (`co_stock`, the
    references' clean checkout) through them once every session is over
    (forced_outputs.py), and the batches keep their own times; request by request, by
    continuations (check_outputs), each request charged its kept share (`_charge`).
    `ahead`: the workers already started and prepared beside stock's reference (one
    session only). `clock`: where the phases' wall time goes (Clock). `held`: workers
    started and options-checked ahead (preparation.hold_workers), loaded in their session
    instead of started anew."""
    if set(systems) != set(job.sides) or not job.sides.startswith("A"):
        raise ValueError(f"systems {sorted(systems)} are not the job's sides {job.sides}")
    forced = bool(job.batch) and expected is not None
    if forced and co_stock is None:
        raise ValueError("throughput mode checks its outputs by forcing stock: give co_stock")
    clock = clock or Clock()
    sessions = session_groups(job, cfg)
    if ahead is not None and len(sessions) > 1:
        raise ValueError("workers prepared ahead serve one session only")
    parts, checks, ready, replies = [], {}, {}, {}
    for n, session in enumerate(sessions):
        part = dataclasses.replace(job, session=session if len(sessions) > 1 else None)
        if len(sessions) > 1:
            progress(f"session {n + 1}/{len(sessions)}: {', '.join(part.names)}")
        paired, checks, got, said = _session(systems, part, cfg, log_dir, progress,
                                             None if forced else expected, checks,
                                             ahead.workers if ahead is not None else None,
                                             clock, held)
        parts.append(paired)
        ready.update(got)
        replies.update(said)
    paired = parts[0] if len(parts) == 1 else Paired(
        times={label: rows for p in parts for label, rows in p.times.items()},
        placement=[" | ".join(p.placement[m] for p in parts) for m in range(job.rounds)],
        diverged=any(p.diverged for p in parts), hardware=parts[0].hardware,
        diverged_sides={side: any(p.diverged_sides.get(side) for p in parts)
                        for side in job.sides[1:]},
        round_wall_s=[sum(p.round_wall_s[m] for p in parts) for m in range(job.rounds)])
    if forced:
        with clock.phase("outputs forced"):
            checks = _forced_check(co_stock, job, replies, expected, cfg, log_dir, progress)
    for side in job.sides[1:]:   # a tolerated near-tie is a divergence: the bar rises
        if checks and checks[side].near_ties:
            paired.diverged_sides[side] = True
    paired.diverged = paired.diverged_sides.get("B", paired.diverged)
    return paired, ready, checks


def _forced_check(co_stock: Checkout, job: Job, replies: dict, expected: dict[str, Expected],
                  cfg: Config, log_dir: Path, progress) -> dict[str, OutputCheck]:
    """Throughput mode: every side's timed outputs checked by a worker of stock forced
    through them (forced_outputs.py), started after the candidates' workers stopped."""
    progress("outputs against stock, forced through each that parts from its reference")
    tol, budget = near_tie_and_budget(job, expected, cfg)
    names = [label for label in labels(job.processes, job.sides) if label in replies]
    if not to_force(names, replies, expected):   # no worker needed (stock's own, or faults)
        return force_outputs(None, names, replies, expected, tol, budget, cfg.gates.chunk)
    stocks = [Worker("stock-check" if i == 0 else f"stock-check{i}", co_stock,
                     cfg.system_paths, job.model, {}, job.devices[0],
                     log_dir / ("stock-check.log" if i == 0 else f"stock-check{i}.log"), None,
                     job.max_context, cfg.judges.confine)
              for i in range(cfg.controller.reference_processes)]
    try:
        for stock in stocks:   # one at a time, as the references' (`stock_outputs`)
            stock.start()
        return force_outputs(stocks, names, replies, expected, tol, budget, cfg.gates.chunk,
                             progress=progress)
    finally:
        for stock in stocks:
            stock.stop()


def _session(systems: dict[str, tuple[Checkout, dict]], job: Job, cfg: Config, log_dir: Path,
             progress, expected, checks, prepared: dict | None, clock: Clock,
             held: dict[str, Worker] | None = None
             ) -> tuple[Paired, dict[str, OutputCheck], dict[str, dict],
                        dict[str, dict[str, list[int]]]]:
    """One session's workers: started, measured, their outputs checked (given `expected`),
    stopped. Returns the times, the checks, each worker's ready report and its replies.
    `prepared`: the session's workers, already started and prepared (`Ahead`)."""
    workers: dict[str, Worker] = prepared if prepared is not None else {}
    try:
        if prepared is None:
            with clock.phase("workers started"):
                spawn_workers(workers, systems, job, cfg, log_dir, held)
            with clock.phase("graphs"):
                prepare(workers, job, progress)
        with clock.phase("rounds"):
            paired, replies = measure(workers, job, progress)
        if expected is not None:
            progress("outputs against stock's reference")
            with clock.phase("outputs checked"):
                checks, charges = check_outputs(workers, job, replies, expected, cfg, checks)
            rows = job.round_requests[job.warmup_rounds:]
            for label, times in paired.times.items():
                _charge(times, rows, charges[label])
        return paired, checks, {label: w.ready for label, w in workers.items()}, replies
    finally:
        for w in workers.values():
            w.stop()


def measure(workers: dict, job: Job, progress: Callable[[str], None] = lambda s: None
            ) -> tuple[Paired, dict[str, dict[str, list[int]]]]:
    """Warm-up rounds, then the measured rounds, on started workers keyed by label:
    anything with Worker.run and a `ready` dict (the simulation passes synthetic ones).
    Returns the times and every label's measured outputs (label -> request id -> tokens)."""
    names = job.names
    hardware = workers[names[0]].ready.get("hardware", "?")
    run = _alternate if len(job.devices) == 1 else _side_by_side
    times: dict[str, list[list[float]]] = {label: [] for label in names}
    placement, walls = [], []
    replies: dict[str, dict[str, list[int]]] = {label: {} for label in names}
    eta = None
    for r, reqs in enumerate(job.round_requests):
        measured = r >= job.warmup_rounds
        m = r - job.warmup_rounds
        if not measured:  # every worker serves every warm-up request
            progress("warm-up")
            run(workers, job, reqs, m, {label: {} for label in names})
            continue
        eta = eta or Eta("round", job.rounds, progress)
        t0 = time.perf_counter()
        rows, where = run(workers, job, reqs, m, replies)
        walls.append(time.perf_counter() - t0)
        eta.done()
        for label, row in rows.items():
            times[label].append(row)
        placement.append(where)
    a_labels = [lab for lab in names if lab[0] == "A"]
    sides = {side: any(replies[b][rid] != replies[a][rid] for b in names if b[0] == side
                       for a in a_labels for rid in replies[b])
             for side in dict.fromkeys(lab[0] for lab in names if lab[0] != "A")}
    return (Paired(times=times, placement=placement, diverged=sides.get("B", False),
                   diverged_sides=sides, hardware=hardware, round_wall_s=walls), replies)


def _call(w: Worker, req: Req, job: Job) -> Reply:
    rid, _prompt, ids = req
    return w.run(rid, job.max_new, ids=ids)


def _batch(w: Worker, reqs: list[Req], job: Job, m: int, replies: dict) -> float:
    """A round's requests served together by `w` (throughput mode): the batch's seconds."""
    outputs, seconds = w.batch(f"round{m}", [(rid, ids) for rid, _p, ids in reqs], job.max_new,
                               job.batch, job.arrivals(reqs))
    replies[w.label].update(outputs)
    return seconds


def _alternate(workers, job: Job, reqs: list[Req], m: int, replies: dict):
    order = round_order(job.names, m)
    rows: dict[str, list[float]] = {label: [] for label in order}
    if job.batch:
        for label in order:
            with alone(workers, [label]):   # the others stopped while it is timed
                rows[label].append(_batch(workers[label], reqs, job, m, replies))
        return rows, ",".join(order)
    for req in reqs:
        for label in order:
            with alone(workers, [label]):
                reply = _call(workers[label], req, job)
            rows[label].append(reply.seconds)
            replies[label][req[0]] = reply.tokens
    return rows, ",".join(order)


def _side_by_side(workers, job: Job, reqs: list[Req], m: int, replies: dict):
    order = round_order(job.indices, m)
    rows: dict[str, list[float]] = {label: [] for label in job.names}
    with ThreadPoolExecutor(2) as pool:
        if job.batch:
            for i in order:
                pair = (f"A{i}", f"B{i}")
                with alone(workers, pair):
                    futures = [pool.submit(_batch, workers[label], reqs, job, m, replies)
                               for label in pair]
                    for label, fut in zip(pair, futures):
                        rows[label].append(fut.result())
        for req in reqs if not job.batch else []:
            for i in order:
                pair = (f"A{i}", f"B{i}")
                with alone(workers, pair):
                    futures = [pool.submit(_call, workers[label], req, job) for label in pair]
                    replies_of = [(label, fut.result()) for label, fut in zip(pair, futures)]
                for label, reply in replies_of:
                    rows[label].append(reply.seconds)
                    replies[label][req[0]] = reply.tokens
    return rows, ";".join(f"A{i}@{device_of(f'A{i}', job.devices)},"
                          f"B{i}@{device_of(f'B{i}', job.devices)}" for i in order)


def _default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def compare(root: Path, rev_a: str, rev_b: str, opts_a: dict | None = None,
            opts_b: dict | None = None, devices: list[str] | None = None,
            rounds: int | None = None, model: str | None = None, requests: int | None = None,
            max_new: int | None = None, sigma: float | None = None, source: str = "fresh",
            progress: Callable[[str], None] = lambda s: None, *, drafter_a: str | None = None,
            drafter_b: str | None = None, seed: int | None = None,
            family: int = 1, batch: int = 0, rate: float = 0.0) -> Comparison:
    """Compare B against A; 'stock' names HEAD. σ is this run's own (same-side processes
    in the same rounds); a given `sigma` is a floor that can only raise the bar. `family`:
    how many directions are judged together (the bound's level is split among them).
    Both sides use the configured drafter unless `drafter_a` / `drafter_b` name others
    (e.g. `ngram` against `block`; `ar` for none). `source`: where the prompts come from
    (specpilot/judges/prompts.py); `seed` only for tests, a secret one otherwise. `batch`
    C > 0: throughput mode (each round one batch of at most C at once; by default 2C
    requests a round and at least controller.min_pairs rounds, one cell each); `rate` R > 0
    with it: the round's requests arrive as a Poisson trace of R a second (Job.arrivals),
    each sent to the workers only at its time."""
    return compare_many(root, rev_a, [(rev_b, opts_b or {})], opts_a, devices, rounds, model,
                        requests, max_new, sigma, source, progress, drafter_a=drafter_a,
                        drafter_b=drafter_b, seed=seed, family=family, batch=batch,
                        rate=rate)[0]


def compare_many(root: Path, rev_a: str, candidates: list[tuple[str, dict]],
                 opts_a: dict | None = None, devices: list[str] | None = None,
                 rounds: int | None = None, model: str | None = None,
                 requests: int | None = None, max_new: int | None = None,
                 sigma: float | None = None, source: str = "fresh",
                 progress: Callable[[str], None] = lambda s: None, *,
                 drafter_a: str | None = None, drafter_b: str | None = None,
                 seed: int | None = None, family: int = 1, batch: int = 0,
                 rate: float = 0.0) -> list[Comparison]:
    """`compare` of several candidates (revision, options) against one A in one run: one
    stock reference, one A side, the candidates' workers as sides B, C, .. of the same
    rounds (one device), each judged against A alone (`side_view`) with the bound's level
    split among them (family at least their number). One report a candidate, in their
    order. What the candidates share is what their verdicts would each have computed
    alone (stock's reference and its noise, A's workers); every output of every side is
    checked, and a candidate is rejected only for its own faults or stock's."""
    if sigma is not None and not (math.isfinite(sigma) and sigma >= 0):
        raise SpecPilotError(f"σ must be finite and at least 0, got {sigma}", code=2)
    sides = candidate_sides(len(candidates))
    root = Path(root).resolve()
    cfg = load_config(root)
    cc = cfg.controller
    store = GitStore(root)
    opts_a = dict(opts_a or {})
    cands = [(rev, dict(opts or {})) for rev, opts in candidates]
    co_a = clean_checkout(store, "HEAD" if rev_a == "stock" else rev_a, cfg.system_paths, root)
    cos = [clean_checkout(store, "HEAD" if rev == "stock" else rev, cfg.system_paths, root)
           for rev, _opts in cands]
    co_stock = clean_checkout(store, "HEAD", cfg.system_paths, root)
    model = model or cfg.model.path
    if batch < 0:
        raise SpecPilotError(f"--batch must be at least 1 (0: request by request), got {batch}",
                             code=2)
    if rate and (not batch or not math.isfinite(rate) or rate < 0):
        raise SpecPilotError(f"--rate needs --batch and a finite rate above 0 (requests a "
                             f"second), got {rate}" + ("" if batch else " without --batch"),
                             code=2)
    n_rounds = rounds or (max(cc.rounds, cc.min_pairs) if batch else cc.rounds)
    per_round = requests or (2 * batch if batch else cc.requests)
    devices = devices or [_default_device()]
    if len(devices) > 2 or len(set(devices)) != len(devices):
        raise SpecPilotError("--devices takes one device or two different ones")
    if len(devices) == 2 and cc.processes % 2:
        raise SpecPilotError(f"two devices need an even controller.processes (each device "
                             f"hosts half of each side), got {cc.processes}")
    if len(devices) == 2 and len(cands) > 1:
        raise SpecPilotError(f"several candidates are judged on one device; got "
                             f"{len(cands)} candidates and --devices {','.join(devices)}",
                             code=2)
    family = max(family, len(cands))
    # before workers; a batched round is one cell
    stats.require_design(n_rounds, 1 if batch else per_round, cc.processes, cc.processes, cc)
    job = Job(prompts.draw(model, source, cc.warmup_rounds + n_rounds, per_round, seed),
              max_new or cc.max_new, drafter_a or cc.drafter, devices, n_rounds,
              cc.warmup_rounds, model, processes=cc.processes, batch=batch, rate=rate,
              sides=sides)
    if drafter_b and drafter_b != job.drafter:
        job.drafter_b = drafter_b
    log_dir = root / RUNS_DIR / time.strftime("compare-%Y%m%d-%H%M%S")
    if source == "sealed":   # logs and report of sealed requests stay outside the repository
        log_dir = logs_dir(log_dir.name)
    named = [("A", co_a, opts_a)] + [(side, co, opts) for side, co, (_rev, opts)
                                     in zip(sides[1:], cos, cands)]
    said = {"A": "A", **{side: "B" if len(cands) == 1 else f"{side} ({rev})"
                         for side, (rev, _o) in zip(sides[1:], cands)}}
    systems = {side: (co, opts) for side, co, opts in named}
    # before any model: each side with options, checked by its first worker, then held
    held = hold_workers([(side, f"{said[side]} options") for side, _co, opts in named if opts],
                        systems, job, cfg, log_dir)
    clock = Clock()
    ahead = (Ahead(systems, cfg, log_dir, progress, clock, held)
             if cc.prepare_beside_reference and len(session_groups(job, cfg)) == 1 else None)
    try:
        progress("stock's reference outputs")
        with clock.phase("stock's reference"):   # with its own batching, where batched
            job, expected = stock_outputs(co_stock, job, cfg, log_dir, devices[0], progress,
                                          beside=ahead.start if ahead is not None else None)
        if len(cands) > 1:
            progress("candidates: " + ", ".join(f"{side} {rev}" for side, (rev, _o)
                                                in zip(sides[1:], cands)))
        if ahead is not None:
            with clock.phase("waiting for the graphs"):
                ahead.join()
        paired, ready, checks = run_sides(systems, job, cfg, log_dir, progress, expected,
                                          co_stock, ahead, clock, held)
    finally:
        if ahead is not None:
            ahead.stop()
        for w in held.values():   # those never loaded (a failure before their session)
            w.stop()
    progress(clock.line())
    tol = near_tie(expected, cfg)
    log_dir.mkdir(parents=True, exist_ok=True)
    reports = []
    for side, co_b, (rev_b, opts_b) in zip(sides[1:], cos, cands):
        view = side_view(paired, side)
        ready_a, ready_b = ready["A0"], ready[f"{side}0"]
        mine = {"A": checks["A"], "B": checks[side]} if checks else {}
        faults = [f for c in mine.values() for f in c.faults]
        est, decision = stats.judge(view.times, view.diverged, cc, family, sigma_floor=sigma)
        if faults:   # wrong outputs reject whatever the speed
            decision = decision.model_copy(update=dict(adopted=False, verdict="not adopted"))
        report = Comparison(
            a=Side(rev=rev_a, commit=co_a.commit, tree=co_a.tree, options=opts_a,
                   effective=ready_a["options"], drafter=ready_a.get("drafter"),
                   confined=ready_a.get("confined", "")),
            b=Side(rev=rev_b, commit=co_b.commit, tree=co_b.tree, options=opts_b,
                   effective=ready_b["options"], drafter=ready_b.get("drafter"),
                   confined=ready_b.get("confined", "")),
            model=model, devices=job.devices,
            mode="alternate" if len(job.devices) == 1 else "side-by-side",
            requests=[r[0] for r in job.measured], source=source, max_new=job.max_new,
            drafter=job.drafter, drafter_b=job.drafter_b,
            rounds=job.rounds, warmup_rounds=job.warmup_rounds, paired=view,
            processes=job.processes, batch=job.batch, rate=job.rate,
            arrivals=[job.arrivals(reqs) or [] for reqs in job.round_requests[job.warmup_rounds:]]
            if job.rate else [], family=family, estimate=est, sigma=decision.sigma,
            sigma_source=decision.sigma_source, decision=decision, outputs=mine,
            faults=faults, tolerance=tol, candidates=[rev for rev, _o in cands],
            clock_s={**clock.seconds, "all": clock.total()})
        name = "comparison.json" if len(cands) == 1 else f"comparison-{side}.json"
        (log_dir / name).write_text(report.model_dump_json(indent=1))
        reports.append(report)
    return reports
