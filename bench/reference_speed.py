"""Stock's reference pass (the judges' `reference_pass`) with its speculative engine kept
across requests against a fresh one a request (the code before 2026-12-06), side by side.

A controller verdict starts by computing stock's reference for every measured request (256
on the embedded default at C = 16: 2 m 20 s of a 7.5-minute verdict on the H100, 63 % of it
the ngram-speculative generation). The worker made a new `Engine` for that generation per
request, whose graph runner then captured its CUDA graphs again each time; it now keeps one
(`worker_main.speculative_engine`). This times both on one engine, the requests
interleaved (fresh, kept, fresh, kept, ...) after one warm-up request of each, and prints
per mode the seconds of each part (generation, forced pass, noise pass) and per request.

    python3 bench/reference_speed.py                       # GPU: smollm2-135m shapes, random bf16
    python3 bench/reference_speed.py --preset dense-27b --requests 4
    python3 bench/reference_speed.py --smoke               # CPU: tiny-qwen3, fp32, plumbing only

Random weights: the outputs mean nothing, but both modes compute the same tokens (the table
counts requests whose tokens differ between the two: 0 expected).
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import log, print_table  # noqa: F401 - sets sys.path first

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--draft-len", type=int, default=16, help="gates.reference_draft_len")
    ap.add_argument("--chunk", type=int, default=9, help="gates.chunk")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-qwen3, 2 requests, fp32")
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.device, args.requests, args.prompt, args.max_new = (
            "tiny-qwen3", "cpu", 2, 8, 8)
    from specpilot.judges import worker_main
    from specpilot.judges.worker_main import reference_pass
    from stock.config import PRESETS
    from stock.engine import Engine
    from stock.model import Transformer
    from stock.options import Options

    torch.manual_seed(0)
    dev = torch.device(args.device)
    net = Transformer.random(PRESETS[args.preset], dev,
                             torch.bfloat16 if dev.type == "cuda" else torch.float32)
    engine = Engine(net, Options({}), 1024, set())   # as the judges' worker builds stock's
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, net.cfg.vocab_size, (args.prompt,), generator=g).tolist()
               for _ in range(args.requests + 1)]
    log(f"{args.preset} on {dev}: {args.requests} requests of {args.prompt} + {args.max_new}")

    def one(mode: str, ids: list[int]) -> tuple[dict, float]:
        if mode == "fresh":   # as before: nothing kept, a new engine (and graph runner)
            worker_main._SPECULATIVE.pop(engine, None)
        t0 = time.perf_counter()
        rep = reference_pass(engine, ids, args.max_new, args.draft_len, args.chunk)
        return rep, time.perf_counter() - t0

    for mode in ("fresh", "kept"):   # warm-up: compiles, and the kept engine's graphs
        one(mode, prompts[0])
    walls = {"fresh": [], "kept": []}
    parts = {"fresh": {}, "kept": {}}
    tokens = {"fresh": [], "kept": []}
    for i, ids in enumerate(prompts[1:]):
        for mode in ("fresh", "kept") if i % 2 == 0 else ("kept", "fresh"):
            rep, wall = one(mode, ids)
            walls[mode].append(wall)
            tokens[mode].append(rep["tokens"])
            for k, v in rep.get("seconds", {}).items():
                parts[mode][k] = parts[mode].get(k, 0.0) + v
        log(f"request {i + 1}/{args.requests}")
    differ = sum(a != b for a, b in zip(tokens["fresh"], tokens["kept"]))
    rows = []
    for mode in ("fresh", "kept"):
        p = parts[mode]
        rows.append([mode, args.requests, f"{sum(walls[mode]):.2f}",
                     f"{1e3 * statistics.median(walls[mode]):.0f}",
                     f"{p.get('generate', 0.0):.2f}", f"{p.get('forced', 0.0):.2f}",
                     f"{p.get('noise', 0.0):.2f}",
                     f"{sum(walls['fresh']) / max(sum(walls[mode]), 1e-9):.2f}"])
    print(f"\n{args.preset}, {dev}, {args.prompt}-token prompts, {args.max_new} new tokens, "
          f"ngram draft_len {args.draft_len}, forced chunk {args.chunk}; "
          f"requests whose tokens differ between the modes: {differ}\n")
    print_table(["speculative engine", "requests", "total s", "median ms a request",
                 "generate s", "forced s", "noise s", "fresh / this"], rows)


if __name__ == "__main__":
    main()
