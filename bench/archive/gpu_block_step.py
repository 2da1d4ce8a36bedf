"""Where a block-drafter step's time goes, without the embedded model's files.

The target is the embedded model's shape (`smollm2-135m` preset) with random bf16 weights and
the drafter a randomly initialised BlockNet of the shipped shape: τ is about 1 here, but a
step's shapes (verify 16 tokens, one block forward, top-k, context update) are those of the
real drafter, so ms per step and its split are representative. For AR, n-gram, block
(eager drafter) and block with `block_graphs`: ms per decoding step, ms inside draft(), and a
torch.profiler table of one block step's kernels (GPU time by kernel name, launches).

    python3 bench/gpu_block_step.py --out $OUT        # H200, about 60 s (estimate)
    python3 bench/gpu_block_step.py --device cpu --max-new 8   # plumbing only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from gpu_block import time_drafts  # noqa: E402  (this script's folder is sys.path[0])
from stock.config import PRESETS  # noqa: E402
from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.options import resolve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (random ids)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = PRESETS["smollm2-135m"]
    target = Transformer.random(cfg, dev, dtype, seed=0)
    opts = resolve([f"block_size={args.block_size}", f"draft_len={args.block_size - 1}"])
    eng = Engine(target, opts, 2048)
    torch.manual_seed(0)
    bnet = BlockNet(BlockConfig.for_target(cfg, block_size=args.block_size))
    with torch.no_grad():
        for p in bnet.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt,), generator=g).tolist()
    draft_s: dict[str, float] = {}

    def make(mode: str):
        if mode == "ar":
            return None
        if mode == "ngram":
            d = NGramDrafter(opts["ngram_max"], opts["ngram_min"], opts["lattice_topk"])
        else:
            d = BlockDrafter(bnet, target, eng.max_context, opts["block_topk"],
                             graphs=mode == "block-graphs")
        return time_drafts(d, mode, draft_s)

    modes = ["ar", "ngram", "block"] + (["block-graphs"] if dev.type == "cuda" else [])
    rows = {}
    for m in modes:
        eng.generate(prompt, args.max_new, make(m))  # warm-up: graphs, allocator
        draft_s.clear()
        res = eng.generate(prompt, args.max_new, make(m))
        rows[m] = {"step_ms": round(res.step_ms, 3), "steps": res.steps,
                   "tau": round(res.tau, 3),
                   "draft_ms": round(1e3 * draft_s.get(m, 0.0) / max(res.steps, 1), 3)}
        print(f"{m:<13} step {res.step_ms:7.3f} ms  draft {rows[m]['draft_ms']:7.3f} ms  "
              f"steps {res.steps}  τ {res.tau:.2f}", flush=True)
    prof = {}
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        for m in ("block", "block-graphs"):
            d = make(m)
            eng.generate(prompt, 16, d)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                eng.generate(prompt, 32, d)
            table = p.key_averages().table(sort_by="cuda_time_total", row_limit=25)
            prof[m] = table
            print(f"\n== profiler, {m}, one generate of 32 tokens (prefill included)\n{table}",
                  flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_block_step.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
             "rows": rows, "profile": prof}, indent=1))


if __name__ == "__main__":
    main()
