"""Batched speculation projected onto the 27B-class target: the embedded default's real
acceptance, the 27B-class target's step costs (issue 28's "27B-class random target for step
costs; the embedded default for real acceptance").

On the embedded default (a 135M model) a batched step at C = 16 costs about the same for 16
tokens as for 256 (1.15 against 1.60 ms on the H100, docs/results.md 2026-12-06): the step
is bound by kernel latency, so a mechanism that verifies fewer tokens (a shorter draft, a
shared node budget) saves nothing there. On a 27B-class target the step reads 54 GB of
weights and its products grow with the tokens verified (AR: 23.9 ms at 1 row, 30.3 at 128
on the H100, session 26). This script runs each mode on the embedded default as
bench/batch_throughput.py does (2C dev requests, the categories in turn) and records the
shape of every target forward it makes (rows, tokens a row, KV length: the static step's
buckets where it runs), then times a forward of each shape on the random 27B-class target
(`--big`, the same engine code, no drafter) and projects each mode's run as the sum of its
forwards' 27B-class costs:

    projected tok/s = tokens generated / sum over the run's forwards of cost(rows, T, KV)

and each request's time to its first token as the cost of the forwards made before it was
emitted (every request is submitted at once: issue 28's TTFT for prompt admission, whose
riding chunks change which forwards come first), beside the small target's own measured
TTFT.

Left out, and said so in the table: the drafter's own cost (no 27B-class drafter is
shipped), the host's time between steps, and a tree step's own machinery (its forward is
costed as a chain step of the same shape; on the embedded default the tree's attention
kernel took 3.4x the chain's a call). Off CUDA (the smoke) a tree step's dynamic forward is
not recorded: tree modes project on a GPU only.

    python3 bench/batch_projection.py --conc 16 --modes ar,block,block:draft_len=7 --out $OUT
    python3 bench/batch_projection.py --entry batch-mechanisms --conc 16,32 \\
        --modes ar,block,block:node_budget=96,block:dynamic_draft=true     # H100/H200, GGUF staged
    python3 bench/batch_projection.py --smoke   # CPU: tiny-qwen3 stands in for both targets

Prints one table; writes batch_projection.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter

import common  # noqa: F401  (the repository on sys.path)
from common import (embedded_workload, entry_on_path, is_cuda, log, parse_mode, print_table,
                    quantile, smoke_device, write_json)

ENTRY = entry_on_path(sys.argv)   # before stock is imported

import torch  # noqa: E402

from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import batch_engine  # noqa: E402


def load_small(args):
    """(model, requests [(prompt ids, max_new)], stop ids) on the embedded default (or, with
    --smoke, the tiny random target and random prompts)."""
    if args.smoke:
        from stock.config import PRESETS
        from stock.model import Transformer

        net = Transformer.random(PRESETS["tiny-qwen3"], torch.device(args.device),
                                 torch.float32, seed=0)
        gen = torch.Generator().manual_seed(1)
        reqs = [(torch.randint(1, net.cfg.vocab_size, (12,), generator=gen).tolist(),
                 args.max_new) for _ in range(2 * max(args.conc))]
        return net, reqs, frozenset()
    return embedded_workload(args.device, args.max_new, 2 * max(args.conc))


class Shapes:
    """Every target forward of a BatchEngine, as (rows, tokens a row, KV length): the
    static step's slot (its buckets) where the step runs in CUDA graphs, else the dynamic
    forward's own sizes; counted (`seen`) and in order (`order`), so that a request's time
    to its first token can be costed as the forwards made before it (`watch`)."""

    def __init__(self, engine):
        self.seen: Counter = Counter()
        self.order: list[tuple[int, int, int]] = []
        runner = engine.runner
        if runner is not None:
            inner_slot = runner.slot

            def slot(b, t, kv_len, *a, **kw):
                self.note((b, t, kv_len))
                return inner_slot(b, t, kv_len, *a, **kw)
            runner.slot = slot
        inner_forward = engine._forward

        def forward(seqs, rows, starts, *a, **kw):
            t = max(len(s) for s in seqs)
            self.note((len(seqs), t, max(starts) + t))
            return inner_forward(seqs, rows, starts, *a, **kw)
        engine._forward = forward

    def note(self, shape: tuple[int, int, int]) -> None:
        self.seen[shape] += 1
        self.order.append(shape)

    def watch(self, requests) -> list:
        """For each request, filled when its first token is emitted: [forwards made by
        then, seconds since this call] (None until then)."""
        t0, first = time.perf_counter(), [None] * len(requests)

        def on_tokens(out, i):
            if first[i] is None:
                first[i] = [len(self.order), time.perf_counter() - t0]
        for i, r in enumerate(requests):
            r.on_tokens = lambda out, i=i: on_tokens(out, i)
        return first


def projected_ttft(order: list, first: list, cost: dict) -> list[float]:
    """Each request's time to its first token on the big target: the summed cost of the
    forwards made before its first token was emitted (every request submitted at once)."""
    prefix, acc = [0.0], 0.0
    for shape in order:
        acc += cost[shape]
        prefix.append(acc)
    return [prefix[f[0]] for f in first if f is not None]


def run(engine, reqs, rec: Shapes | None = None) -> dict:
    """Submit every request at once and step to the end: tokens, wall seconds, τ; with a
    recorder, each request's first token ([forwards before it, seconds]: "first")."""
    t0 = time.perf_counter()
    subs = [engine.submit(p, m) for p, m in reqs]
    first = rec.watch(subs) if rec is not None else []
    engine.run()
    gained = [a for r in subs for a in r.accepted]
    return {"tokens": sum(len(r.tokens) for r in subs), "wall_s": time.perf_counter() - t0,
            "tau": statistics.mean(gained) if gained else float("nan"), "first": first}


