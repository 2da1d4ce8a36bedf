"""`specpilot analyze`: run dev requests, record lattices and a profile, report the factors.

Passes over the same requests (`worker_main.measure`, in the system's process): one timed
on the controller's path (actual step times, tokens gained per step, context lengths), one
recorded (lattices, tokens verified per step; the timed one itself where no CUDA graphs run,
none where the system refuses lattice logs) and one under the profiler (time per kernel
category). The factors are computed from those measurements here
(`report`); bounds come from specpilot/judges/costmodel.py with the hardware's peaks
(specpilot/judges/hardware.py). The τ factor is exact where the measurement carries each
prompt's teacher-forced lattices (worker_main.teacher_forced, with a drafter): decodes with
the chain and with trees of each budget are simulated over them (judges/tau.py), and
`tau_rows` reports each one's predicted τ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel

from specpilot.judges import costmodel
from specpilot.judges.hardware import Hardware, for_device
from specpilot.judges.worker_main import measure
from specpilot.requests import load_dev, select

SCHEMA_VERSION = 2   # 2: tau_method, tau_measured, tau_rows; exact curve keys are nodes
DIRECTIONS = {"tau": "drafting / tree verification (raise accepted tokens per step)",
              "kernel": "kernels (close the gap to the byte and FLOP bounds)",
              "overhead": "overhead (host work, launches, syncs, drafter between kernels)"}


class CategoryRow(BaseModel):
    category: str
    measured_ms: float      # per step, profiled
    bound_ms: float | None  # per step lower bound (kernel categories only)
    ratio: float | None


class TauRow(BaseModel):
    """One decode mode simulated over the teacher-forced lattices (exact τ)."""

    mode: str              # "chain" (top-1, draft_len deep) or "tree" (best-first)
    budget: int            # nodes per step at most, the root (pending token) included
    max_depth: int         # draft levels at most
    tau: float             # predicted tokens per step, bonus included
    steps: int
    nodes_per_step: float  # verified per step on average
    speedup: float         # τ / step bound, over the chain's


class Analysis(BaseModel):
    schema_version: int = SCHEMA_VERSION
    model: str
    device: str
    drafter: str = ""               # the drafter measured ("auto" resolved; "" in old records)
    hardware: Hardware
    dtype: str
    requests: list[str]
    steps: int
    tokens_per_step: float | None   # verified per step (pending + chain); None: not recorded
    mean_context: float
    actual_step_ms: float
    profiled_kernel_ms: float
    factors: dict[str, float | None]  # tau, kernel, overhead; None: not computable
    # "timed": the profile ran the timed path; "eager": the timed steps replay CUDA graphs
    # and the profile ran the same static forward eagerly, so its region times are eager
    # wall times (launch-bound on a small model), and the kernel and overhead factors
    # built from them are left unknown
    profile_path: str = "timed"
    tau_method: str                 # "exact" (simulated decodes) or "ancestor-only"
    tau_measured: float             # tokens per step of the measured (chain) run
    # exact: keys are costmodel.CHAIN (0) and tree budgets in nodes, the root included;
    # ancestor-only: draft paths per step (costmodel.BUDGETS)
    tau_best_budget: int
    tau_curve: dict[int, float]
    speedup_by_budget: dict[int, float]
    tau_rows: list[TauRow] = []     # exact only: the chain and trees of TREE_BUDGETS nodes
    categories: list[CategoryRow]
    suggested: str
    direction: str


def analyze(root: Path | None, model: str, device: str | None, n_requests: int, max_new: int,
            drafter: str = "ngram", system=None, requests=None,
            hardware: Hardware | None = None,
            prompts: list[tuple[str, list[int]]] | None = None, opts=(),
            opts_file: str | None = None) -> Analysis:
    """`specpilot analyze` in this process. `prompts` (id, token ids) replace `requests`
    where the system has no tokenizer (random test models); `system` may carry non-default
    options; else `opts` (NAME=VALUE) and `opts_file` set them, as for `specpilot run`. The
    cycle measures in a worker instead (cycle/judges.analyze) and computes the same report
    with `report()`."""
    # lazy: stock.system imports torch (seconds); only the in-process analysis needs it
    from stock import options as stock_options, system as stock_system

    system = system or stock_system.load_system(
        model, stock_options.resolve(list(opts), opts_file), device)
    if prompts is None:
        reqs = requests or select(load_dev(), None, max(1, -(-n_requests // 5)))[:n_requests]
        prompts = [(r.id, system.tokenizer.chat(r.prompt)) for r in reqs]
    measured = measure(system.engine, system.drafter(drafter), [ids for _, ids in prompts],
                       max_new)
    hw = hardware or for_device(str(system.device), root)
    return report(measured, model, hw, [rid for rid, _ in prompts])


def report(measured: dict, model: str, hw: Hardware, request_ids: list[str]) -> Analysis:
    """The cost model's factors from a system's measurements (worker_main.measure): its
    lattices, step times and profile, its model's shapes and the hardware's ceilings."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(**measured["model_cfg"])
    dtype = measured["dtype"]
    elt = 4 if dtype == "fp32" else 2
    peak = hw.peak_flops(dtype)
    topk = measured["topk"]
    steps_t, decode_s, contexts, tokens_verified, lattice_steps = 0, 0.0, [], [], []
    accepted = []
    for run in measured["runs"]:
        decode_s += run["decode_s"]
        steps_t += run["steps"]
        ctx = run["prompt_len"]
        # tokens gained per timed step (bonus included); a measurement without them (older
        # workers) has them on its recorded steps, which were the timed ones
        gained = run.get("accepted") or [s["accepted"] + 1 for s in run["lattices"]]
        for g in gained:
            contexts.append(ctx)
            ctx += g
            accepted.append(g)
        for step in run["lattices"]:
            tokens_verified.append(len(step["ids"]) + 1)
            lattice_steps.append((np.array(step["ids"], dtype=np.int64).reshape(-1, topk),
                                  np.array(step["logprobs"], dtype=np.float32).reshape(-1, topk),
                                  step["target"]))
    if steps_t == 0:
        raise ValueError("no decode steps were run (max_new too small?)")
    per_step = measured["profile"]["per_step_ms"]
    mean_ctx = float(np.mean(contexts))
    # tokens verified per step: known from the recorded (chain) steps only; a system that
    # refuses recording (a tree) leaves it, the kernels' bounds and the kernel factor unknown
    mean_tokens = float(np.mean(tokens_verified)) if tokens_verified else None
    per_token = (tokens_verified if len(tokens_verified) == len(contexts)
                 else [round(mean_tokens)] * len(contexts) if mean_tokens else [])

    bounds = {c: 0.0 for c in costmodel.KERNELS}
    for t, c in zip(per_token, contexts):
        for cat, b in costmodel.step_bound(cfg, t, c, elt, peak, hw.bandwidth).items():
            bounds[cat] += b / len(contexts)
    bounds_ms = {c: 1e3 * v for c, v in bounds.items()} if per_token else {}
    kernel_ms = sum(per_step.get(c, 0.0) for c in costmodel.KERNELS)
    actual_ms = 1e3 * decode_s / steps_t
    kernel = costmodel.kernel_factor(per_step, bounds_ms) if per_token else None
    overhead = actual_ms / kernel_ms if kernel_ms > 0 else float("nan")
    profile_path = measured.get("profile_path", "timed")
    if profile_path == "eager":   # H200, embedded default: kernel 287x, overhead 0.11
        kernel = overhead = None

    def bound_of(tokens: int) -> float:
        return sum(costmodel.step_bound(cfg, tokens, round(mean_ctx), elt, peak,
                                        hw.bandwidth).values())

    current_tau = float(np.mean(accepted))
    forced = [run.get("forced") for run in measured["runs"]]
    rows: list[TauRow] = []
    if forced and all(forced):
        draft_len = measured["draft_len"]
        tau = costmodel.tau_factor_exact([(f["lattices"], f["output"]) for f in forced],
                                         draft_len, bound_of, current_tau=current_tau)
        depth = min(f["depth"] for f in forced)
        rows = [TauRow(mode="chain" if b == costmodel.CHAIN else "tree",
                       budget=draft_len + 1 if b == costmodel.CHAIN else b,
                       max_depth=draft_len if b == costmodel.CHAIN else depth,
                       tau=d.tau, steps=d.steps, nodes_per_step=d.nodes_per_step,
                       speedup=tau.speedup_by_budget[b]) for b, d in tau.decodes.items()]
    elif mean_tokens is None:
        raise ValueError("the system refused lattice recording and no teacher-forced lattices "
                         "were measured (no drafter?): the τ factor has nothing to go on")
    else:
        tau = costmodel.tau_factor(lattice_steps, current_tau, mean_tokens, bound_of)
    factors = {"tau": tau.factor, "kernel": kernel, "overhead": overhead}
    best = max(factors, key=lambda k: factors[k] if factors[k] is not None
               and np.isfinite(factors[k]) else -1)
    cats = [CategoryRow(category=c, measured_ms=per_step.get(c, 0.0),
                        bound_ms=bounds_ms.get(c),
                        ratio=(per_step.get(c, 0.0) / bounds_ms[c]
                               if bounds_ms.get(c) else None))
            for c in per_step]   # the profiler's categories in its order, prefill left out
    return Analysis(model=model, device=measured["device"],
                    drafter=measured.get("drafter", ""), hardware=hw, dtype=dtype,
                    requests=request_ids, steps=steps_t, tokens_per_step=mean_tokens,
                    mean_context=mean_ctx, actual_step_ms=actual_ms, profiled_kernel_ms=kernel_ms,
                    factors=factors, profile_path=profile_path, tau_method=tau.method,
                    tau_measured=current_tau,
                    tau_best_budget=tau.best_budget, tau_curve=tau.curve,
                    speedup_by_budget=tau.speedup_by_budget, tau_rows=rows, categories=cats,
                    suggested=best,
                    direction=DIRECTIONS[best])
