"""Adopted candidates become memory entries, with provenance and the controller's results."""

from __future__ import annotations

import tempfile
from pathlib import Path

import tomli_w

from specpilot.cycle.context import CycleContext
from specpilot.memory.patches import PatchApplyError
from specpilot.memory.record import record
from specpilot.memory.results import set_validation
from specpilot.memory.store import Memory


def _option_specs(names: dict, known: dict) -> list[dict]:
    """Option registrations as the candidate's own code defines them (from the gate run)."""
    specs = []
    for name, value in names.items():
        opt = known.get(name, {"type": "str", "default": "", "help": ""})
        typ = opt["type"] if opt["type"] in ("bool", "int", "float", "str") else "str"
        specs.append({"name": name, "type": typ, "default": opt["default"],
                      "tuned": _typed(typ, value), "help": opt["help"]})
    return specs


def _typed(typ: str, value: str):
    text = str(value).strip()
    if typ == "bool":
        return text.lower() in ("1", "true", "yes", "on")
    if typ in ("int", "float"):
        try:
            return int(text) if typ == "int" else float(text)
        except ValueError:
            return text
    return text


def record_adopted(ctx: CycleContext, ds) -> str:
    d, cand, v = ds.direction, ds.candidate, ds.verdict
    state = ctx.state
    base = ds.base or state.base
    run_short = state.run_id.removeprefix("run-")
    entry_id = f"{d.id}-{run_short}"[:64].rstrip("-.")
    memory = Memory(ctx.root)
    known = memory.ref_entries().get(entry_id)
    if known is not None:  # recorded before (a resumed cycle, `integrate` run again)
        if known.meta.source_tree == memory.store.system_tree(cand.commit, memory.system_paths):
            return entry_id
        raise RuntimeError(f"entry {entry_id} exists with a different system tree")
    reused = d.backend == "reuse"
    meta = {
        "title": d.title, "summary": f"{d.hypothesis}\n\n{cand.summary}".strip(),
        "provenance": {"kind": "reused" if reused else "discovered",
                       **({"reused_from": d.entry} if reused and d.entry else {}),
                       "detail": f"specpilot explore {state.run_id}, direction {d.id}, "
                                 f"backend {d.backend}"},
        "options": _option_specs({k: v2 for k, v2 in cand.options.items()
                                  if base.options.get(k) != v2},
                                 next((g["option_specs"] for g in ds.gates
                                       if "option_specs" in g), {})),
        "constraints": [{"kind": "token_forcing",
                         "detail": f"dev token forcing gate passed "
                                   f"({ctx.gates_cfg.dev_length} tokens, "
                                   f"{ctx.ex.gate_requests} requests)"}],
        "results": [{"metric": "controller_gain", "value": v["gain"],
                     "ci_low": v["lower_bound"], "confidence": ctx.cfg.controller.confidence,
                     "hardware": v.get("hardware", ""), "model": ctx.cfg.model.path,
                     "request_set": f"dev: {', '.join(v.get('requests', []))}; "
                                    f"max_new {v.get('max_new')}",
                     "controller_run": f"{state.run_id}/{d.id}"}],
        "untested": ["sealed requests (Phase 4 validates the cycle's system)"],
        "validation": provisional(state.run_id),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meta.toml"
        path.write_text(tomli_w.dumps(meta))
        rec = record(memory, cand.commit, entry_id, list(ds.deps), path,
                     base=state.base.commit)
    return rec.id


def provisional(run_id: str) -> dict:
    """An entry recorded at adoption awaits the cycle's final validation: not reusable."""
    return {"status": "provisional", "run": run_id,
            "detail": "recorded at adoption (dev gates and controller); not reusable until "
                      "the cycle's final validation on sealed requests passes"}


def mark_validated(ctx: CycleContext, passed: bool, why: str) -> dict[str, str]:
    """After Phase 4: the cycle's entries that make up its best system (the entry whose tree
    is the system's and, transitively, its dependencies among this cycle's entries) become
    `validated` when validation passed, `rejected` when it failed. The cycle's other entries
    were never validated and stay provisional. Returns {entry: status} for every entry of
    the cycle."""
    state = ctx.state
    if not state.entries:
        return {}
    memory = Memory(ctx.root)
    known = memory.ref_entries()
    tree = memory.store.system_tree(state.best.commit, memory.system_paths)
    mine = [e for e in state.entries if e in known]
    todo = [e for e in mine if known[e].meta.source_tree == tree]
    part: set[str] = set()
    while todo:
        e = todo.pop()
        if e not in part:
            part.add(e)
            todo += [d for d in known[e].meta.deps if d in mine]
    status = "validated" if passed else "rejected"
    out = {}
    for e in mine:
        if e in part:
            set_validation(memory, e, status, state.run_id,
                           f"part of the system {state.best.commit[:12]} "
                           f"{state.best.options} whose final validation "
                           f"{'passed' if passed else 'failed'}: {why}"[:500])
            out[e] = status
        else:
            out[e] = known[e].meta.validation.status if known[e].meta.validation else "none"
    return out


def record_integration(ctx: CycleContext, stacked: list, stack, verdict: dict,
                       resolved: list[str]) -> dict:
    """The integration as an entry whose dependencies are the stacked entries (in the order
    they were stacked) and whose own patch is what the stack adds to them: nothing for a
    clean stack, the resolution where the integration agent resolved a conflict. Where the
    entries' own patches do not compose by a plain apply (a resolved conflict), the
    dependencies are the longest prefix that does, and the integration's patch carries the
    rest (as resolved). Returns {"entry", "deps", "carried"}."""
    state = ctx.state
    entries = [d.entry for d in stacked if d.entry]
    specs: dict = {}
    for d in stacked:
        for g in d.gates:
            specs.update(g.get("option_specs") or {})
    options = {k: v for k, v in stack.options.items() if state.base.options.get(k) != v}
    entry_id = f"integrate-{state.run_id.removeprefix('run-')}"[:60].rstrip("-.")
    memory = Memory(ctx.root)
    tree = memory.store.system_tree(stack.commit, memory.system_paths)
    known = memory.ref_entries()
    stem = entry_id
    for n in range(2, 100):   # `specpilot integrate` run again: the same stack is one entry
        if entry_id not in known and not (memory.folder / f"{entry_id}.toml").exists():
            break
        if entry_id in known and known[entry_id].meta.source_tree == tree:
            deps = list(known[entry_id].meta.deps)
            return {"entry": entry_id, "deps": deps,
                    "carried": [e for e in entries if e not in deps]}
        entry_id = f"{stem}-r{n}"
    ids = ", ".join(d.direction.id for d in stacked)
    meta = {
        "title": f"Integration of {ids}",
        "summary": "Adopted entries of one cycle stacked in order of measured gain and "
                   "measured together by the controller."
                   + (f" Conflicts resolved by the integration agent: {', '.join(resolved)}."
                      if resolved else ""),
        "provenance": {"kind": "discovered",
                       "detail": f"specpilot integrate {state.run_id}: stack {ids}"},
        "options": _option_specs(options, specs),
        "constraints": [{"kind": "token_forcing",
                         "detail": "each stacked entry passed dev token forcing; the stack "
                                   "is validated on sealed requests in Phase 4"}],
        "results": [{"metric": "controller_gain", "value": verdict["gain"],
                     "ci_low": verdict["lower_bound"],
                     "confidence": ctx.cfg.controller.confidence,
                     "hardware": verdict.get("hardware", ""), "model": ctx.cfg.model.path,
                     "request_set": f"dev: {', '.join(verdict.get('requests', []))}; "
                                    f"max_new {verdict.get('max_new')}",
                     "controller_run": f"{state.run_id}/integrate"}],
        "untested": ["sealed requests (Phase 4 validates the cycle's system)"],
        "validation": provisional(state.run_id),
    }
    last_error = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meta.toml"
        path.write_text(tomli_w.dumps(meta))
        for n in range(len(entries), -1, -1):
            deps = entries[:n]
            if not deps and stack.commit == state.base.commit:
                break
            try:
                rec = record(Memory(ctx.root), stack.commit, entry_id, deps, path,
                             base=None if deps else state.base.commit, allow_empty=True)
            except PatchApplyError as exc:   # these dependencies do not compose
                last_error = str(exc)
                continue
            return {"entry": rec.id, "deps": deps, "carried": entries[n:]}
    raise RuntimeError(f"integration not recorded: {last_error or 'nothing to record'}")