def step_cost(big, shape: tuple[int, int, int], iters: int) -> float:
    """Median seconds of one forward of `shape` (rows, tokens a row, KV length) on the big
    target's BatchEngine: its static step (CUDA graphs) where it runs, else the dynamic
    forward (and for a prefill chunk longer than the static step's largest tokens bucket,
    which the small engine's dynamic forward took too). Random tokens; the KV slots hold
    whatever they hold (the cost does not read them)."""
    b, t, kv = shape
    kv = min(kv, big.max_context)
    gen = torch.Generator().manual_seed(b * 131 + t)
    seqs = [torch.randint(1, big.model.cfg.vocab_size, (t,), generator=gen).tolist()
            for _ in range(b)]
    starts, rows = [max(0, kv - t)] * b, list(range(b))
    if big.runner is not None and t <= big.runner.buckets[-1]:   # as the small engine ran it
        def once():
            return big.runner.step(seqs, starts, rows)   # ends in its host read
    else:
        def once():
            return big._forward(seqs, rows, starts)
    once()   # warm: its graph captured, its code compiled
    times = []
    for _ in range(iters):
        if is_cuda(big.model.device):
            torch.cuda.synchronize()
        s = time.perf_counter()
        once()
        if is_cuda(big.model.device):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - s)
    return statistics.median(times)


