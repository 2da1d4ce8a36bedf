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


class Base:
    """The project's own stock at default options, with dev prompts as token ids. Supports
    `random:<preset>` models (tests) with random token prompts."""

    def __init__(self, model: str, max_context: int = 2048):
        from stock.engine import Engine
        from stock.options import Options

        if model.startswith("random:"):
            import random

            from stock.config import PRESETS
            from stock.model import Transformer

            rng = random.Random(0)
            self.engine = Engine(Transformer.random(PRESETS[model[7:]]), Options(),
                                 max_context, set())
            self.prompts = [("rand-%d" % i, [rng.randrange(1, 256) for _ in range(16)])
                            for i in range(8)]
            self.device = torch.device("cpu")
        else:
            from stock.requests import load_dev, select
            from stock.system import load_system

            system = load_system(model, Options(), None, max_context)
            self.engine, self.device = system.engine, system.device
            self.prompts = [(r.id, system.tokenizer.chat(r.prompt)[-1024:])
                            for r in select(load_dev(), None, 1)]

    def engine_with(self, options: dict):
        from stock.engine import Engine
        from stock.options import Options

        e = self.engine
        return Engine(e.model, Options(options), e.max_context, e.stop_ids)

    def drafter(self, name: str, engine):
        from stock.system import make_drafter

        return make_drafter(name, engine)


def analyze(model: str, requests: int = 2, max_new: int = 32, drafter: str = "ngram") -> dict:
    """The Phase 0 report of the project's own stock at default options."""
    from stock.lattice_log import LatticeRecorder
    from stock.profile import Profiler

    t0 = time.perf_counter()
    base = Base(model)
    engine = base.engine
    recorder = LatticeRecorder(engine.options["lattice_topk"])
    profiler = Profiler(base.device)
    steps = decode_s = 0.0
    reqs = base.prompts[:requests]
    for _rid, ids in reqs:
        res = engine.generate(ids, max_new, base.drafter(drafter, engine), recorder, profiler)
        steps += res.steps
        decode_s += res.decode_s
    prof = profiler.report()
    actual, optimal = _tree_accepts(recorder.steps)
    step_ms = 1e3 * decode_s / max(steps, 1)
    kernel_ms = sum(v for k, v in prof["per_step_ms"].items() if k != "other")
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    bw = _bandwidth_gbs(base.device)
    bound_ms = params / (bw * 1e9) * 1e3
    factors = {"tau": round(optimal / actual, 3),
               "kernel": round(max(kernel_ms, 1e-9) / bound_ms, 3),
               "overhead": round(step_ms / max(kernel_ms, 1e-9), 3)}
    return {
        "schema_version": 1,
        "source": "cycle/phase0 (stock profile + lattices; costmodel.py not available)",
        "model": model, "device": str(base.device), "drafter": drafter,
        "requests": [r[0] for r in reqs], "max_new": max_new,
        "accepted_per_step": round(actual, 3), "tree_bound_per_step": round(optimal, 3),
        "step_ms": round(step_ms, 3), "profile_per_step_ms": prof["per_step_ms"],
        "weight_bytes": params, "copy_bandwidth_gbs": round(bw, 2),
        "weight_bound_ms": round(bound_ms, 3), "factors": factors,
        "largest": max(factors, key=factors.get), "seconds": round(time.perf_counter() - t0, 1),
    }
