"""Run a correctness gate of this tree's system against stock's cached references."""

from __future__ import annotations

from pathlib import Path

from specpilot.config import load_config
from specpilot.errors import SpecPilotError
from specpilot.forcing import (GateReport, ReferenceCache, forcing_gate, option_default_gate,
                               references, stock_tree_of)


def check_requests(check: str, count: int):
    from stock.requests import load_dev, load_jsonl, select
    from stock.sealed import ensure_sealed

    reqs = load_dev() if check == "dev" else load_jsonl(ensure_sealed())
    return select(reqs, None, max(1, -(-count // 5)))[:count]


def run_gate(root: Path, check: str, opts: dict, default_gate: bool, exact: bool,
             n_requests: int | None, length: int | None) -> GateReport:
    from stock.engine import Engine
    from stock.options import Options
    from stock.system import load_system

    cfg = load_config(root)
    gates = cfg.gates
    if default_gate and opts:
        raise SpecPilotError("the option-default gate takes no --opt", code=2)
    length = length or (gates.dev_length if check == "dev" else gates.sealed_length)
    count = n_requests or (gates.dev_requests if check == "dev" else gates.sealed_requests)
    reqs = check_requests(check, count)
    if not reqs:
        raise SpecPilotError("no requests to check")
    longest = max(len(r.prompt) for r in reqs)  # characters bound tokens from above
    stock_sys = load_system(cfg.model.path, Options(), "cpu" if _cpu() else None,
                            longest + length + 64)
    refs = references(stock_sys, reqs, length, ReferenceCache(root), cfg.model.path,
                      stock_tree_of(system_paths=cfg.system_paths), gates)
    candidate = Engine(stock_sys.engine.model, Options(opts), stock_sys.engine.max_context,
                       stock_sys.engine.stop_ids)
    if default_gate:
        return option_default_gate(candidate, refs, gates, check=check)
    return forcing_gate(candidate, refs, gates, exact=exact, check=check)


def _cpu() -> bool:
    import torch

    return not torch.cuda.is_available()
