"""The planner (main agent): Phase 0 report + memory + past cycles -> validated directions.

- offline (default without a key): memory entries whose options the base does not
  register yet become `reuse` directions (not discoveries), except entries for the batched
  engine alone (`load = "batched"`) on a single-request cycle; an entry's applicability is
  free text, not matched here: the pre-screen, gates and controller judge it on this
  deployment; entries a cycle recorded but did not validate are never offered;
  tunable options of the current system become `tune` directions, ordered by the factor
  they act on (largest factor first); with a coding backend (`[explore] backend` command or
  anthropic), one code-change direction per cost-model factor comes first.
- anthropic: Claude gets the same context and must answer with a JSON list of directions;
  invalid output gets one repair retry, then the offline plan is used (and the record says so).
  Its code-change directions run on the configured coding backend (`with_backend`).
"""

from __future__ import annotations

import json
import re

from pydantic import TypeAdapter, ValidationError

from specpilot.cycle.search import bucket_values, default_values
from specpilot.cycle.types import Direction
from specpilot.judges.analyze import DIRECTIONS
from stock.options import REGISTRY

# Registered options a tuner may search, with the factor each acts on.
TUNABLE = {"draft_len": ("tau", "draft tokens per step trade acceptance against verify cost"),
           "ngram_max": ("tau", "longer n-gram matches draft more precisely"),
           "ngram_min": ("tau", "shorter minimum matches draft more often"),
           "draft_layers": ("tau", "a deeper truncated draft model accepts more")}
FACTOR_OF_DRAFTER = {"ngram": ("draft_len", "ngram_max", "ngram_min"),
                     "draft": ("draft_len", "draft_layers"),
                     "block": ("draft_len",)}


def offline_plan(analysis: dict, memory_entries: list, drafter: str, max_directions: int,
                 tune_values: int, coding: str | None = None,
                 load: str = "single") -> list[Direction]:
    """`coding`: the backend that writes code changes ([explore] backend: command or
    anthropic), or None. With one, a direction per cost-model factor (largest first) for it
    comes before the reuse and tune directions: the user asked for their agent. `load`:
    the load the cycle judges ("single" requests: entries for the batched engine only, load
    "batched", are not offered)."""
    factors = {k: v for k, v in ((analysis or {}).get("factors") or {}).items()
               if v is not None}   # a factor the cost model could not compute is null
    code = code_directions(factors, coding) if coding else []
    dirs: list[Direction] = []
    for meta in memory_entries:
        names = [o.name for o in meta.options]
        if not names or any(n in REGISTRY for n in names):
            continue  # no option to switch it on, or already part of the base
        if getattr(meta, "load", "any") == "batched" and load != "batched":
            continue  # acts on the batched engine only: nothing to gain on this load
        dirs.append(Direction(
            id=_slug(f"reuse-{meta.id}"), title=f"Reuse memory entry {meta.id}: {meta.title}",
            hypothesis=meta.summary or meta.title, target_factor=_factor_of(meta, factors),
            evidence_plan="replay onto the base, pre-screen one paired round, gates, controller",
            predicted_gain=_recorded_gain(meta), files=[], option=names[0], backend="reuse",
            entry=meta.id, counted=False))
    # "auto" (config controller.drafter) is the drafter the analysis measured
    drafter = (analysis or {}).get("drafter") or drafter
    for name in FACTOR_OF_DRAFTER.get(drafter, ()):
        if name not in REGISTRY:
            continue
        factor, why = TUNABLE[name]
        opt = REGISTRY[name]
        low, high = getattr(opt, "min", None), getattr(opt, "max", None)
        if name == "draft_len":   # tried where its verify step fills a CUDA-graph bucket
            values = bucket_values(opt.default, tune_values, low, high)
        else:
            values = default_values(name, opt.default, tune_values, low, high)
        if not values:
            continue
        dirs.append(Direction(
            id=_slug(f"tune-{name}"), title=f"Tune {name} (default {REGISTRY[name].default})",
            hypothesis=why, target_factor=factor,
            evidence_plan=f"successive halving over {', '.join(values)} with short timed "
                          f"generations; then gates and controller",
            predicted_gain=round(max(0.0, factors.get(factor, 1.0) - 1) / 2, 3),
            files=[], option=name, backend="tune", values=values))
    # reuse first (cheap, proven elsewhere), then by the factor the direction targets
    dirs.sort(key=lambda d: (d.backend != "reuse", -factors.get(d.target_factor, 1.0)))
    return (code + dirs)[:max_directions]


