"""Per-layer pieces of the 27B-class step on one GPU, each 64 times back to back in one CUDA
graph (as a 64-layer step runs them): attention over the static cache (SDPA with the step's
mask, as stock runs it, and stock's Triton decode kernel), and the projections as separate
GEMMs against fused ones (q/k/v as one [10240, 5120] weight, gate/up as one [51200, 5120]).

Weights cycle through distinct copies (more bytes than L2) so every call reads DRAM.
Correctness first: each attention variant is checked against the fp32 reference.

    python bench/gpu_layer_ops.py --out $OUT          # about 60 s on an H200 (estimate)

Prints a table (µs per call: median of --iters graph replays / 64, p10-p90) and writes
gpu_layer_ops.json to --out (default $OUT, else cwd).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.attention import decode_attention, reference_attention  # noqa: E402
from stock.static_step import step_mask  # noqa: E402

H, HQ, HKV, D, I = 5120, 64, 8, 128, 25600
CALLS = 64


def log(msg: str) -> None:
    print(msg, flush=True)


def graph_time(fn, iters: int) -> dict:
    """fn() CALLS times in one CUDA graph; µs per call, median and p10-p90 of iters replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            for j in range(CALLS):
                fn(j)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(CALLS):
            fn(j)
    times = []
    for _ in range(iters + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    times = sorted(times[2:])
    q = statistics.quantiles(times, n=10)
    return {"us": round(statistics.median(times), 2), "p10": round(q[0], 2),
            "p90": round(q[-1], 2)}


def attention_rows(args, rows: list) -> None:
    g = HQ // HKV
    copies = 8
    for kv_len in args.kv:
        slots = kv_len
        ks = [torch.randn(1, HKV, slots, D, device="cuda", dtype=torch.bfloat16)
              for _ in range(copies)]
        vs = [torch.randn(1, HKV, slots, D, device="cuda", dtype=torch.bfloat16)
              for _ in range(copies)]
        for t in args.ts:
            pos = torch.arange(kv_len - t - 7, kv_len - 7, device="cuda")  # a few slots spare
            q = torch.randn(1, HKV, g * t, D, device="cuda", dtype=torch.bfloat16)
            mask = step_mask(pos, kv_len, torch.bfloat16).repeat(g, 1).view(1, 1, g * t, kv_len)
            ref = reference_attention(q.float(), ks[0].float(), vs[0].float(), pos, kv_len)
            row = {"part": "attention", "T": t, "kv_len": kv_len}
            variants = {
                "sdpa": lambda j: F.scaled_dot_product_attention(
                    q, ks[j % copies][:, :, :kv_len], vs[j % copies][:, :, :kv_len],
                    attn_mask=mask),
                "triton": lambda j: decode_attention(q, ks[j % copies], vs[j % copies], pos,
                                                     kv_len),
            }
            for name, fn in variants.items():
                try:
                    err = (fn(0).float() - ref).abs().max().item()
                    row[f"{name}_err"] = round(err, 5)
                    row[name] = graph_time(fn, args.iters)
                except Exception as exc:  # noqa: BLE001 - keep the other variants
                    row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                    traceback.print_exc()
            log(f"attention T={t} kv={kv_len}: " + ", ".join(
                f"{k} {v['us']} us" for k, v in row.items() if isinstance(v, dict))
                + f"  (err sdpa {row.get('sdpa_err')}, triton {row.get('triton_err')})")
            rows.append(row)


def gemm_rows(args, rows: list) -> None:
    copies = args.copies
    shapes = {"qkv": [HQ * D, HKV * D, HKV * D], "gate_up": [I, I]}
    for name, parts in shapes.items():
        ws = [[torch.randn(n, H, device="cuda", dtype=torch.bfloat16) for n in parts]
              for _ in range(copies)]
        fused = [torch.cat(w) for w in ws]
        for m in args.ms:
            x = torch.randn(1, m, H, device="cuda", dtype=torch.bfloat16)
            row = {"part": name, "M": m}
            try:
                row["separate"] = graph_time(
                    lambda j: [F.linear(x, w) for w in ws[j % copies]], args.iters)
                row["fused"] = graph_time(lambda j: F.linear(x, fused[j % copies]), args.iters)
                row["ratio"] = round(row["separate"]["us"] / row["fused"]["us"], 3)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                traceback.print_exc()
            log(f"{name} M={m}: separate {row.get('separate')} fused {row.get('fused')}")
            rows.append(row)
        del ws, fused
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ts", default="1,2,4,8,16")
    ap.add_argument("--kv", default="640,4096")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    args.ts = [int(v) for v in args.ts.split(",")]
    args.kv = [int(v) for v in args.kv.split(",")]
    args.ms = [int(v) for v in args.ms.split(",")]
    if not torch.cuda.is_available():
        sys.exit("gpu_layer_ops: needs a CUDA device")
    rows: list = []
    for part in (attention_rows, gemm_rows):
        try:
            part(args, rows)
        except Exception:  # noqa: BLE001 - keep the other part
            traceback.print_exc()
    log("\n| part | T / M | kv | A µs (p10-p90) | B µs (p10-p90) | A / B |")
    log("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        a, b = ("sdpa", "triton") if r["part"] == "attention" else ("separate", "fused")
        if a in r and b in r:
            log(f"| {r['part']} {a}/{b} | {r.get('T', r.get('M'))} | {r.get('kv_len', '')} | "
                f"{r[a]['us']} ({r[a]['p10']}-{r[a]['p90']}) | "
                f"{r[b]['us']} ({r[b]['p10']}-{r[b]['p90']}) | {r[a]['us'] / r[b]['us']:.2f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_layer_ops.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
