"""Block drafter on the dev requests: τ per category, tokens/s against AR, token check.

For each selected dev request (the first --per-category of each category): the AR output,
then the speculative output with the block drafter (and any --also drafters). τ is the mean
of tokens gained per verification step, bonus included. Where speculative and AR outputs
differ, the first divergence is located and the AR reference's own top-1 minus top-2 logit
margin there is read by token forcing (chunk 1, the AR step's shape), as in gpu_stock.py: in
fp32 (CPU) outputs must be identical; in bf16 a divergence must sit at a near-tie.

Weights: --weights DIR (manifest.json + shards), default the package's. "Block 16" here is
block_size 16 with draft_len 15: 16 tokens verified a step, τ at most 16 (--draft-len 16
verifies 17). Untrained or toy weights give a meaningless τ; the script says what it loaded.

    python3 bench/gpu_block.py --per-category 2 --max-new 256 --out $OUT          # H200
    python3 bench/gpu_block.py --device cpu --per-category 1 --max-new 32         # CPU

Per mode it also reports ms per decoding step, ms of it inside the drafter's draft() (which
ends with the drafter's one host read, so no extra sync is added), and how many verify graphs
were captured during each timed run (captures inside a timed run inflate its step time).
`block` follows the options (on CUDA by default its fixed-shape step, context update
included, replayed from CUDA graphs and compiled: options block_graphs and compile);
`--also block-eager` adds the plain eager path (eager context update, eager forward),
`--also block-graphs` the step replayed from graphs whatever the options say.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stock.options import resolve  # noqa: E402
from specpilot.requests import CATEGORIES, load_dev, select  # noqa: E402
from stock.system import load_system  # noqa: E402


def time_drafts(drafter, key: str, totals: dict[str, float]):
    """Wrap drafter.draft so each call's wall time adds to totals[key] (draft() ends with the
    drafter's one host read, so its wall time is its launches plus its GPU work)."""
    inner = drafter.draft

    def timed(ctx, k):
        t = time.perf_counter()
        try:
            return inner(ctx, k)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - t
    drafter.draft = timed
    return drafter


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--weights", default="", help="block-drafter folder (default: shipped)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--draft-len", type=int, default=None, help="default block_size - 1")
    ap.add_argument("--also", default="", help="more drafters to compare, e.g. ngram")
    ap.add_argument("--no-ar", action="store_true", help="τ only: skip AR and the token check")
    ap.add_argument("--no-force", action="store_true", help="skip the forcing check")
    ap.add_argument("--no-precapture", action="store_true",
                    help="capture verify graphs on first use inside the timed runs")
    ap.add_argument("--opt", action="append", default=[], help="engine option NAME=VALUE")
    ap.add_argument("--cpu-f-linear", action="store_true",
                    help="CPU: F.linear at every row count (stock before stock.linear's "
                         "W @ x^T path for 2..16 rows), for a before/after comparison")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    if args.cpu_f_linear:
        import stock.linear

        stock.linear.SMALL_ROWS = (2, 1)  # an empty range: every call takes F.linear
    draft_len = args.draft_len or max(args.block_size - 1, 1)
    opts = [f"block_size={args.block_size}", f"draft_len={draft_len}", *args.opt]
    if args.weights:
        opts.append(f"block_weights={args.weights}")

    t0 = time.perf_counter()
    system = load_system("embedded", resolve(opts), device=args.device, max_context=4096)
    print(f"loaded on {system.device} in {time.perf_counter() - t0:.1f}s", flush=True)
    eng, tok = system.engine, system.tokenizer
    from stock.drafters.block_weights import DEFAULT_DIR, read_manifest

    man = read_manifest(Path(args.weights) if args.weights else DEFAULT_DIR)
    print(f"block weights: {man.target_name} seed {man.seed}, {man.config.num_layers} layers, "
          f"context layers {list(man.config.target_layers)}, trained block "
          f"{man.config.block_size}, steps {man.training.get('steps')}, "
          f"val loss {man.training.get('val_loss')}", flush=True)
    reqs = select(load_dev(), None, args.per_category)
    modes = (["ar"] if not args.no_ar else []) + ["block"] + [d for d in args.also.split(",") if d]
    prompt0 = tok.chat(reqs[0].prompt)

    drafters: dict[str, object] = {}

    def make(m):
        """The mode's drafter, built once and reused by every request (as stock keeps one
        block drafter per engine, so its CUDA graphs persist): "block" as the options say
        (on CUDA its fixed-shape step replayed from CUDA graphs, option block_graphs, and
        compiled, option compile: both on by default), "block-eager" the plain eager path,
        "block-graphs" from graphs whatever the options; every draft() is timed."""
        if m == "ar":
            return None
        if m not in drafters:
            d = system.drafter(m.split("-")[0])
            if m in ("block-graphs", "block-eager"):
                from stock.drafters.block import BlockDrafter

                on = m == "block-graphs"  # the plain path: eager context update and forward
                d = BlockDrafter(d.net, d.target, d.max_len, d.topk, graphs=on,
                                 compiled=on and d.compiled, static=on)
            drafters[m] = time_drafts(d, m, draft_s)
        return drafters[m]

    draft_s: dict[str, float] = {}
    for m in modes:  # warm-up: kernels, allocator
        eng.generate(prompt0, 8, make(m))
    draft_s.clear()
    slots = lambda: len(eng.runner.slots) if eng.runner is not None else 0  # noqa: E731
    if eng.uses_graphs and not args.no_precapture:
        # every verify graph a timed run can use, for every hidden-layer set (AR and n-gram
        # ask for none, the block drafter for its context layers), captured before timing
        t1 = time.perf_counter()
        end = max(len(tok.chat(r.prompt)) for r in reqs) + args.max_new + 64
        sets = {()}
        if any(m.startswith("block") for m in modes):
            sets.add(tuple(system.drafter("block").hidden_layers))
        for layers in sets:
            eng.runner.capture_upto(min(end, eng.max_context), layers)
        drafts = sum(make(m).capture_upto(min(end, eng.max_context))
                     for m in modes if m.startswith("block"))
        print(f"captured {slots()} verify graphs and {drafts} drafter graphs in "
              f"{time.perf_counter() - t1:.1f}s", flush=True)

    stats = {m: {c: {"tokens": 0, "s": 0.0, "steps": 0, "acc": 0, "dec": 0.0, "draft": 0.0}
                 for c in CATEGORIES}
             for m in modes}
    rows, errors = [], []
    for i, req in enumerate(reqs):
        prompt = tok.chat(req.prompt)
        max_new = min(args.max_new, req.max_new_tokens)
        # a prompt length's first prefill pays one-time setup (bench/NOTES.md: about 1 s on
        # the H200): paid here, before any mode is timed
        eng.generate(prompt, 1)
        outs = {}
        for m in modes:
            try:
                before, d0 = slots(), draft_s.get(m, 0.0)
                res = eng.generate(prompt, max_new, make(m))
                res.new_slots = slots() - before  # verify graphs captured inside this run
                res.draft_ms = 1e3 * (draft_s.get(m, 0.0) - d0) / max(res.steps, 1)
            except Exception as exc:  # one failure must not lose the rest
                errors.append(f"{req.id} {m}: {exc!r}")
                traceback.print_exc()
                continue
            outs[m] = res
            s = stats[m][req.category]
            s["tokens"] += len(res.tokens)
            s["s"] += res.prefill_s + res.decode_s
            s["steps"] += res.steps
            s["acc"] += sum(res.accepted)
            s["dec"] += res.decode_s
            s["draft"] += res.draft_ms * res.steps / 1e3
        row = {"request": req.id, "category": req.category,
               "tau": {m: round(r.tau, 3) for m, r in outs.items()},
               "step_ms": {m: round(r.step_ms, 3) for m, r in outs.items()},
               "draft_ms": {m: round(r.draft_ms, 3) for m, r in outs.items()},
               "graphs_captured": {m: r.new_slots for m, r in outs.items()}}
        if "ar" in outs:
            forced = None
            for m in outs:
                if m == "ar":
                    continue
                pos = first_divergence(outs["ar"].tokens, outs[m].tokens)
                row[f"{m}_identical"] = pos is None
                if pos is not None and not args.no_force and pos < len(outs["ar"].tokens):
                    try:
                        forced = forced or eng.force(prompt, outs["ar"].tokens, chunk=1)
                        row[f"{m}_div_at"] = pos
                        row[f"{m}_ar_margin_there"] = round(forced.margin[pos], 5)
                    except Exception as exc:
                        errors.append(f"{req.id} force: {exc!r}")
        rows.append(row)
        print(f"  [{i + 1}/{len(reqs)}] {req.id}: " + ", ".join(
            f"{m} τ {r.tau:.2f} {r.tokens_per_s:.1f} tok/s step {r.step_ms:.2f} ms (draft "
            f"{r.draft_ms:.2f}, +{r.new_slots} graphs)" for m, r in outs.items())
            + "".join(f"  {k}={v}" for k, v in row.items() if "identical" in k or "margin" in k),
            flush=True)

    def agg(m, cats):
        s = {k: sum(stats[m][c][k] for c in cats)
             for k in ("tokens", "s", "steps", "acc", "dec", "draft")}
        return {"tau": round(s["acc"] / max(s["steps"], 1), 3),
                "tokens_per_s": round(s["tokens"] / max(s["s"], 1e-9), 2),
                "step_ms": round(1e3 * s["dec"] / max(s["steps"], 1), 3),
                "draft_ms": round(1e3 * s["draft"] / max(s["steps"], 1), 3)}

    table = {m: {c: agg(m, [c]) for c in CATEGORIES} | {"all": agg(m, CATEGORIES)}
             for m in modes}
    report = {"device": torch.cuda.get_device_name() if system.device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": str(eng.model.dtype),
              "block_size": args.block_size, "draft_len": draft_len, "max_new": args.max_new,
              "weights": {"seed": man.seed, "target": man.target_name,
                          "training": man.training, "command": man.command},
              "options": eng.options.as_dict(), "table": table, "rows": rows, "errors": errors}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_block.json").write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}  torch {report['torch']}  {report['dtype']}  block "
          f"{args.block_size}, draft_len {draft_len}, ≤{args.max_new} new tokens")
    cols = [*CATEGORIES, "all"]
    print(f"{'mode':<8}{'':<6}" + "".join(f"{c:>14}" for c in cols))
    for m in modes:
        print(f"{m:<8}{'τ':<6}" + "".join(f"{table[m][c]['tau']:>14}" for c in cols))
        print(f"{'':<8}{'tok/s':<6}" + "".join(f"{table[m][c]['tokens_per_s']:>14}" for c in cols))
        print(f"{'':<8}{'ms/st':<6}" + "".join(f"{table[m][c]['step_ms']:>14}" for c in cols))
        if m != "ar":
            print(f"{'':<8}{'draft':<6}" + "".join(f"{table[m][c]['draft_ms']:>14}" for c in cols))
        if "ar" in table and m != "ar":
            ratio = table[m]["all"]["tokens_per_s"] / max(table["ar"]["all"]["tokens_per_s"], 1e-9)
            # decode alone: tokens a step over ms a step, against AR's one token a step
            dec = (table[m]["all"]["tau"] / max(table[m]["all"]["step_ms"], 1e-9)
                   * table["ar"]["all"]["step_ms"])
            same = sum(bool(r.get(f"{m}_identical")) for r in rows)
            print(f"{'':<8}× AR {ratio:.3f} (decode alone {dec:.3f}); identical to AR on "
                  f"{same}/{len(rows)} requests; "
                  f"margins at divergences: "
                  f"{[r[f'{m}_ar_margin_there'] for r in rows if f'{m}_ar_margin_there' in r]}")
    if errors:
        print("errors:", *errors, sep="\n  ")


if __name__ == "__main__":
    main()
