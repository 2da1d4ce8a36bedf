"""What the batched engine's preparation costs: every slot's graphs, static sizes against
dynamic ones, side by side in one run.

BatchEngine.prepare makes every slot a request below the context can meet: (requests
bucket, tokens bucket, KV bucket) for the verification step, and the batched block
drafter's (rows bucket, KV bucket) and context-update slots; on CUDA each is captured into a
CUDA graph after warm-up forwards, which is where torch.compile compiles the step's regions
(stock/compiled.py). With static sizes the regions compile once per (requests, tokens)
bucket pair; with dynamic ones (stock.compiled.requests_dynamic, DYNAMIC_SIZES) once per
tokens regime. Each configuration runs in a fresh process with an empty inductor cache
(TORCHINDUCTOR_CACHE_DIR in a temporary folder), so neither reads the other's code. Per
configuration: slots made, FX graphs compiled, seconds in the compiler
(stock.compiled.compile_seconds) and seconds for the whole preparation; with `--serve N`
also the prepared engine's throughput: N requests submitted at once (as
bench/batch_throughput.py loads and runs them: the dev requests, chat-templated, on the
embedded default; random prompts of 40 tokens on random weights),
once untimed, then --repeats timed runs, the median tokens/s and its spread, and every
configuration's outputs against the first's (dynamic sizes must not change a token in
fp32; in bf16 the count of outputs that differ is printed, not hidden).

On the CPU (`--smoke`, or --device cpu) there are no CUDA graphs: the static path's slots are
made and each is computed once eagerly through the compiled regions (dynamo's "eager"
backend by default, `--backend inductor` for inductor's C++ code), which is what compiles.

    python3 bench/batch_prepare.py --target embedded --drafter block --batch 16 --draft-len 15
        # GPU: the throughput verdict's preparation (controller.prepare), per worker
    python3 bench/batch_prepare.py --target embedded --drafter block --serve 32
        # GPU: and the prepared engine's tokens/s at C = 16, static against dynamic sizes
    python3 bench/batch_prepare.py --smoke          # CPU: random:tiny-qwen3, AR, eager backend
    python3 bench/batch_prepare.py --smoke --batch 8 --backend inductor   # inductor's C++

Prints one table; writes batch_prepare.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import common  # noqa: F401  (the repository on sys.path)
from common import ROOT, log, print_table, smoke_device, write_json


def child(args) -> dict:
    """One configuration in this process: the engine built, prepared, counted."""
    from types import SimpleNamespace

    import torch

    import stock.batch as batch_mod
    from batch_throughput import load
    from stock import compiled as C
    from stock.engine import Engine
    from stock.options import Options
    from stock.system import batch_engine

    C.DYNAMIC_SIZES = args.child == "dynamic"
    cuda = torch.device(args.device).type == "cuda"
    opts = Options({"draft_len": args.draft_len})
    # the target and its requests as batch_throughput.py loads them (random prompts of 40
    # tokens on random weights; the dev requests, chat-templated, on the embedded default)
    model, reqs, stops = load(SimpleNamespace(target=args.target, device=args.device, waves=1,
                                              conc=[max(1, args.serve)], prompt=40,
                                              max_new=args.max_new))
    engine = Engine(model, opts, args.context, set(stops))
    if not cuda:   # the static path computed eagerly through the compiled regions
        C.BACKEND = args.backend
        batch_mod.compile_enabled = lambda options, device: True
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    t0 = time.perf_counter()
    if cuda:
        be = batch_engine(engine, None if args.drafter == "ar" else args.drafter, args.batch)
        slots = be.prepare(args.end)
    else:
        if args.drafter != "ar":
            raise SystemExit("on the CPU only --drafter ar (the verification step's slots)")
        be = batch_mod.BatchEngine(model, opts, max_batch=args.batch, max_context=args.context,
                                   prefill_chunk=args.prefill_chunk, static=True, capture=False)
        slots = be.prepare(args.end)
        runner = be.runner
        for s in runner.slots.values():
            runner._scratch(s)
            runner._compute(s)
    seconds = time.perf_counter() - t0
    out = {"config": args.child, "slots": slots, "graphs": C.graphs_compiled(),
           "compile_s": round(C.compile_seconds(), 2), "prepare_s": round(seconds, 2),
           "fallbacks": len(C.fallbacks())}
    if args.serve:
        out.update(serve(be, reqs[:args.serve], args.repeats))
    return out


def serve(be, reqs, repeats: int) -> dict:
    """The requests through the prepared engine (batch_throughput.run: all submitted at
    once): once untimed, then `repeats` times timed."""
    import statistics

    from batch_throughput import run

    run(be, reqs)
    runs = [run(be, reqs) for _ in range(repeats)]
    rates = sorted(r["tok_s"] for r in runs)
    return {"tok_s": statistics.median(rates), "tok_s_min": rates[0], "tok_s_max": rates[-1],
            "outputs": runs[0]["outputs"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded", help="embedded or random:<preset>")
    ap.add_argument("--drafter", default="block", help="ar or block (the batched drafter)")
    ap.add_argument("--batch", type=int, default=None,
                    help="max_batch (concurrency; 16, with --smoke 2)")
    ap.add_argument("--draft-len", type=int, default=15)
    ap.add_argument("--end", type=int, default=425,
                    help="contexts below this (the controller: longest prompt + max_new + 64)")
    ap.add_argument("--context", type=int, default=1024, help="the engine's max context")
    ap.add_argument("--configs", default="static,dynamic")
    ap.add_argument("--serve", type=int, default=0,
                    help="then serve this many requests at once: tokens/s (0: none)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="eager", help="CPU only: eager or inductor")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="CPU only: the engine's prefill chunk (default 256, --smoke 4; the "
                         "largest tokens bucket made is min(this, 64) or draft_len + 1)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU: random:tiny-qwen3, AR, draft_len 3, prefill chunks of 4 "
                         "(tokens buckets 1, 2, 4: 6 slots), contexts below 100")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    args.device = smoke_device(args)
    if args.smoke:
        # the fewest slots that still tell static sizes from dynamic ones: requests buckets 1
        # and 2 by tokens buckets 1, 2 and 4 (each slot is traced once, ~1 s on the CPU)
        args.target, args.drafter, args.draft_len = "random:tiny-qwen3", "ar", 3
        args.end, args.context, args.prefill_chunk = 100, 256, args.prefill_chunk or 4
        args.serve, args.max_new, args.repeats = args.serve or 8, 16, 2
    args.batch = args.batch or (2 if args.smoke else 16)
    args.prefill_chunk = args.prefill_chunk or 256
    if args.child:
        print(json.dumps(child(args)))
        return
    rows, res = [], []
    for config in args.configs.split(","):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--child", config, "--target", args.target,
                   "--drafter", args.drafter, "--batch", str(args.batch), "--draft-len",
                   str(args.draft_len), "--end", str(args.end), "--context", str(args.context),
                   "--backend", args.backend, "--prefill-chunk", str(args.prefill_chunk),
                   "--device", args.device, "--serve",
                   str(args.serve), "--max-new", str(args.max_new), "--repeats",
                   str(args.repeats)]
            log(f"{config}: {args.target}, {args.drafter}, max_batch {args.batch}, "
                f"draft_len {args.draft_len}, contexts below {args.end}")
            out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
            if out.returncode:
                sys.stderr.write(out.stderr[-3000:])
                raise SystemExit(f"{config}: the child failed (exit {out.returncode})")
            r = json.loads(out.stdout.strip().splitlines()[-1])
        log(f"{config}: {r['slots']} slots, {r['graphs']} graphs compiled, "
            f"{r['compile_s']} s compiling, {r['prepare_s']} s in all")
        res.append(r)
        rows.append([config, r["slots"], r["graphs"], f"{r['compile_s']:.1f}",
                     f"{r['prepare_s']:.1f}", r["fallbacks"]])
    base = res[0]["prepare_s"]
    cols = ["sizes", "slots", "graphs compiled", "compile s", "prepare s", "fallbacks",
            f"{res[0]['config']} / this"]
    for row, r in zip(rows, res):
        row.append(f"{base / r['prepare_s']:.2f}" if r["prepare_s"] else "")
        if args.serve:
            same = sum(a == b for a, b in zip(r["outputs"], res[0]["outputs"]))
            row += [f"{r['tok_s']:.0f} ({r['tok_s_min']:.0f}-{r['tok_s_max']:.0f})",
                    f"{r['tok_s'] / res[0]['tok_s']:.3f}", f"{same}/{len(r['outputs'])}"]
    if args.serve:
        cols += ["tok/s, median (min-max)", f"x {res[0]['config']}",
                 f"outputs = {res[0]['config']}'s"]
    print_table(cols, rows,
                f"BatchEngine.prepare on {args.device} ({args.target}, {args.drafter}, max_batch "
                f"{args.batch}, draft_len {args.draft_len}, backend "
                f"{'inductor' if args.device.startswith('cuda') else args.backend})")
    write_json(args.out, "batch_prepare.json", {"args": vars(args), "results": res})


if __name__ == "__main__":
    main()