def ms(seconds: list[float], pct: float) -> str:
    """The pct-th percentile of `seconds` (common.quantile), in ms, for a table cell."""
    return f"{1e3 * quantile(seconds, pct / 100):.0f}" if seconds else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=None, help="default ar,block (--smoke: ar,ngram)")
    ap.add_argument("--conc", default=None, help="concurrencies (default 16; --smoke 2)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--big", default="dense-27b", help="the random target costed (a preset)")
    ap.add_argument("--iters", type=int, default=5, help="timed forwards a shape")
    ap.add_argument("--device", default=None)
    ap.add_argument("--entry", default=None,
                    help="apply this memory entry (and its dependencies) to a copy first")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-qwen3 for both targets")
    args = ap.parse_args()
    if args.smoke:
        args.modes, args.conc, args.max_new, args.big, args.iters = (
            args.modes or "ar,ngram", args.conc or "2", 6, "tiny-qwen3", 2)
    args.device = smoke_device(args)
    args.conc = [int(c) for c in (args.conc or "16").split(",")]
    modes = (args.modes or "ar,block").split(",")
    model, reqs, stops = load_small(args)
    ctx = max(len(p) for p, _ in reqs) + args.max_new + 8
    log(f"small target on {args.device}: {len(reqs)} requests, context {ctx}, modes {modes}")
    runs, shapes, orders = {}, {}, {}
    for mode in modes:
        name, opts = parse_mode(mode)
        base = Engine(model, Options(opts), ctx, set(stops))
        for c in args.conc:
            eng = batch_engine(base, None if name == "ar" else name, c)
            work = reqs[: 2 * c]
            run(eng, work)   # warm: graphs captured, code compiled
            rec = Shapes(eng)
            runs[(mode, c)] = run(eng, work, rec)
            shapes[(mode, c)] = rec.seen
            orders[(mode, c)] = rec.order
            log(f"{mode}@{c}: {runs[(mode, c)]['tokens']} tokens, "
                f"{sum(rec.seen.values())} forwards of {len(rec.seen)} shapes")
    del model
    if is_cuda(args.device):
        torch.cuda.empty_cache()
    from stock.config import PRESETS
    from stock.model import Transformer

    dtype = torch.bfloat16 if is_cuda(args.device) else torch.float32
    big_net = Transformer.random(PRESETS[args.big], torch.device(args.device), dtype, seed=0)
    big = batch_engine(Engine(big_net, Options(), ctx, set()), None, max(args.conc))
    wanted = sorted({s for seen in shapes.values() for s in seen})
    log(f"{args.big}: timing {len(wanted)} forward shapes, {args.iters} times each")
    cost = {s: step_cost(big, s, args.iters) for s in wanted}
    rows, out = [], {"small_device": str(args.device), "big": args.big, "modes": {}}
    for c in args.conc:
        ar = runs.get(("ar", c))
        ar_proj = (ar["tokens"] / sum(n * cost[s] for s, n in shapes[("ar", c)].items())
                   if ar else None)
        for mode in modes:
            r, seen = runs[(mode, c)], shapes[(mode, c)]
            big_s = sum(n * cost[s] for s, n in seen.items())
            proj = r["tokens"] / big_s
            tokens_verified = sum(n * s[0] * s[1] for s, n in seen.items())
            ttft = projected_ttft(orders[(mode, c)], r["first"], cost)
            small_ttft = [f[1] for f in r["first"] if f is not None]
            out["modes"][f"{mode}@{c}"] = {
                **r, "forwards": sum(seen.values()), "tokens_verified": tokens_verified,
                "big_s": big_s, "projected_tok_s": proj, "projected_ttft_s": ttft,
                "shapes": {f"{b}x{t}@{kv}": n for (b, t, kv), n in sorted(seen.items())}}
            rows.append([mode, c, f"{r['tau']:.2f}", f"{r['tokens'] / r['wall_s']:.0f}",
                         ms(small_ttft, 50), sum(seen.values()), tokens_verified,
                         f"{1e3 * big_s:.0f}", f"{proj:.1f}",
                         f"{proj / ar_proj:.2f}" if ar_proj else "", ms(ttft, 50),
                         ms(ttft, 100)])
    out["costs_ms"] = {f"{b}x{t}@{kv}": 1e3 * v for (b, t, kv), v in sorted(cost.items())}
    print(f"\nsmall target: {'tiny-qwen3 (smoke)' if args.smoke else 'embedded default'}, "
          f"{args.device}; step costs: random {args.big}, {args.device}"
          f"{', entry ' + ENTRY + ' applied' if ENTRY else ''}. Projected: target forwards "
          "only (no drafter, no host time; tree steps costed as chain steps of their shape)")
    print_table(["mode", "C", "τ", "small tok/s (measured)", "small TTFT p50 ms (measured)",
                 "forwards", "tokens verified", f"{args.big} forwards ms", "projected tok/s",
                 "× AR (projected)", "TTFT p50 ms (projected)", "TTFT max ms (projected)"],
                rows)
    print_table(["rows x tokens @ KV", f"{args.big} ms"],
                [[k, f"{v:.2f}"] for k, v in out["costs_ms"].items()])
    write_json(args.out, "batch_projection.json", out)


if __name__ == "__main__":
    main()
