"""Phase 3, kernel tuning of the integrated system (the cycle's best after Phase 2).

1. Profile it with the judges' cost model (`specpilot analyze` on its clean checkout; Phase
   0's report when the best is still the base, since that is the same system).
2. Rank the kernel categories that have a lower bound by their distance from it (profiled
   ms per step over the byte/FLOP bound), worst first.
3. For each of the worst `[explore] kernel_categories`: autotune the configurations of the
   registered options that act on the category (named in `[explore] kernel_options`, or
   whose name or help names the category) by successive halving in one worker on the
   system's checkout (cycle/search.halving); a configuration whose estimated gain reaches
   the pre-screen bar goes through the dev forcing gate and the controller against the
   current best, and becomes the best if adopted.
4. With a coding backend (`[explore] backend`: Claude with a key, or the command backend),
   the worst category is handed to a sub-agent for a code change, judged like any Phase 1 direction but starting from the integrated
   system (its entry depends on the entries that system is made of).
Everything tried and its outcome is in the run record's `kernel_tuning`.
"""

from __future__ import annotations

import re

from specpilot.cycle import judges
from specpilot.cycle.context import CycleContext
from specpilot.cycle.pipeline import run_direction
from specpilot.cycle.planning import coding_backend
from specpilot.cycle.search import default_values
from specpilot.cycle.state import DirectionState
from specpilot.cycle.types import Direction, System, options_text

WORDS = {"gemm": ("gemm", "matmul", "linear", "w12", "weight"),
         "attention": ("attention", "attn", "sdpa", "kv"),
         "recurrent": ("recurrent", "gdn", "deltanet", "delta_net")}


def rank(analysis: dict) -> list[dict]:
    """Categories with a bound, by measured / bound, worst first."""
    rows = [r for r in analysis.get("categories", [])
            if r.get("bound_ms") and r.get("ratio") is not None]
    return sorted(({"category": r["category"], "measured_ms": r["measured_ms"],
                    "bound_ms": r["bound_ms"], "over_bound": r["ratio"]} for r in rows),
                  key=lambda r: -r["over_bound"])


def options_for(category: str, registry: dict, declared: dict[str, list[str]],
                device: str | None = None) -> list[str]:
    """Registered options that act on `category`: declared ones first, then by name/help,
    leaving out those that say they change nothing on `device`'s type (a CUDA-only option
    on the CPU: trying it there only measures noise)."""
    names = [n for n in declared.get(category, []) if n in registry]
    words = WORDS.get(category, (category,))
    kind = device.split(":")[0] if device else None
    for name, spec in registry.items():
        text = f"{name} {spec.get('help', '')}".lower()
        idle = kind is not None and spec.get("devices") and kind not in spec["devices"]
        if name not in names and "test only" not in text and not idle and \
                any(re.search(rf"\b{re.escape(w)}", text) for w in words):
            names.append(name)
    return names


def values_for(spec: dict, current) -> list[str]:
    """Values to try besides the current one: other choices, the flipped bool, ints around."""
    if spec.get("choices"):
        return [str(c) for c in spec["choices"] if str(c) != str(current)]
    typ = spec.get("type")
    if typ == "bool":
        on = str(current).strip().lower() in ("1", "true", "yes", "on")
        return [str(not on).lower()]
    if typ == "int":
        try:
            return default_values("", int(str(current)), 8, spec.get("min"), spec.get("max"))
        except ValueError:
            return []
    return []


def configs_for(names: list[str], registry: dict, options: dict, limit: int) -> list[dict]:
    out = []
    for name in names:
        current = options.get(name, registry[name]["default"])
        out += [{name: v} for v in values_for(registry[name], current)]
    return out[:limit]


def best_entries(state) -> list[str]:
    """The memory entries the cycle's best system is made of (dependencies for Phase 3)."""
    integ = state.integration or {}
    if integ.get("entry") and state.best.commit == (integ.get("system") or {}).get("commit"):
        return [integ["entry"]]
    return [d.entry for d in state.directions
            if d.entry and d.candidate and d.candidate.commit == state.best.commit][:1]


