"""`specpilot memory add-result` and `describe`: an entry's measured results and its
descriptive text.

Results live in the entry's note (and `memory/<id>.toml`), never in its tree, so adding one
changes neither the entry commit nor what replay reproduces. A controller comparison (the
JSON of `specpilot compare --json`) becomes a `controller_gain` result: the gain, its
one-sided lower bound, the verdict, the hardware, model and requests it was measured on.
`describe` rewrites the entry's prose (summary, applicability limits, what is untested) when
measurements overtake it; `set_option` lists an option the entry's patches register (one
added by `amend`, which keeps the list) or gives a listed one its tuned value (the value
`reuse` switches the entry on with) once a measurement chose it; `set_validation` records
where a cycle's entry stands with the cycle's final validation (provisional, validated,
rejected); like a result, each changes only the note.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.gitstore import ENTRY_PREFIX
from specpilot.memory.entry import OptionSpec, Result, Validation
from specpilot.memory.replay import Replayer
from specpilot.memory.store import Memory, write_file_entry


def from_comparison(path: Path, note: str = "", entry_id: str | None = None) -> Result:
    """A controller report (`specpilot compare --json`) as a result of its B side; of a run
    of several candidates (a list of reports), the one whose candidate was `entry_id`."""
    try:
        rep = json.loads(path.read_text())
        if isinstance(rep, list):
            revs = [r["b"]["rev"] for r in rep]
            if entry_id not in revs:
                raise SpecPilotError(f"{path}: a run of several candidates ({', '.join(revs)})"
                                     f" without {entry_id!r}: its candidate must be named "
                                     f"after the entry", code=2)
            rep = rep[revs.index(entry_id)]
        est, dec = rep["estimate"], rep["decision"]
        verdict = dec["verdict"] + (f"; {note}" if note else "")
        return Result(
            metric="controller_gain", value=est["gain"], ci_low=est["lower_bound"],
            confidence=est.get("level", 0.95), hardware=rep["paired"]["hardware"],
            model=rep["model"], request_set=f"{len(rep['requests'])} requests x "
                                            f"{rep['max_new']} new tokens",
            controller_run=_run_line(rep, dec),
            verdict=verdict, date=datetime.now(timezone.utc).replace(microsecond=0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecPilotError(f"{path}: not a controller report (specpilot compare --json): "
                             f"{exc}", code=2) from exc


def _run_line(rep: dict, dec: dict) -> str:
    """How the verdict was measured, in one line: placement, load (request by request, or
    throughput at C with so many requests a round: a round where C or fewer arrive at once
    never has a request waiting), drafters, both sides' options, σ and threshold, and how the
    outputs were checked (forced in throughput mode, continued request by request)."""
    parts = [f"{rep['mode']} on {','.join(rep['devices'])}"]
    if rep.get("batch"):
        per_round = len(rep["requests"]) // max(1, rep.get("rounds") or 1)
        parts.append(f"throughput at C = {rep['batch']}, {per_round} requests a round"
                     + (f", Poisson arrivals at {rep['rate']:g}/s" if rep.get("rate") else ""))
    if rep.get("drafter"):
        parts.append(f"drafter {rep['drafter']}"
                     + (f" (B: {rep['drafter_b']})" if rep.get("drafter_b") else ""))
    if rep.get("a", {}).get("options"):
        parts.append(f"A options {rep['a']['options']}")
    parts.append(f"B options {rep['b']['options']}")
    if len(rep.get("candidates") or []) > 1:
        parts.append(f"one of {len(rep['candidates'])} candidates judged in one run "
                     f"(family {rep.get('family', len(rep['candidates']))})")
    parts.append(f"sigma {rep['sigma']:.4f}; threshold {dec['threshold']:.4f}")
    checked = [f"{side} {c.get('forced', 0)} forced / {c.get('restarts', 0)} continued"
               for side, c in sorted((rep.get("outputs") or {}).items())
               if isinstance(c, dict) and (c.get("forced") or c.get("restarts"))]
    if checked:
        parts.append("outputs " + ", ".join(checked))
    return "; ".join(parts)


def typed_in(gain: float, lower_bound: float | None, hardware: str, model: str, verdict: str,
             note: str = "") -> Result:
    """A controller result typed in from what a run printed (its report did not survive)."""
    if not hardware or not model or not verdict:
        raise SpecPilotError("a typed-in result needs --hardware, --model and --verdict", code=2)
    return Result(metric="controller_gain", value=gain, ci_low=lower_bound, hardware=hardware,
                  model=model, verdict=verdict + (f"; {note}" if note else ""),
                  controller_run="typed in from the printed report",
                  date=datetime.now(timezone.utc).replace(microsecond=0))


def add_result(memory: Memory, entry_id: str, result: Result, write_files: bool = True):
    """Append `result` to the entry's note (and memory/<id>.toml); returns the new meta."""
    return _update_note(memory, entry_id,
                        lambda meta: {"results": [*meta.results, result]}, write_files)


def describe(memory: Memory, entry_id: str, summary: str | None = None,
             applicability: list[str] | None = None, untested: list[str] | None = None,
             write_files: bool = True):
    """Replace the entry's summary, applicability or untested list (each only when given;
    empty items are dropped, so [""] clears a list); returns the new meta."""
    update: dict = {}
    if summary is not None:
        if not summary.strip():
            raise SpecPilotError("--summary must not be empty", code=2)
        update["summary"] = summary
    for name, items in (("applicability", applicability), ("untested", untested)):
        if items is not None:
            update[name] = [i for i in items if i.strip()]
    if not update:
        raise SpecPilotError("nothing to change: give --summary, --applicability or --untested",
                             code=2)
    return _update_note(memory, entry_id, lambda meta: update, write_files)


