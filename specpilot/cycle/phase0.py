"""Phase 0, bottleneck analysis: τ, kernel and overhead factors of the cycle's base system.

The judges' cost model (`specpilot analyze`, specpilot/costmodel.py) is the intended source;
until it lands, this computes the three factors directly from stock's profile and draft
lattices on a few dev requests, and says so in the report (`source`):

- τ factor: accepted tokens per step if the verifier checked every top-k alternative at
  every depth of the recorded lattices (an optimistic tree bound), over stock's accepted
  tokens per step;
- kernel factor: profiled step time over the weight-streaming lower bound (parameter bytes
  over measured copy bandwidth);
- overhead factor: measured step time over the sum of profiled kernel categories.
"""

from __future__ import annotations

import time

import torch


def _bandwidth_gbs(device: torch.device) -> float:
    x = torch.empty(32 * 1024 * 1024, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = time.perf_counter()
    for _ in range(3):
        y.copy_(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 3
    return 2 * x.numel() * 4 / dt / 1e9  # read + write


def _tree_accepts(steps) -> tuple[float, float]:
    """(mean accepted per step, mean accepted if every top-k alternative were verified)."""
    if not steps:
        return 1.0, 1.0
    actual = optimal = 0
    for s in steps:
        actual += s.accepted + 1
        n = 0
        ids = s.lattice.ids
        while n < len(ids) and n < len(s.target) - 1 and int(s.target[n]) in ids[n].tolist():
            n += 1
        optimal += n + 1
    return actual / len(steps), optimal / len(steps)


def analyze(model: str, requests: int = 2, max_new: int = 32, drafter: str = "ngram") -> dict:
    """The Phase 0 report of the project's own stock at default options."""
    from stock.lattice_log import LatticeRecorder
    from stock.options import Options
    from stock.profile import Profiler
    from stock.requests import load_dev, select
    from stock.system import load_system

    t0 = time.perf_counter()
    system = load_system(model, Options(), None, 2048)
    engine = system.engine
    reqs = select(load_dev(), None, 1)[:requests]
    recorder = LatticeRecorder(engine.options["lattice_topk"])
    profiler = Profiler(system.device)
    steps = decode_s = 0.0
    for req in reqs:
        ids = system.tokenizer.chat(req.prompt)[-1500:]
        res = engine.generate(ids, max_new, system.drafter(drafter), recorder, profiler)
        steps += res.steps
        decode_s += res.decode_s
    prof = profiler.report()
    actual, optimal = _tree_accepts(recorder.steps)
    step_ms = 1e3 * decode_s / max(steps, 1)
    kernel_ms = sum(v for k, v in prof["per_step_ms"].items() if k != "other")
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bw = _bandwidth_gbs(system.device)
    bound_ms = params / (bw * 1e9) * 1e3
    factors = {"tau": round(optimal / actual, 3),
               "kernel": round(max(kernel_ms, 1e-9) / bound_ms, 3),
               "overhead": round(step_ms / max(kernel_ms, 1e-9), 3)}
    return {
        "schema_version": 1,
        "source": "cycle/phase0 (stock profile + lattices; costmodel.py not available)",
        "model": model, "device": str(system.device), "drafter": drafter,
        "requests": [r.id for r in reqs], "max_new": max_new,
        "accepted_per_step": round(actual, 3), "tree_bound_per_step": round(optimal, 3),
        "step_ms": round(step_ms, 3), "profile_per_step_ms": prof["per_step_ms"],
        "weight_bytes": params, "copy_bandwidth_gbs": round(bw, 2),
        "weight_bound_ms": round(bound_ms, 3), "factors": factors,
        "largest": max(factors, key=factors.get), "seconds": round(time.perf_counter() - t0, 1),
    }