def tune_kernels(ctx: CycleContext) -> None:
    state, ex = ctx.state, ctx.ex
    rec: dict = {"system": state.best.model_dump(), "categories": [], "agent": None}
    state.kernel_tuning = rec
    log_dir = ctx.runs.log_dir("tune-kernels")
    if state.best == state.base and state.analysis:
        analysis, rec["profile"] = state.analysis, "phase 0 report (the same system)"
    else:
        ctx.progress("tune-kernels", "cost model on the integrated system")
        analysis = judges.analyze(ctx.root, ctx.cfg, state.best, ex.analyze_requests,
                                  ex.analyze_max_new, log_dir)
        rec["profile"] = "cost model on the integrated system"
        rec["analysis"] = analysis
    rec["ranking"] = ranking = rank(analysis)
    registry = analysis.get("registered_options") or {}
    tuned: set[str] = set()
    for row in ranking[:ex.kernel_categories]:
        cat = row["category"]
        names = [n for n in options_for(cat, registry, ex.kernel_options,
                                        analysis.get("device")) if n not in tuned]
        tuned.update(names)
        entry = {"category": cat, "over_bound": row["over_bound"], "options": names}
        rec["categories"].append(entry)
        configs = configs_for(names, registry, state.best.options, ex.kernel_configs)
        if not configs:
            entry["result"] = f"no registered option acts on {cat}"
            ctx.save()
            continue
        _autotune(ctx, entry, configs, log_dir)
        ctx.save()
    coding = coding_backend(ex, ctx.client)
    if ranking and coding:
        rec["agent"] = _agent(ctx, ranking[0], coding)
    elif ranking:
        rec["agent"] = {"result": "skipped: code changes need an agent (ANTHROPIC_API_KEY, "
                                  "or [explore] backend = \"command\")"}
    worst = ", ".join(f"{r['category']} {r['over_bound']:.1f}x" for r in ranking) or "none"
    ctx.progress("tune-kernels", f"over bound: {worst}; best {options_text(state.best.options)}")


def _autotune(ctx: CycleContext, entry: dict, configs: list[dict], log_dir) -> None:
    state, ex = ctx.state, ctx.ex
    cat = entry["category"]
    ctx.progress("tune-kernels", f"{cat}: successive halving over "
                 + "; ".join(options_text(c) for c in configs))
    res = judges.tune_options(ctx.root, ctx.cfg, state.best, configs, ex.prescreen_max_new,
                              log_dir / cat)
    entry["tried"] = res["scores"]
    entry["best_config"], entry["estimated_gain"] = res["config"], res["gain"]
    if res["gain"] < ex.prescreen_min_gain:
        entry["result"] = (f"best configuration {options_text(res['config'])} estimated "
                           f"{res['gain']:+.1%} < {ex.prescreen_min_gain:.0%}; kept "
                           f"{options_text(state.best.options)}")
        return
    cand = System(commit=state.best.commit, options={**state.best.options, **res["config"]})
    refs = ctx.references("dev")
    gates = judges.run_gates(ctx.root, ctx.cfg, ctx.gates_cfg, cand.commit, cand.options,
                             refs, "dev", False, log_dir / cat)
    ok, reasons = judges.gates_passed(gates)
    entry["gates"] = gates
    if not ok:
        entry["result"] = "gate failed: " + "; ".join(reasons[:3])
        return
    v = judges.compare(ctx.root, ctx.cfg, state.best, cand, ex.controller_rounds,
                       ex.controller_requests, ex.controller_max_new,
                       progress=lambda m: ctx.progress("tune-kernels", f"controller: {m}"),
                       family=max(1, ex.kernel_categories))   # one verdict per category
    entry["verdict"] = v
    why = judges.implausible(v, ctx.analysis_of(state.best), ex.plausible_margin) \
        if v["adopted"] else None
    if why:
        entry["result"] = f"{why}; kept {options_text(state.best.options)}"
    elif v["adopted"]:
        state.best = cand
        entry["result"] = f"adopted {options_text(res['config'])} (gain {v['gain']:+.1%}, " \
                          f"lower bound {v['lower_bound']:+.1%})"
    else:
        entry["result"] = f"controller: {v['verdict']} for {options_text(res['config'])}"


def _agent(ctx: CycleContext, row: dict, backend: str) -> dict:
    """A code change for the worst category by a sub-agent, from the integrated system."""
    cat = row["category"]
    d = Direction(id=f"kernel-{cat}", title=f"Faster {cat} kernels",
                  hypothesis=f"{cat} takes {row['measured_ms']:.3f} ms per step, "
                             f"{row['over_bound']:.1f}x its byte/FLOP lower bound of "
                             f"{row['bound_ms']:.4f} ms",
                  target_factor="kernel",
                  evidence_plan="microbenchmark against the plain PyTorch path, then gates "
                                "and controller against the integrated system",
                  predicted_gain=round(min(1.0, max(0.0, 1 - 1 / row["over_bound"]) / 2), 3),
                  files=["stock/layers.py", "stock/model.py", "kernels/"],
                  option=f"{cat}_kernel_patch", backend=backend)
    ds = DirectionState(direction=d, base=ctx.state.best, deps=best_entries(ctx.state))
    run_direction(ctx, ds, ctx.devices[0])
    if ds.status == "adopted":
        ctx.state.best = System(commit=ds.candidate.commit, options=ds.candidate.options)
    return ds.model_dump(mode="json")