# an option registration a patch adds: `register("name", type, default, ...` on one line
_REGISTER = re.compile(r'^\+\s*register\(\s*"(?P<name>\w+)"\s*,\s*(?P<type>bool|int|float|str)'
                       r'\s*,\s*(?P<default>[^,]+?)\s*,', re.M)


class NotLiteral(str):
    """A registration's default that is an expression, not a literal (`BUCKETS[-1]`): the
    patch gives its type but not its value."""


def registered(patch: str) -> dict[str, tuple[str, object]]:
    """name -> (type name, default) of every option registration `patch` adds; a default
    that is no literal is its expression as a `NotLiteral`."""
    out = {}
    for m in _REGISTER.finditer(patch):
        try:
            out[m["name"]] = (m["type"], ast.literal_eval(m["default"]))
        except (ValueError, SyntaxError):
            out[m["name"]] = (m["type"], NotLiteral(m["default"]))
    return out


def _typed(type_name: str, text: str):
    if type_name == "bool":
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(text)
    return {"int": int, "float": float, "str": str}[type_name](text)


def set_option(memory: Memory, entry_id: str, name: str, tuned: str | None = None,
               help: str | None = None, write_files: bool = True):
    """List option `name` in the entry's metadata (type and default as its registration in
    the entry's patch or a dependency's says) or update a listed one: its tuned value
    (parsed by its type) and help. Refused for an option no patch of the entry's replay
    registers. Changes only the note; returns the new meta."""
    refs = memory.ref_entries()
    if entry_id not in refs:
        raise SpecPilotError(f"no memory entry {entry_id!r}", code=2)
    with memory.store.private_index() as index:
        replayer = Replayer(memory, refs, index)
        outcome = replayer.run(entry_id)
        if not outcome.ok:
            raise SpecPilotError(f"entry {entry_id!r} does not reproduce: {outcome.error}")
        found: dict = {}
        for patch in replayer.patches.values():
            found.update(registered(patch.decode("utf-8", "replace")))
    if name not in found:
        raise SpecPilotError(f"entry {entry_id!r} registers no option {name!r} (its replay "
                             f"registers: {', '.join(sorted(found)) or 'none'})", code=2)
    type_name, default = found[name]
    listed = any(spec.name == name for spec in memory.ref_entries()[entry_id].meta.options)
    if isinstance(default, NotLiteral) and not listed:
        raise SpecPilotError(f"option {name!r} of entry {entry_id!r} has a default that is not "
                             f"a literal ({default}): its registration does not say the value, "
                             f"so it cannot be listed from the patch", code=2)
    value = None
    if tuned is not None:
        try:
            value = _typed(type_name, tuned)
        except ValueError:
            raise SpecPilotError(f"--tuned {tuned!r} is not of type {type_name} (option {name})",
                                 code=2) from None

    def change(meta):
        specs = list(meta.options)
        for i, spec in enumerate(specs):
            if spec.name == name:
                update = {k: v for k, v in (("tuned", value), ("help", help)) if v is not None}
                specs[i] = spec.model_copy(update=update)
                break
        else:
            specs.append(OptionSpec(name=name, type=type_name, default=default, tuned=value,
                                    help=help or ""))
        return {"options": specs}
    return _update_note(memory, entry_id, change, write_files)


def set_validation(memory: Memory, entry_id: str, status: str, run: str, detail: str,
                   write_files: bool = True):
    """Mark a cycle's entry provisional, validated or rejected (its note and
    memory/<id>.toml; never its tree); returns the new meta."""
    stamp = Validation(status=status, run=run, detail=detail,
                       date=datetime.now(timezone.utc).replace(microsecond=0))
    return _update_note(memory, entry_id, lambda meta: {"validation": stamp}, write_files)


def _update_note(memory: Memory, entry_id: str, change, write_files: bool):
    store = memory.store
    with store.writer_lock():
        refs = memory.ref_entries()
        if entry_id not in refs:
            raise SpecPilotError(f"no memory entry {entry_id!r}", code=2)
        entry = refs[entry_id]
        meta = entry.meta.model_copy(update=change(entry.meta))
        meta = type(meta).validate_dict(meta.model_dump(), f"entry {entry_id}")
        raw = meta.to_toml()
        patch = own_patch(memory, refs, entry_id) if write_files else None
        store.set_note(entry.commit, raw, meta.git_date())
        if patch is not None:
            write_file_entry(memory.folder, raw, entry_id, patch)
    return meta


def own_patch(memory: Memory, refs: dict, entry_id: str) -> bytes:
    """The entry's own patch: the canonical diff from the replay of all its dependencies
    (not from its first parent: an entry with two dependencies has two) to its commit.
    Refused, before anything is written, if the entry does not reproduce."""
    with memory.store.private_index() as index:
        replayer = Replayer(memory, refs, index)
        outcome = replayer.run(entry_id)
        if not outcome.ok:
            raise SpecPilotError(f"entry {entry_id!r} does not reproduce, so its memory/ files "
                                 f"cannot be rewritten (nothing was changed; use --no-files "
                                 f"to change the note alone): {outcome.error}")
        return replayer.patches[entry_id]


__all__ = ["ENTRY_PREFIX", "add_result", "describe", "from_comparison", "registered",
           "set_option", "set_validation", "typed_in"]