def code_directions(factors: dict, backend: str) -> list[Direction]:
    """One code-change direction per factor of the cost model, largest first, for `backend`
    (the command backend's agent, or Claude): the option guarding the patch is named after
    the factor."""
    out = []
    for factor, value in sorted(factors.items(), key=lambda kv: -kv[1]):
        if factor not in DIRECTIONS:
            continue
        out.append(Direction(
            id=_slug(f"{backend}-{factor}"), title=f"Close the {factor} gap ({value:.2f}x)",
            hypothesis=f"the cost model puts a {value:.2f}x factor on {factor}: "
                       f"{DIRECTIONS[factor]}",
            target_factor=factor,
            evidence_plan="a patch behind a new option whose default is stock bit for bit; "
                          "then pre-screen, option-default and forcing gates, controller",
            predicted_gain=round(min(10.0, max(0.0, value - 1) / 2), 3),
            files=["stock/"], option=f"{factor}_patch", backend=backend))
    return out


def with_backend(dirs: list[Direction], coding: str | None) -> tuple[list[Direction], list[str]]:
    """A planner's code-change directions (anthropic or command) given the configured coding
    backend, or dropped without one; reuse and tune directions as they are."""
    kept, dropped = [], []
    for d in dirs:
        if d.backend in ("anthropic", "command"):
            if coding is None:
                dropped.append(d.id)
                continue
            d = d.model_copy(update={"backend": coding})
        kept.append(d)
    return kept, dropped


def _factor_of(meta, factors: dict) -> str:
    """The factor an entry targets, from its title, else its summary (a tree entry's
    summary names the kernel it runs through; its title says what it changes)."""
    for text in (meta.title.lower(), meta.summary.lower()):
        if any(w in text for w in ("draft", "tree", "accept")):
            return "tau"
        if any(w in text for w in ("kernel", "fused", "gemm", "launch")):
            return "kernel"
    return max(factors, key=factors.get) if factors else "overhead"


def _recorded_gain(meta) -> float:
    # a controller verdict's value is a gain (0.2 = +20%); other results are ratios
    vals = [r.value if r.metric == "controller_gain" else r.value - 1 for r in meta.results
            if not r.stale]
    vals = [v for v in vals if v > 0]
    return round(min(vals), 3) if vals else 0.0


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-")[:60]


PLAN_PROMPT = """You plan one optimization cycle of a speculative-decoding inference system.
Answer with a JSON list only (no prose). Each item: {{"id": slug, "title", "hypothesis",
"target_factor": "tau"|"kernel"|"overhead", "evidence_plan", "predicted_gain": fraction,
"files": [paths], "option": snake_case option that guards the change,
"backend": "anthropic"|"tune"|"reuse", "entry": memory entry id for reuse or null,
"values": [option values for tune]}}. At most {n} items, largest expected gain first.

Cost-model report:
{analysis}

Memory entries (id, title, options):
{memory}

Registered options: {options}
Past cycles: {past}
"""


def anthropic_plan(client, model: str, analysis: dict, memory_entries: list, past: list,
                   max_directions: int, transcript) -> tuple[list[Direction] | None, str]:
    prompt = PLAN_PROMPT.format(
        n=max_directions, analysis=json.dumps(analysis, indent=1),
        memory="\n".join(f"- {m.id}: {m.title} ({', '.join(o.name for o in m.options)})"
                         for m in memory_entries) or "(none)",
        options=", ".join(f"{n}={o.default}" for n, o in sorted(REGISTRY.items())),
        past=json.dumps(past)[:4000])
    messages = [{"role": "user", "content": prompt}]
    adapter = TypeAdapter(list[Direction])
    for attempt in range(2):
        reply = client.messages.create(model=model, max_tokens=4096, messages=messages)
        text = "".join(getattr(b, "text", "") for b in reply.content)
        transcript({"role": "assistant", "attempt": attempt, "text": text})
        try:
            found = re.search(r"\[.*\]", text, re.S)
            dirs = adapter.validate_python(json.loads(found.group(0) if found else text))
            return dirs[:max_directions], "anthropic"
        except (ValueError, ValidationError) as exc:
            problem = str(exc)[:1500]
            transcript({"role": "planner", "invalid": problem})
            messages += [{"role": "assistant", "content": text or "(empty)"},
                         {"role": "user", "content": "That output is invalid: " + problem +
                          "\nAnswer again with the corrected JSON list only."}]
    return None, "anthropic output invalid twice; offline plan used"
