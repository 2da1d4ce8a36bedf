"""Two option sets of one engine side by side, per request: where a controller verdict's time goes.

The controller (specpilot compare) reports one wall time per request. This script builds the
same systems as its workers do for a `random:` model (Transformer.random of the preset, then
Engine(net, Options(opts), 1024)), both in this process on one device, runs the controller's
own requests for that model (specpilot.judges.prompts.pick_requests) alternately A, B, B, A, and
splits each request's time into prefill and decode (ms per step, steps, tokens):

    PYTHONPATH=<checkout with the option> python3 bench/gpu_engine_ab.py \\
        --model random:dense-27b --opt-b weights=w12 --drafters ar,ngram --out $OUT
    python bench/gpu_engine_ab.py --model random:tiny-qwen3 --device cpu --rounds 1   # plumbing

Options that only a memory entry registers (weights=w12) need that entry's tree first on
PYTHONPATH (git worktree add DIR refs/specpilot/entries/ID). Prints a table; writes
gpu_engine_ab.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def build(model: str, opts: dict, device: str):
    from stock.config import PRESETS
    from stock.engine import Engine
    from stock.model import Transformer
    from stock.options import Options

    if not model.startswith("random:"):
        raise SystemExit("gpu_engine_ab: --model must be random:<preset>")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    net = Transformer.random(PRESETS[model[7:]], torch.device(device), dtype)
    return Engine(net, Options(opts), 1024, set())


def run(engine, drafter_name: str, prompts: list[list[int]], max_new: int) -> list[dict]:
    from stock.system import make_drafter

    drafter = make_drafter(None if drafter_name == "ar" else drafter_name, engine)
    rows = []
    for ids in prompts:
        t = time.perf_counter()
        res = engine.generate(list(ids), max_new, drafter)
        rows.append({"s": time.perf_counter() - t, "prefill_ms": 1e3 * res.prefill_s,
                     "decode_ms": 1e3 * res.decode_s, "steps": res.steps,
                     "tokens": len(res.tokens)})
    return rows


def summarise(rows: list[dict]) -> dict:
    med = statistics.median
    return {"request_s": med(r["s"] for r in rows),
            "prefill_ms": med(r["prefill_ms"] for r in rows),
            "decode_ms": med(r["decode_ms"] for r in rows),
            "ms_per_step": med(r["decode_ms"] / max(r["steps"], 1) for r in rows),
            "steps": med(r["steps"] for r in rows), "tokens": med(r["tokens"] for r in rows),
            "other_ms": med(1e3 * r["s"] - r["prefill_ms"] - r["decode_ms"] for r in rows),
            "n": len(rows)}


def parse_opts(items: list[str], source: str) -> dict:
    """name=value pairs, parsed as the option registry types them (stock.options)."""
    from stock.options import OptionError, Options, parse_pairs

    try:
        return Options(parse_pairs(items, source)).non_default()
    except OptionError as exc:
        raise SystemExit(f"{exc} (an entry's option needs its tree first on PYTHONPATH)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random:dense-27b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--opt-a", action="append", default=[])
    ap.add_argument("--opt-b", action="append", default=[])
    ap.add_argument("--drafters", default="ar,ngram")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import stock.system  # noqa: F401 - registers the drafters' options before parsing
    from specpilot.judges.prompts import pick_requests

    opts = {"A": parse_opts(args.opt_a, "--opt-a"), "B": parse_opts(args.opt_b, "--opt-b")}
    prompts = [r[2] for r in pick_requests(args.model, args.requests)]
    engines = {}
    for side in ("B", "A"):  # B first: a converting B (weights=w12) peaks at the bf16 bytes
        engines[side] = build(args.model, opts[side], args.device)
        log(f"{side} built with {opts[side] or 'defaults'}")
    report = {"model": args.model, "device": args.device, "options": opts, "rows": {}}
    for drafter in args.drafters.split(","):
        for side in ("A", "B"):  # warm-up: compiles, captures, tunes
            run(engines[side], drafter, prompts, args.max_new)
        log(f"{drafter}: warmed up")
        rows = {"A": [], "B": []}
        for r in range(args.rounds):
            for side in (("A", "B") if r % 2 == 0 else ("B", "A")):
                rows[side] += run(engines[side], drafter, prompts, args.max_new)
        report["rows"][drafter] = {side: {"summary": summarise(v), "requests": v}
                                   for side, v in rows.items()}
        log(f"{drafter}: done")
    print(f"\n{args.model} on {args.device}; A {opts['A'] or 'defaults'}, B {opts['B']}; "
          f"{args.requests} requests x {args.max_new} new tokens, {args.rounds} rounds "
          "(medians per request)")
    cols = ("request_s", "prefill_ms", "decode_ms", "ms_per_step", "steps", "other_ms")
    print(f"{'drafter':<8}{'side':<5}" + "".join(f"{c:>13}" for c in cols))
    for drafter, sides in report["rows"].items():
        for side in ("A", "B"):
            s = sides[side]["summary"]
            print(f"{drafter:<8}{side:<5}" + "".join(f"{s[c]:>13.3f}" for c in cols))
        a, b = sides["A"]["summary"], sides["B"]["summary"]
        print(f"{drafter:<8}{'A/B':<5}" + "".join(
            f"{(a[c] / b[c] if b[c] else 0):>13.3f}" for c in cols))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "gpu_engine_ab.json").write_text(json.dumps(report, indent=1))
    log(f"wrote {Path(args.out, 'gpu_engine_ab.json')}")


if __name__ == "__main__":
    main()
