"""`specpilot analyze`: run dev requests, record lattices and a profile, report the factors.

Two passes over the same requests: one unprofiled (actual step times, lattices, tokens per
step, context lengths) and one under the profiler (time per kernel category). Bounds come
from specpilot/judges/costmodel.py with the hardware's peaks (specpilot/judges/hardware.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

from specpilot.judges import costmodel
from specpilot.judges.hardware import Hardware, for_device

SCHEMA_VERSION = 1
DIRECTIONS = {"tau": "drafting / tree verification (raise accepted tokens per step)",
              "kernel": "kernels (close the gap to the byte and FLOP bounds)",
              "overhead": "overhead (host work, launches, syncs, drafter between kernels)"}


class CategoryRow(BaseModel):
    category: str
    measured_ms: float      # per step, profiled
    bound_ms: float | None  # per step lower bound (kernel categories only)
    ratio: float | None


class Analysis(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    device: str
    hardware: Hardware
    dtype: str
    requests: list[str]
    steps: int
    tokens_per_step: float          # verified per step (pending + chain)
    mean_context: float
    actual_step_ms: float
    profiled_kernel_ms: float
    factors: dict[str, float]       # tau, kernel, overhead
    tau_best_budget: int
    tau_curve: dict[int, float]
    speedup_by_budget: dict[int, float]
    categories: list[CategoryRow]
    suggested: str
    direction: str


def analyze(root: Path | None, model: str, device: str | None, n_requests: int, max_new: int,
            drafter: str = "ngram", system=None, requests=None,
            hardware: Hardware | None = None,
            prompts: list[tuple[str, list[int]]] | None = None) -> Analysis:
    """`prompts` (id, token ids) replace `requests` where the system has no tokenizer
    (random test models); `system` may carry non-default options (the cycle's base)."""
    import torch

    from stock.lattice_log import LatticeRecorder
    from stock.profile import CATEGORIES, Profiler
    from specpilot.requests import load_dev, select
    from stock.system import load_system

    system = system or load_system(model, None, device)
    dev = str(system.device)
    hw = hardware or for_device(dev, root)
    dtype = "fp32" if system.engine.model.dtype == torch.float32 else "bf16"
    elt = 4 if dtype == "fp32" else 2
    peak = hw.peak_flops(dtype)
    if prompts is None:
        reqs = requests or select(load_dev(), None, max(1, -(-n_requests // 5)))[:n_requests]
        prompts = [(r.id, system.tokenizer.chat(r.prompt)) for r in reqs]
    engine = system.engine
    cfg = engine.model.cfg
    recorder = LatticeRecorder(engine.options["lattice_topk"])
    steps_t, decode_s, contexts, tokens_verified = 0, 0.0, [], []
    request_ids = [rid for rid, _ in prompts]
    prompts = [ids for _, ids in prompts]
    # Untimed first. Where steps replay CUDA graphs, a step's first use of a (T, KV) shape
    # captures a graph and, with stock's `compile` option, its first use of a T compiles the
    # layers (7-18 s a T on the 27B-class target, bench/NOTES.md): there every prompt runs
    # once at full length, so that the timed runs below meet no new shape. Elsewhere a short
    # run is enough.
    if engine.uses_graphs:
        for ids in prompts:
            engine.generate(ids, max_new, system.drafter(drafter))
    else:
        engine.generate(prompts[0], 4, system.drafter(drafter))
    for ids in prompts:
        first = len(recorder.steps)
        res = engine.generate(ids, max_new, system.drafter(drafter), recorder=recorder)
        decode_s += res.decode_s
        steps_t += res.steps
        ctx = len(ids)
        for step in recorder.steps[first:]:
            contexts.append(ctx)
            tokens_verified.append(len(step.lattice) + 1)
            ctx += step.accepted + 1
    if steps_t == 0:
        raise ValueError("no decode steps were run (max_new too small?)")
    profiler = Profiler(system.device)
    for ids in prompts:
        engine.generate(ids, max_new, system.drafter(drafter), profiler=profiler)
    report = profiler.report()
    per_step = report["per_step_ms"]
    mean_ctx = float(np.mean(contexts))
    mean_tokens = float(np.mean(tokens_verified))

    bounds = {c: 0.0 for c in costmodel.KERNELS}
    for t, c in zip(tokens_verified, contexts):
        for cat, b in costmodel.step_bound(cfg, t, c, elt, peak, hw.bandwidth).items():
            bounds[cat] += b / len(contexts)
    bounds_ms = {c: 1e3 * v for c, v in bounds.items()}
    kernel_ms = sum(per_step.get(c, 0.0) for c in costmodel.KERNELS)
    actual_ms = 1e3 * decode_s / steps_t
    kernel = costmodel.kernel_factor(per_step, bounds_ms)
    overhead = actual_ms / kernel_ms if kernel_ms > 0 else float("nan")

    def bound_of(tokens: int) -> float:
        return sum(costmodel.step_bound(cfg, tokens, round(mean_ctx), elt, peak,
                                        hw.bandwidth).values())

    lattice_steps = [(s.lattice.ids.numpy(), s.lattice.logprobs.numpy(), s.target)
                     for s in recorder.steps]
    current_tau = float(np.mean([s.accepted + 1 for s in recorder.steps]))
    tau = costmodel.tau_factor(lattice_steps, current_tau, mean_tokens, bound_of)
    factors = {"tau": tau.factor, "kernel": kernel, "overhead": overhead}
    best = max(factors, key=lambda k: factors[k] if np.isfinite(factors[k]) else -1)
    rows = [CategoryRow(category=c, measured_ms=per_step.get(c, 0.0),
                        bound_ms=bounds_ms.get(c),
                        ratio=(per_step.get(c, 0.0) / bounds_ms[c]
                               if bounds_ms.get(c) else None))
            for c in CATEGORIES if c != "prefill"]
    return Analysis(model=model, device=dev, hardware=hw, dtype=dtype,
                    requests=request_ids, steps=steps_t, tokens_per_step=mean_tokens,
                    mean_context=mean_ctx, actual_step_ms=actual_ms, profiled_kernel_ms=kernel_ms,
                    factors=factors, tau_best_budget=tau.best_budget, tau_curve=tau.curve,
                    speedup_by_budget=tau.speedup_by_budget, categories=rows, suggested=best,
                    direction=DIRECTIONS[best])
