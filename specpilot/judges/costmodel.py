"""The cost model: where is the gap between this system and the hardware's limits?

Three factors, each >= 1 in principle, whose product bounds the possible speedup:

- τ factor: accepted tokens per step of the best-first draft tree at the best node budget,
  over the current system's accepted tokens per step. Exact where the measurement carries
  teacher-forced lattices (the drafter's lattice at every position of the greedy output):
  the whole decode loop is simulated with each tree (specpilot/judges/tau.py), scored
  against the output, which is the target's continuation everywhere; the chain of
  draft_len is simulated the same way and is the current system (`tau_factor_exact`).
  Otherwise (`tau_factor`), trees are re-scored on the lattices of the chain run's steps:
  nodes are paths through the per-position top-k alternatives, ranked by cumulative path
  log-probability; a path is accepted node by node where it equals the target's token,
  ancestor-only (the target's choice after a token is known only along the verified
  chain, so a path may leave the chain only at its last accepted node), and each step
  starts where the chain's did: conservative, and blind to where a tree's steps would
  start. The best budget B maximises τ(B) / step_bound(tokens verified at B).
- kernel factor: profiled time of the step's kernels (gemm, attention, recurrent) over the
  sum of their lower bounds; a kernel's bound is max(FLOPs / (0.6 peak), bytes / (0.9 BW)),
  from the model's shapes, tokens verified and context length.
- overhead factor: actual (unprofiled) step time over the profiled kernel time: host work,
  launches, the drafter and everything between kernels.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from specpilot.judges import tau as exact

COMPUTE_EFF = 0.6
BANDWIDTH_EFF = 0.9
KERNELS = ("gemm", "attention", "recurrent")
BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128)   # chain-trace estimate: draft paths, root not counted
CHAIN = 0                                  # the exact curve's key for the chain (top-1)
TREE_BUDGETS = (8, 16, 32, 64)             # exact: nodes per step, the root included


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float

    def bound(self, peak_flops: float, bandwidth: float) -> float:
        return max(self.flops / (COMPUTE_EFF * peak_flops), self.bytes / (BANDWIDTH_EFF * bandwidth))


def _linears(cfg, kind: str) -> list[tuple[int, int]]:
    """(in, out) of one layer's matrices: a full-attention layer (its q_proj doubled by an
    output gate) or a GDN layer, then the MLP."""
    h, hkv, d, hid, inter = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size,
                             cfg.intermediate_size)
    mlp = [(hid, inter), (hid, inter), (inter, hid)]
    if kind == "linear_attention":
        conv = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim \
            + cfg.linear_num_value_heads * cfg.linear_value_head_dim
        hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        return [(hid, conv), (hid, hv * dv), (hid, hv), (hid, hv), (hv * dv, hid)] + mlp
    q = h * d * (2 if getattr(cfg, "attn_output_gate", False) else 1)
    return [(hid, q), (hid, hkv * d), (hid, hkv * d), (h * d, hid)] + mlp


def step_work(cfg, tokens: int, context: int, elt_bytes: int) -> dict[str, Work]:
    """FLOPs and bytes of one verification step of `tokens` tokens after `context` cached
    tokens, batch 1, per kernel category: dense Llama / Qwen3 decoders, and hybrid targets
    whose GDN layers read and write their fp32 recurrent state [Hv, Dk, Dv] and conv window
    once a step (`recurrent`; about 7 Dk Dv FLOPs per value head and token)."""
    h, hkv, d, hid = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    kinds = [getattr(cfg, "layer_type", lambda i: "full_attention")(i)
             for i in range(cfg.num_layers)]
    params = acts = 0
    for kind in kinds:
        lin = _linears(cfg, kind)
        params += sum(i * o for i, o in lin)
        acts += sum(i + o for i, o in lin) * tokens
    head = hid * cfg.vocab_size
    gemm = Work(2.0 * tokens * (params + head),
                elt_bytes * (params + head + acts + tokens * (hid + cfg.vocab_size)))
    seen = context + tokens
    n = kinds.count("full_attention")
    attention = Work(n * 4.0 * h * d * tokens * seen,
                     n * elt_bytes * (2 * hkv * d * (seen + tokens) + 2 * h * d * tokens))
    m = kinds.count("linear_attention")
    recurrent = Work(0.0, 0.0)
    if m:
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv = 2 * cfg.linear_num_key_heads * dk + hv * dv
        k = cfg.linear_conv_kernel
        recurrent = Work(m * tokens * (7.0 * hv * dk * dv + 2.0 * conv * k),
                         m * (2 * 4 * hv * dk * dv + elt_bytes * conv * (2 * (k - 1) + k)))
    return {"gemm": gemm, "attention": attention, "recurrent": recurrent}


def step_bound(cfg, tokens: int, context: int, elt_bytes: int, peak_flops: float,
               bandwidth: float) -> dict[str, float]:
    return {c: w.bound(peak_flops, bandwidth)
            for c, w in step_work(cfg, tokens, context, elt_bytes).items()}


# -- τ from a chain run's lattices (ancestor-only; without teacher-forced lattices) ----------

def best_first_tree(logprobs: np.ndarray, budget: int) -> set[tuple[int, ...]]:
    """The `budget` paths of highest cumulative log-probability; paths index alternatives
    per depth. logprobs [n, K] (-inf pads). Ancestor-closed because log-probs are <= 0."""
    n = logprobs.shape[0]
    tree: set[tuple[int, ...]] = set()
    heap = [(-float(logprobs[0, i]), (i,)) for i in range(logprobs.shape[1])
            if n and math.isfinite(logprobs[0, i])]
    heapq.heapify(heap)
    while heap and len(tree) < budget:
        neg, path = heapq.heappop(heap)
        tree.add(path)
        depth = len(path)
        if depth < n:
            for i in range(logprobs.shape[1]):
                if math.isfinite(logprobs[depth, i]):
                    heapq.heappush(heap, (neg - float(logprobs[depth, i]), path + (i,)))
    return tree


def accepted_on_tree(ids: np.ndarray, tree: set[tuple[int, ...]], target: list[int]) -> int:
    """Tokens gained in one step with this tree (bonus included), ancestor-only."""
    path: tuple[int, ...] = ()
    gained = 0
    for depth in range(ids.shape[0]):
        if depth >= len(target):
            break
        hits = [i for i in range(ids.shape[1]) if ids[depth, i] == target[depth]]
        if not hits or path + (hits[0],) not in tree:
            break
        path += (hits[0],)
        gained += 1
        if hits[0] != 0:  # left the verified chain: the target's next choice is unknown
            break
    return gained + 1


def tau_curve(steps, budgets=BUDGETS) -> dict[int, float]:
    """Mean tokens per step of the best-first tree at each budget, over recorded steps.
    `steps`: (ids [n, K], logprobs [n, K], target list) per step."""
    totals = {b: 0 for b in budgets}
    count = 0
    for ids, lps, target in steps:
        count += 1
        if ids.shape[0] == 0:
            for b in budgets:
                totals[b] += 1
            continue
        tree = best_first_tree(lps, max(budgets))
        ranked = sorted(tree, key=lambda p: -sum(float(lps[j, i]) for j, i in enumerate(p)))
        for b in budgets:
            totals[b] += accepted_on_tree(ids, set(ranked[:b]), target)
    return {b: totals[b] / max(count, 1) for b in budgets}


@dataclass
class TauResult:
    current_tau: float
    best_budget: int
    best_tau: float
    factor: float
    curve: dict[int, float]
    speedup_by_budget: dict[int, float]  # τ(B)/bound(B) over τ_cur/bound(current)
    method: str = "ancestor-only"        # or "exact" (the decode simulated, tau.py)
    decodes: dict[int, exact.Decode] = field(default_factory=dict)   # exact: per curve key


def tau_factor(steps, current_tau: float, current_tokens: float, bound_of) -> TauResult:
    """bound_of(tokens) -> step lower bound in seconds; picks B maximising τ(B)/bound."""
    curve = tau_curve(steps)
    base = current_tau / bound_of(max(1, round(current_tokens)))
    speed = {b: (curve[b] / bound_of(b + 1)) / base for b in curve}
    best = max(speed, key=lambda b: speed[b])
    return TauResult(current_tau, best, curve[best], curve[best] / current_tau, curve, speed)


def tau_factor_exact(forced, draft_len: int, bound_of, tree_depth: int | None = None,
                     budgets=TREE_BUDGETS, current_tau: float | None = None) -> TauResult:
    """The τ factor from decodes simulated over teacher-forced lattices (tau.py): the chain
    of `draft_len` (curve key CHAIN) and best-first trees of each budget in nodes (the root
    included) at most `tree_depth` deep (default: the lattices' depth). `forced` =
    [(lattices, output), ...] per request. Each mode's step is bounded at the nodes it
    verifies per step on average; the best mode maximises τ / bound (ties: the chain, then
    the smaller budget), and the factor is its τ over the current system's: `current_tau`,
    the τ it measured (a system already verifying trees is not the chain), else the
    simulated chain's."""
    decodes = {CHAIN: exact.simulate_requests(forced, None, draft_len)}
    for b in budgets:
        decodes[b] = exact.simulate_requests(forced, b, tree_depth)
    curve = {b: d.tau for b, d in decodes.items()}
    rate = {b: curve[b] / bound_of(max(1, round(d.nodes_per_step))) for b, d in decodes.items()}
    speed = {b: rate[b] / rate[CHAIN] for b in rate}
    best = max(speed, key=lambda b: speed[b])
    cur = curve[CHAIN] if current_tau is None else current_tau
    return TauResult(cur, best, curve[best], curve[best] / cur if cur else float("nan"), curve,
                     speed, "exact", decodes)


def kernel_factor(measured: dict[str, float], bounds: dict[str, float]) -> float:
    m = sum(measured.get(c, 0.0) for c in KERNELS)
    b = sum(bounds.get(c, 0.0) for c in KERNELS)
    return m / b if b > 0 else float("nan")


FACTORS = ("tau", "kernel", "overhead")


def ceiling(factors: dict) -> float | None:
    """The largest speedup the cost model allows over the system it analysed: the product of
    its factors (each at least 1: a factor below 1 is noise, not a slowdown to make up).
    None when a factor is unknown (null, NaN or missing): then there is no ceiling."""
    product = 1.0
    for name in FACTORS:
        f = (factors or {}).get(name)
        if f is None or not math.isfinite(f) or f <= 0:
            return None
        product *= max(1.0, f)
    return product


def implausible(gain: float, factors: dict, margin: float) -> str | None:
    """Why a measured gain (t_A / t_B - 1) cannot be a real speedup, or None: above the
    cost model's ceiling times `margin` it is a measurement fault (a cache of outputs, a
    timer that misses work, a wrong system measured), whatever the statistics say."""
    top = ceiling(factors)
    if top is None or 1.0 + gain <= top * margin:
        return None
    return (f"implausible: gain ×{1.0 + gain:.3g} exceeds the cost model's ceiling "
            f"×{top:.3g} (τ {factors['tau']:.2f} × kernel {factors['kernel']:.2f} × overhead "
            f"{factors['overhead']:.2f}, margin {margin:g}); rejected as a measurement fault")
