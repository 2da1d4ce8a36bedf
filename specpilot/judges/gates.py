"""Run a correctness gate: stock's references from a clean checkout of the base commit, the
candidate forced in its own worker from a clean checkout of its commit (worker_proc.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.config import load_config
from specpilot.errors import SpecPilotError
from specpilot.judges.forcing import (GateReport, Reference, ReferenceCache, forcing_gate,
                               option_default_gate)
from specpilot.gitstore import GitStore
from specpilot.judges.worker_proc import Worker, clean_checkout

RUNS_DIR = Path(".specpilot") / "runs"


def check_requests(check: str, count: int):
    from specpilot.requests import load_dev, load_jsonl, spread
    from specpilot.requests.sealed import ensure_sealed

    reqs = load_dev() if check == "dev" else load_jsonl(ensure_sealed())
    return spread(reqs, count)


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

    def __init__(self, worker: Worker):
        self.worker = worker
        self.options = _Opts(worker.ready["options"], worker.ready.get("non_default", {}))
        self._n = 0

    def _id(self) -> str:
        self._n += 1
        return f"q{self._n}"

    def force(self, prompt, forced, chunk=None, digests=False) -> _Forced:
        rep = self.worker.call("force", self._id(), ids=list(prompt), forced=list(forced),
                               chunk=chunk, digests=digests)
        return _Forced(rep["argmax"], rep["margin"], list(forced), rep.get("digests", []))

    def generate(self, prompt, max_new, drafter=None) -> _Gen:  # the worker's own drafter
        return _Gen(self.worker.run(self._id(), max_new, ids=list(prompt)).tokens)


def run_gate(root: Path, check: str, opts: dict, default_gate: bool, exact: bool,
             n_requests: int | None, length: int | None, candidate: str = "HEAD",
             base: str = "HEAD", device: str | None = None) -> GateReport:
    cfg = load_config(root)
    gates = cfg.gates
    if default_gate and opts:
        raise SpecPilotError("the option-default gate takes no --opt", code=2)
    length = length or (gates.dev_length if check == "dev" else gates.sealed_length)
    count = n_requests or (gates.dev_requests if check == "dev" else gates.sealed_requests)
    reqs = check_requests(check, count)
    if not reqs:
        raise SpecPilotError("no requests to check")
    device = device or _default_device()
    store = GitStore(root)
    co_base = clean_checkout(store, base, cfg.system_paths, root)
    co_cand = clean_checkout(store, candidate, cfg.system_paths, root)
    ctx = max(len(r.prompt) for r in reqs) + length + 64  # characters bound tokens
    logs = root / RUNS_DIR / time.strftime("gate-%Y%m%d-%H%M%S")
    cache = ReferenceCache(root)
    model = cfg.model.path

    refs: list[Reference] = []
    stock = Worker("stock", co_base, cfg.system_paths, model, {}, device, logs / "stock.log",
                   "ngram", ctx, cfg.judges.confine)
    try:
        stock.start()
        for req in reqs:
            ref = cache.get(model, co_base.tree, req.id, length)
            if ref is None:
                ids = stock.call("tokenize", req.id, prompt=req.prompt)["ids"]
                rep = stock.call("reference", req.id, ids=ids, length=length,
                                 draft_len=gates.reference_draft_len, chunk=gates.chunk)
                ref = Reference(model=model, stock_tree=co_base.tree, request_id=req.id,
                                length=length, prompt_ids=ids, tokens=rep["tokens"],
                                stop_reason=rep["stop_reason"], chunk=gates.chunk,
                                argmax=rep["argmax"], margins=rep["margin"],
                                digests=rep["digests"])
                cache.put(ref)
            refs.append(ref)
    finally:
        stock.stop()
    cand = Worker("candidate", co_cand, cfg.system_paths, model, dict(opts), device,
                  logs / "candidate.log", "ngram", ctx, cfg.judges.confine)
    try:
        cand.start()
        engine = WorkerEngine(cand)
        if default_gate:
            return option_default_gate(engine, refs, gates, check=check)
        return forcing_gate(engine, refs, gates, exact=exact, check=check)
    finally:
        cand.stop()


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
