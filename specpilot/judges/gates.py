"""The one gate path (`specpilot gate`, the cycle's gates and its final validation): stock's
references from a clean checkout of the stock commit, the candidate forced in its own worker
from a clean checkout of its commit. Both run `worker_main.py` through `worker_proc.Worker`,
the program the controller runs too; the verdicts (forcing.py) are computed here, in the
judges' process, from what the workers reply.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specpilot.config import Config, GatesSection, load_config
from specpilot.errors import SpecPilotError
from specpilot.judges.forcing import (GateReport, Reference, ReferenceCache, forcing_gate,
                                      option_default_gate)
from specpilot.gitstore import GitStore
from specpilot.judges.eta import Eta
from specpilot.judges.worker_main import DEFAULT_CONTEXT
from specpilot.judges.worker_proc import Worker, check_options, clean_checkout
from specpilot.requests import load_dev, load_jsonl, spread
from specpilot.requests.sealed import ensure_sealed, logs_dir

RUNS_DIR = Path(".specpilot") / "runs"


Request = tuple[str, "str | None", "list[int] | None"]   # (id, prompt, token ids)


def check_requests(check: str, count: int):
    reqs = load_dev() if check == "dev" else load_jsonl(ensure_sealed())
    return spread(reqs, count)


def gate_requests(model: str, check: str, count: int) -> list[Request]:
    """The requests a check forces, from the judges' own copies of the request sets. A random
    test model has no tokenizer: its requests are 16 random token ids each (seed 0 for dev,
    the controller's dev requests; seed 1 for sealed)."""
    if model.startswith("random:"):
        rng = random.Random(0 if check == "dev" else 1)
        prefix = "rand" if check == "dev" else "sealed-rand"
        return [(f"{prefix}-{i}", None, [rng.randrange(1, 256) for _ in range(16)])
                for i in range(count)]
    return [(r.id, r.prompt, None) for r in check_requests(check, count)]


def worker_context(model: str, prompt_ids: list[list[int]], length: int) -> int | None:
    """The context a gate's workers get: none named, as for the controller's workers (the
    model's own context; a random model's DEFAULT_CONTEXT), unless a random model's check
    needs more. The same setup as the controller's, so the context is no tell either."""
    if not model.startswith("random:"):
        return None
    need = max((len(ids) for ids in prompt_ids), default=0) + length + 64
    return None if need <= DEFAULT_CONTEXT else need


def worker_drafter(cfg: Config) -> str | None:
    """The drafter a judge's worker serves: the controller's (None for autoregressive)."""
    return None if cfg.controller.drafter == "ar" else cfg.controller.drafter


@dataclass
class _Forced:
    argmax: list[int]
    margin: list[float]
    forced: list[int]
    digests: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> list[int]:
        return [i for i, (a, f) in enumerate(zip(self.argmax, self.forced)) if a != f]


class _Opts:
    def __init__(self, effective: dict, non_default: dict):
        self._values, self._non_default = effective, non_default

    def __getitem__(self, name):
        return self._values[name]

    def non_default(self) -> dict:
        return dict(self._non_default)


@dataclass
class _Gen:
    tokens: list[int]


class WorkerEngine:
    """The slice of Engine the gates use, served by a worker process."""

    remote = True   # generates with the drafter its worker was started with

    def __init__(self, worker: Worker, eta: Eta | None = None):
        self.worker = worker
        self.options = _Opts(worker.ready["options"], worker.ready.get("non_default", {}))
        self._n = 0
        self.eta = eta   # one unit a forced pass or generation (the gate's requests)

    def _id(self) -> str:
        self._n += 1
        return f"q{self._n}"

    def _done(self) -> None:
        if self.eta is not None and self.eta.count < self.eta.total:
            self.eta.done()

    def force(self, prompt, forced, chunk=None, digests=False) -> _Forced:
        rep = self.worker.call("force", self._id(), ids=list(prompt), forced=list(forced),
                               chunk=chunk, digests=digests)
        self._done()
        return _Forced(rep["argmax"], rep["margin"], list(forced), rep.get("digests", []))

    def generate(self, prompt, max_new, drafter=None) -> _Gen:  # the worker's own drafter
        tokens = self.worker.run(self._id(), max_new, ids=list(prompt)).tokens
        self._done()
        return _Gen(tokens)


def stock_references(root: Path, cfg: Config, gates: GatesSection, stock_rev: str,
                     requests: list[Request], length: int, device: str,
                     log_path: Path, check: str,
                     progress: Callable[[str], None] = lambda s: None) -> list[Reference]:
    """Stock's reference of each request for `length` new tokens: from the cache of
    `check` (dev: in the repository; sealed: beside the secret seed, outside it; keyed by
    model, the stock commit's system tree, request and length; a longer entry serves a
    shorter length) or computed by stock at its defaults in a worker on a clean checkout of
    `stock_rev`."""
    co = clean_checkout(GitStore(root), stock_rev, cfg.system_paths, root)
    model = cfg.model.path
    cache = ReferenceCache.for_check(root, check)
    found = {rid: cache.get(model, co.tree, rid, length) for rid, _, _ in requests}
    missing = [r for r in requests if found[r[0]] is None]
    if missing:
        ctx = worker_context(model, [ids for _, _, ids in requests if ids], length)
        stock = Worker("stock", co, cfg.system_paths, model, {}, device, log_path,
                       worker_drafter(cfg), ctx, confine=cfg.judges.confine)
        try:
            progress(f"stock's references: {len(missing)} of {len(requests)} not cached")
            stock.start()
            eta = Eta("stock's reference, request", len(missing), progress, startup=True)
            for rid, prompt, ids in missing:
                if ids is None:
                    ids = stock.call("tokenize", rid, prompt=prompt)["ids"]
                rep = stock.call("reference", rid, ids=ids, length=length,
                                 draft_len=gates.reference_draft_len, chunk=gates.chunk)
                ref = Reference(model=model, stock_tree=co.tree, request_id=rid, length=length,
                                prompt_ids=ids, tokens=rep["tokens"],
                                stop_reason=rep["stop_reason"], chunk=gates.chunk,
                                argmax=rep["argmax"], margins=rep["margin"],
                                digests=rep["digests"], noise=rep.get("noise") or [],
                                noise_flips=rep.get("noise_flips") or [])
                cache.put(ref)
                found[rid] = ref
                eta.done()
        finally:
            stock.stop()
    return [found[rid] for rid, _, _ in requests]


@dataclass
class GateRun:
    reports: list[GateReport]
    option_specs: dict   # the candidate's own definitions of the options it was forced with


def judge(root: Path, cfg: Config, gates: GatesSection, candidate_rev: str, options: dict,
          refs: list[Reference], check: str, device: str, log_dir: Path, *,
          default_gate: bool, forcing: bool, exact: bool = False,
          progress: Callable[[str], None] = lambda s: None) -> GateRun:
    """The option-default gate (every option at its default) and/or the token-forcing gate
    (at `options`) of `candidate_rev` against `refs`: each in its own worker on a clean
    checkout of the candidate's commit; the verdicts are computed here."""
    if not refs:
        raise SpecPilotError("no references to check against")
    co = clean_checkout(GitStore(root), candidate_rev, cfg.system_paths, root)
    model = cfg.model.path
    ctx = worker_context(model, [r.prompt_ids for r in refs], max(r.length for r in refs))
    runs = ([("default", {})] if default_gate else []) + ([("forcing", dict(options))]
                                                          if forcing else [])
    reports: list[GateReport] = []
    specs: dict = {}
    workers = [(name, opts, Worker(f"candidate ({name} gate)", co, cfg.system_paths, model,
                                   opts, device, log_dir / f"gate-{check}-{name}.log",
                                   worker_drafter(cfg), ctx, confine=cfg.judges.confine))
               for name, opts in runs]
    # on a CPU the second gate's worker starts (seconds of imports and model construction)
    # while the first gate runs; on CUDA each starts once the one before it has stopped
    together = device.startswith("cpu")
    # a gate's progress units: a forced pass and a generation per request (the default
    # gate: and its short generation)
    n = sum(bool(r.tokens) for r in refs)
    try:
        if together:
            for _name, _opts, worker in workers:
                worker.begin()
        for name, opts, worker in workers:
            if together:
                worker.finish()
            else:
                worker.start()
            engine = WorkerEngine(worker, Eta(f"{name} gate, step", (3 if name == "default"
                                                                     else 2) * n, progress))
            if name == "default":
                reports.append(option_default_gate(engine, refs, gates, check=check))
            else:
                reports.append(forcing_gate(engine, refs, gates, exact=exact, check=check))
                known = worker.call("registry", "registry")["registry"]
                specs = {n: known[n] for n in opts if n in known}
            worker.stop()
    finally:
        for _name, _opts, worker in workers:
            worker.stop()
    return GateRun(reports, specs)


def run_gate(root: Path, check: str, opts: dict, default_gate: bool, exact: bool,
             n_requests: int | None, length: int | None, candidate: str = "HEAD",
             base: str = "HEAD", device: str | None = None,
             progress: Callable[[str], None] = lambda s: None) -> GateReport:
    """`specpilot gate`: one gate of `candidate` against the references of `base`'s stock."""
    cfg = load_config(root)
    gates = cfg.gates
    if default_gate and opts:
        raise SpecPilotError("the option-default gate takes no --opt", code=2)
    length = length or (gates.dev_length if check == "dev" else gates.sealed_length)
    count = n_requests or (gates.dev_requests if check == "dev" else gates.sealed_requests)
    reqs = gate_requests(cfg.model.path, check, count)
    if not reqs:
        raise SpecPilotError("no requests to check")
    device = device or _default_device()
    logs = log_folder(root, check, time.strftime("gate-%Y%m%d-%H%M%S"))
    preflight(root, cfg, candidate, opts, logs)   # seconds; the references take minutes
    refs = stock_references(root, cfg, gates, base, reqs, length, device, logs / "stock.log",
                            check, progress)
    run = judge(root, cfg, gates, candidate, opts, refs, check, device, logs,
                default_gate=default_gate, forcing=not default_gate, exact=exact,
                progress=progress)
    return run.reports[0]


def preflight(root: Path, cfg: Config, rev: str, opts: dict, logs: Path,
              label: str = "candidate") -> None:
    """The cheap checks before any model loads: `rev` names a commit (its clean checkout
    is made, and cached, here) and its own registry accepts `opts`."""
    co = clean_checkout(GitStore(root), rev, cfg.system_paths, root)
    if opts:
        check_options(f"{label} options", co, cfg.system_paths, opts, logs / f"{label}-options.log",
                      confine=cfg.judges.confine)


def log_folder(root: Path, check: str, name: str) -> Path:
    """Where the workers of a check write their logs: .specpilot/runs/<name> for dev,
    beside the secret seed for sealed (a candidate that prints its sealed inputs prints
    them outside the repository)."""
    if check == "sealed":
        return logs_dir(name)
    return Path(root) / RUNS_DIR / name


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
