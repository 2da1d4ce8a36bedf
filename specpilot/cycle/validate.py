"""Phase 4 (`specpilot validate`): the cycle's system on sealed requests.

Token forcing of the best system against stock's references on sealed requests, and the
controller against stock on sealed requests (skipped when the best system is stock itself).
Only a pass moves refs/specpilot/best; a failure rejects the cycle's system and says why.
Either way the cycle's entries that make up its system leave their provisional status:
validated on a pass (reusable from then on), rejected on a failure (never reused).
The sealed requests are read here, by the judges, and never reach an agent; their
references and the logs of the workers that ran them stay outside the repository, beside
the secret seed (requests/sealed.py).
"""

from __future__ import annotations

import json
import time

from specpilot.cycle import judges
from specpilot.cycle.context import CycleContext
from specpilot.cycle.entries import mark_validated
from specpilot.cycle.types import BEST_FILE, BEST_REF, System

def best_options(root) -> dict:
    path = root / BEST_FILE
    if path.is_file():
        return json.loads(path.read_text()).get("options", {})
    return {}


def validate(ctx: CycleContext) -> dict:
    state = ctx.state
    best = state.best
    stock = System(commit=ctx.stock_commit())
    rec: dict = {"system": best.model_dump(), "length": ctx.validate_length(),
                 "requests": ctx.ex.validate_requests, "reasons": []}
    if ctx.validate_length() < ctx.cfg.gates.sealed_length:
        rec["note"] = (f"sealed forcing length {ctx.validate_length()} < "
                       f"{ctx.cfg.gates.sealed_length} ([explore] validate_length; CPU budget),"
                       f" twice the dev length {ctx.gates_cfg.dev_length} or more")
    refs = ctx.references("sealed")
    code_changed = ctx.store.system_tree(best.commit, ctx.cfg.system_paths) != \
        ctx.store.system_tree(stock.commit, ctx.cfg.system_paths)
    rec["gates"] = judges.run_gates(ctx.root, ctx.cfg, ctx.gates_cfg, best.commit,
                                    best.options, refs, "sealed", code_changed,
                                    judges.sealed_logs(state.run_id, "validate"))
    ok, reasons = judges.gates_passed(rec["gates"])
    rec["reasons"] += reasons
    if not code_changed and not best.options:
        rec["controller"] = None
        rec["reasons"].append("best system is stock: nothing to measure against stock")
    elif ok:
        v = judges.compare(ctx.root, ctx.cfg, stock, best, ctx.ex.controller_rounds,
                           ctx.ex.validate_requests, ctx.ex.controller_max_new,
                           source="sealed")
        rec["controller"] = v
        if v.get("faults"):
            ok = False
            rec["reasons"].append("controller on sealed requests: timed outputs differ from "
                                  "stock's: " + "; ".join(v["faults"][:3]))
        elif not v["adopted"]:
            ok = False
            rec["reasons"].append(f"controller on sealed requests: {v['verdict']} "
                                  f"(lower bound {v['lower_bound']:+.1%})")
    rec["passed"] = ok
    if ok:
        old = ctx.store.resolve(BEST_REF)
        ctx.store.update_ref(BEST_REF, best.commit, old, f"specpilot validate {state.run_id}")
        (ctx.root / BEST_FILE).write_text(json.dumps(
            {"run": state.run_id, "commit": best.commit, "options": best.options,
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
        rec["reasons"].append(f"passed: {BEST_REF} -> {best.commit[:12]} {best.options}")
    else:
        rec["reasons"].insert(0, "failed: the cycle's system is rejected")
    rec["entries"] = mark_validated(ctx, ok, "; ".join(rec["reasons"][:3]))
    state.validation = rec
    return rec
