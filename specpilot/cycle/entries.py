"""Adopted candidates become memory entries, with provenance and the controller's results."""

from __future__ import annotations

import tempfile
from pathlib import Path

import tomli_w

from specpilot.memory.record import record
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


def record_adopted(cycle, ds) -> str:
    d, cand, v = ds.direction, ds.candidate, ds.verdict
    state = cycle.state
    run_short = state.run_id.removeprefix("run-")
    entry_id = f"{d.id}-{run_short}"[:64].rstrip("-.")
    reused = d.backend == "reuse"
    meta = {
        "title": d.title, "summary": f"{d.hypothesis}\n\n{cand.summary}".strip(),
        "provenance": {"kind": "reused" if reused else "discovered",
                       **({"reused_from": d.entry} if reused and d.entry else {}),
                       "detail": f"specpilot explore {state.run_id}, direction {d.id}, "
                                 f"backend {d.backend}"},
        "options": _option_specs({k: v2 for k, v2 in cand.options.items()
                                  if state.base.options.get(k) != v2},
                                 next((g["option_specs"] for g in ds.gates
                                       if "option_specs" in g), {})),
        "constraints": [{"kind": "token_forcing",
                         "detail": f"dev token forcing gate passed "
                                   f"({cycle.gates_cfg.dev_length} tokens, "
                                   f"{cycle.ex.gate_requests} requests)"}],
        "results": [{"metric": "controller_gain", "value": v["gain"],
                     "ci_low": v["lower_bound"], "confidence": cycle.cfg.controller.confidence,
                     "hardware": v.get("hardware", ""), "model": cycle.cfg.model.path,
                     "request_set": f"dev: {', '.join(v.get('requests', []))}; "
                                    f"max_new {v.get('max_new')}",
                     "controller_run": f"{state.run_id}/{d.id}"}],
        "untested": ["sealed requests (Phase 4 validates the cycle's system)"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meta.toml"
        path.write_text(tomli_w.dumps(meta))
        rec = record(Memory(cycle.root), cand.commit, entry_id, [], path,
                     base=state.base.commit)
    return rec.id
