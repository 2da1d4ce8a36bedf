"""27B-class target step time, bf16 against W12, with stock's model (no CUDA graphs).

One random-weight `dense-27b` target (bf16, std 0.02) on one GPU. A 128-token prompt is
prefilled, then the target's forward at T new tokens per step (T = 1: the AR step; T = 8:
a verify step) is timed with CUDA events (median of --iters, each after a KV-cache
rollback, so every step sees the same context), first with the bf16 weights, then after
`convert_model` (W12, the fused kernel) on the same weights, then with the nested 8-bit
view. Correctness first: W12 logits against bf16 (relative error, same argmax).
Without CUDA graphs the step also pays Python and launch overhead (about 450 linears).

    python bench/gpu_w12_e2e.py --out $OUT        # about 60-90 s on an H200 (not measured)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

T0 = time.perf_counter()


def gib() -> float:
    return torch.cuda.memory_allocated() / 2**30 if DEV == "cuda" else 0.0


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


DEV = "cuda"


def step_ms(net, cache, prompt_len: int, t: int, iters: int) -> tuple[float, torch.Tensor]:
    ids = torch.randint(0, net.cfg.vocab_size, (1, t), device=DEV,
                        generator=torch.Generator(device=DEV).manual_seed(t))
    out = net(ids, cache, prompt_len, logits="last").logits  # warm-up (tunes new shapes)
    times = []
    for _ in range(iters):
        if DEV != "cuda":  # --smoke: plumbing only
            t0 = time.perf_counter()
            net(ids, cache, prompt_len, logits="last")
            times.append(1e3 * (time.perf_counter() - t0))
            continue
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        net(ids, cache, prompt_len, logits="last")
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="dense-27b")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--steps", default="1,8", help="new tokens per timed step")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny-qwen3")
    ap.add_argument("--kernel", default="gemm", choices=("gemm", "gemv"),
                    help="the W12 CUDA kernel (kernels/w12/gemm.py or gemv.py)")
    args = ap.parse_args()
    global DEV
    if args.smoke:
        DEV, args.preset, args.iters = "cpu", "tiny-qwen3", 2
    from kernels.w12.linear import convert_model, set_kernel, set_view
    from stock.config import PRESETS
    from stock.model import Transformer

    steps = [int(s) for s in args.steps.split(",")]
    res = {"preset": args.preset, "iters": args.iters,
           "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)",
           "kernel": args.kernel, "steps": {}}
    cfg = PRESETS[args.preset]
    net = Transformer.random(cfg, DEV, torch.bfloat16, seed=0)
    log(f"{args.preset}: random bf16 target on {res['device']}, {gib():.1f} GiB")
    prompt_len = 128
    cache = net.new_cache(prompt_len + max(steps) + 8)
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=DEV)
    net(prompt, cache, 0, logits="none")
    ref = {}
    for t in steps:
        try:
            ms, out = step_ms(net, cache, prompt_len, t, args.iters)
            ref[t] = out
            res["steps"][t] = {"bf16_ms": ms}
            log(f"bf16 T={t}: {ms:.2f} ms")
        except Exception as exc:  # noqa: BLE001
            res["steps"][t] = {"error": repr(exc)}
            traceback.print_exc()
    t0 = time.perf_counter()
    res["convert"] = convert_model(net)
    set_kernel(net, args.kernel)
    if DEV == "cuda":
        torch.cuda.synchronize()
    res["convert"]["s"] = time.perf_counter() - t0
    log(f"convert_model: {res['convert']['s']:.1f} s, {res['convert']['bits_per_param']:.3f} "
        f"bits/param, {gib():.1f} GiB, kernel {args.kernel}")
    for view in ("w12", "w8"):
        set_view(net, view)
        for t in steps:
            row = res["steps"].setdefault(t, {})
            try:
                ms, out = step_ms(net, cache, prompt_len, t, args.iters)
                row[f"{view}_ms"] = ms
                if t in ref:
                    r, o = ref[t].float(), out.float()
                    row[f"{view}_rel_err"] = ((o - r).norm() / r.norm()).item()
                    row[f"{view}_same_argmax"] = bool((o.argmax(-1) == r.argmax(-1)).all())
                if "bf16_ms" in row:
                    row[f"{view}_speedup"] = row["bf16_ms"] / ms
                log(f"{view} T={t}: {ms:.2f} ms ({row.get(f'{view}_speedup', 0):.3f}x bf16), "
                    f"rel err {row.get(f'{view}_rel_err', float('nan')):.2e}, same argmax "
                    f"{row.get(f'{view}_same_argmax')}")
            except Exception as exc:  # noqa: BLE001
                row[f"{view}_error"] = repr(exc)
                traceback.print_exc()
    print("| T | bf16 ms | W12 ms | W12 × | W8 ms | W8 × |\n| --- | --- | --- | --- | --- | --- |")
    for t, r in res["steps"].items():
        print(f"| {t} | {r.get('bf16_ms', float('nan')):.2f} | {r.get('w12_ms', float('nan')):.2f}"
              f" | {r.get('w12_speedup', float('nan')):.3f} | {r.get('w8_ms', float('nan')):.2f} | "
              f"{r.get('w8_speedup', float('nan')):.3f} |")
    res["total_s"] = time.perf_counter() - T0
    log("done")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_w12_e2e.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
