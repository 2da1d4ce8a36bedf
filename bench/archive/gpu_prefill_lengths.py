"""What a prompt length's first prefill costs, and which attention backend pays it.

On the H200 some requests' AR runs spent about 1 s outside their decode steps, once per
process and prompt (bench/NOTES.md), when prompts over 64 tokens took the dynamic prefill
(SDPA with a causal mask); option graph_prefill now prefills every prompt in static steps of
64 tokens (`--opt graph_prefill=false` for the dynamic prefill). Here each prompt length is
prefilled twice in a row
(`generate(prompt, 1)`: prefill and one token), first and second call timed, under SDPA's
default backend choice and restricted to each backend in turn (every variant gets lengths of
its own, so each of its first calls meets a length new to the process).

    python3 bench/gpu_prefill_lengths.py --out $OUT     # H200, embedded shape, random weights
    python3 bench/gpu_prefill_lengths.py --opt graph_prefill=false --out $OUT  # dynamic
    python3 bench/gpu_prefill_lengths.py --preset dense-27b --variants default \
        --lengths 64,128,256,512 --opt graph_prefill_max=1024   # 27B-class, chunked
    python3 bench/gpu_prefill_lengths.py --device cpu   # plumbing only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from stock.config import PRESETS  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.options import resolve  # noqa: E402

BACKENDS = {"default": None, "cudnn": [SDPBackend.CUDNN_ATTENTION],
            "efficient": [SDPBackend.EFFICIENT_ATTENTION], "flash": [SDPBackend.FLASH_ATTENTION],
            "math": [SDPBackend.MATH]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lengths", default="80,113,203,301", help="prompt lengths per variant")
    ap.add_argument("--variants", default="default,cudnn,efficient,math")
    ap.add_argument("--opt", action="append", default=[], help="engine option NAME=VALUE")
    ap.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS),
                    help="model shape (random weights), e.g. dense-27b")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    cfg = PRESETS[args.preset]
    model = Transformer.random(cfg, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32,
                               seed=0)
    eng = Engine(model, resolve(args.opt), 2048)
    gen = torch.Generator().manual_seed(0)
    eng.generate(torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist(), 2)  # warm-up
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    print(f"options: {' '.join(args.opt) or 'defaults'}", flush=True)
    for i, name in enumerate(args.variants.split(",")):
        ctx = (lambda b=BACKENDS[name]: sdpa_kernel(b) if b else nullcontext())  # noqa: E731
        for n in lengths:
            n += i  # a length no earlier variant used
            prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
            ms = []
            try:
                with ctx():
                    for _ in range(2):
                        t = time.perf_counter()
                        eng.generate(prompt, 1)
                        ms.append(1e3 * (time.perf_counter() - t))
            except RuntimeError as exc:  # a backend that does not take this call
                rows.append({"variant": name, "length": n, "error": str(exc)[:120]})
                print(f"{name:<10} {n:>5}  error: {str(exc)[:100]}", flush=True)
                continue
            rows.append({"variant": name, "length": n, "first_ms": round(ms[0], 2),
                         "second_ms": round(ms[1], 2)})
            print(f"{name:<10} {n:>5}  first {ms[0]:9.2f} ms  second {ms[1]:8.2f} ms", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = "_".join([args.preset] * (args.preset != "smollm2-135m")
                       + [o.replace("=", "-") for o in args.opt]) or "defaults"
        Path(args.out, f"gpu_prefill_lengths_{tag}.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
             "torch": torch.__version__, "options": args.opt, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
