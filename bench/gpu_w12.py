"""W12 fused GEMM against cuBLAS bf16 on 27B-class layer shapes (one H200 run, <= 120 s).

1. Copy bandwidth: a device-to-device copy of 1 GiB (read + write bytes over time).
2. For K x N in 5120x15360, 5120x34816, 17408x5120, 5120x151936 (random normal weights,
   std 0.02, bf16): GPU encode; exact-weight check (decode == weight, bitwise); on the first
   shape the GPU encoder against the CPU encoder (first 4096 rows, every plane bitwise).
3. For M in 1, 2, 4, 8, 16, 32, 64: correctness first (W12 against cuBLAS on the same
   weights, W8 against x @ decode_w8^T: max abs and relative error), then medians of
   triton.testing.do_bench (L2 flushed between runs) for cuBLAS (torch.matmul), W12 fused
   and the W8 view. Effective GB/s = bytes the kernel reads (weight planes, exceptions,
   x) / time; % copy = that over the measured copy bandwidth.

    python bench/gpu_w12.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

if "kernels" not in sys.modules and not any(Path(p, "kernels").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

SHAPES = [(5120, 15360), (5120, 34816), (17408, 5120), (5120, 151936)]  # K x N
MS = [1, 2, 4, 8, 16, 32, 64]
T0 = time.perf_counter()
XDTYPE = torch.bfloat16


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


DEV = "cuda"


def bench(fn, rep_ms: int = 30) -> float:
    """Median µs of fn (triton.testing.do_bench: L2 flushed before each run)."""
    from triton.testing import do_bench

    if DEV == "cpu":  # --smoke: plumbing only, no meaningful time
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    return 1000.0 * do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def copy_bandwidth(result: dict) -> float:
    n = (1 << 30) // 2 if DEV == "cuda" else 1 << 16
    a = torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_()
    b = torch.empty_like(a)
    us = bench(lambda: b.copy_(a), rep_ms=100)
    gbs = 2 * a.numel() * 2 / us / 1e3  # read + write
    result["copy"] = {"bytes": 2 * a.numel() * 2, "us": us, "GB_s": gbs}
    log(f"copy {2 * n / 2**30:.3g} GiB: {us:.1f} µs, {gbs:.0f} GB/s (read + write)")
    del a, b
    return gbs


def encoder_check(w: torch.Tensor, t, result: dict) -> None:
    from kernels.w12 import encode

    rows = min(4096, w.shape[0])
    t0 = time.perf_counter()
    cpu = encode(w[:rows].cpu())
    gpu = encode(w[:rows])
    same = {name: bool(torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()))
            for name in ("hi", "lo", "base", "exc_idx", "exc_val")}
    result["gpu_vs_cpu_encoder"] = {"rows": rows, "cols": w.shape[1], "identical": same,
                                    "s": time.perf_counter() - t0}
    log(f"GPU encoder vs CPU encoder on {rows}x{w.shape[1]}: {same}")


def read_bytes(t, m: int, k: int, view: str) -> int:
    planes = t.hi.numel() + (t.lo.numel() if view == "w12" else 0)
    other = t.base.numel() + t.row_ptr().numel() * 4 + t.exc_idx.numel() * t.exc_idx.element_size() \
        + t.exc_val.numel() * 2
    return planes + other + m * k * 2


def run_shape(k: int, n: int, copy_gbs: float, result: dict, first: bool, deadline: float):
    from kernels.w12 import encode
    from kernels.w12.format import decode_w8
    from kernels.w12.gemm import _TUNED, _key, w12_matmul

    g = torch.Generator(device=DEV).manual_seed(k + n)
    w = (torch.randn(n, k, device=DEV, generator=g) * 0.02).to(torch.bfloat16)
    sync()
    t0 = time.perf_counter()
    t = encode(w)
    sync()
    enc_s = time.perf_counter() - t0
    exact = bool(torch.equal(t.decode().view(torch.int16), w.view(torch.int16)))
    shape = {"K": k, "N": n, "encode_s": enc_s, "decode_bit_exact": exact,
             "bits_per_param": t.bits_per_param, "exceptions": t.num_exceptions,
             "exception_rate": t.exception_rate, "rows": []}
    result["shapes"].append(shape)
    log(f"{k}x{n}: GPU encode {enc_s:.2f} s, decode bit-exact {exact}, "
        f"{t.bits_per_param:.3f} bits/param, {t.num_exceptions} exceptions")
    if first:
        try:
            encoder_check(w, t, result)
        except Exception as exc:  # noqa: BLE001
            result["gpu_vs_cpu_encoder"] = {"error": repr(exc)}
            traceback.print_exc()
    w8 = decode_w8(t)
    for m in MS:
        if time.perf_counter() > deadline:
            log(f"deadline reached: skipping {k}x{n} M={m}..")
            shape["skipped_from_M"] = m
            break
        row = {"M": m}
        shape["rows"].append(row)
        try:
            x = torch.randn(m, k, device=DEV, generator=g).to(XDTYPE)
            ref = torch.matmul(x, w.T.to(x.dtype))
            y12 = w12_matmul(x, t, "w12")
            y8 = w12_matmul(x, t, "w8")
            ref8 = torch.matmul(x, w8.T.to(x.dtype))
            for name, y, r in (("w12", y12, ref), ("w8", y8, ref8)):
                d = (y.float() - r.float()).abs()
                row[f"{name}_max_abs_err"] = d.max().item()
                row[f"{name}_rel_err"] = ((y.float() - r.float()).norm() / r.float().norm()).item()
            row["ref_max_abs"] = ref.float().abs().max().item()
            row["cublas_us"] = bench(lambda: torch.matmul(x, w.T.to(x.dtype)))
            row["w12_us"] = bench(lambda: w12_matmul(x, t, "w12"))
            row["w8_us"] = bench(lambda: w12_matmul(x, t, "w8"))
            row["cublas_GB_s"] = (n * k * 2 + m * k * 2) / row["cublas_us"] / 1e3
            row["w12_GB_s"] = read_bytes(t, m, k, "w12") / row["w12_us"] / 1e3
            row["w8_GB_s"] = read_bytes(t, m, k, "w8") / row["w8_us"] / 1e3
            row["w12_speedup"] = row["cublas_us"] / row["w12_us"]
            row["w8_speedup"] = row["cublas_us"] / row["w8_us"]
            row["w8_over_w12"] = row["w12_us"] / row["w8_us"]
            for name in ("cublas", "w12", "w8"):
                row[f"{name}_pct_copy"] = 100.0 * row[f"{name}_GB_s"] / copy_gbs if copy_gbs else None
            for view in ("w12", "w8"):
                cfg = _TUNED.get(_key(m, t, view, x.dtype)) or _TUNED.get(_key(1, t, view, x.dtype))
                row[f"{view}_config"] = repr(cfg)
            pc = row["w12_pct_copy"]
            log(f"{k}x{n} M={m:2d}: cuBLAS {row['cublas_us']:7.1f} µs | W12 {row['w12_us']:7.1f} µs "
                f"({row['w12_speedup']:.2f}x, {row['w12_GB_s']:.0f} GB/s"
                + (f", {pc:.0f}% copy" if pc else "") + f") | W8 {row['w8_us']:7.1f} µs "
                f"({row['w8_speedup']:.2f}x; {row['w8_over_w12']:.2f}x W12) | err W12 "
                f"{row['w12_max_abs_err']:.2e} W8 {row['w8_max_abs_err']:.2e}")
        except Exception as exc:  # noqa: BLE001
            row["error"] = repr(exc)
            traceback.print_exc()
    del w, w8, t
    if DEV == "cuda":
        torch.cuda.empty_cache()


def table(result: dict) -> str:
    lines = ["| K x N | M | cuBLAS µs | W12 µs | W8 µs | W12 × | W8 × | W8/W12 | W12 GB/s | "
             "W12 % copy | W8 GB/s | cuBLAS GB/s | W12 max err |",
             "|" + " --- |" * 13]
    for s in result["shapes"]:
        for r in s["rows"]:
            if "w12_us" not in r:
                lines.append(f"| {s['K']}x{s['N']} | {r['M']} | error: {r.get('error', '?')} |")
                continue
            pc = r["w12_pct_copy"]
            lines.append(
                f"| {s['K']}x{s['N']} | {r['M']} | {r['cublas_us']:.1f} | {r['w12_us']:.1f} | "
                f"{r['w8_us']:.1f} | {r['w12_speedup']:.2f} | {r['w8_speedup']:.2f} | "
                f"{r['w8_over_w12']:.2f} | {r['w12_GB_s']:.0f} | "
                f"{'' if pc is None else f'{pc:.0f}'} | {r['w8_GB_s']:.0f} | "
                f"{r['cublas_GB_s']:.0f} | {r['w12_max_abs_err']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="stop starting new measurements after this many seconds")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU plumbing check under TRITON_INTERPRET=1 (tiny shapes, fp32 x)")
    args = ap.parse_args()
    deadline = T0 + args.budget_s
    global DEV, SHAPES, MS, XDTYPE
    if args.smoke:
        DEV, SHAPES, MS, XDTYPE = "cpu", [(96, 80), (64, 48)], [1, 3], torch.float32
    elif not torch.cuda.is_available():
        sys.exit("bench/gpu_w12.py needs a CUDA device (or --smoke with TRITON_INTERPRET=1)")
    import triton

    result = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)", "torch": torch.__version__,
              "triton": triton.__version__, "shapes": []}
    log(f"{result['device']}, torch {torch.__version__}, triton {triton.__version__}")
    copy_gbs = 0.0
    try:
        copy_gbs = copy_bandwidth(result)
    except Exception as exc:  # noqa: BLE001
        result["copy"] = {"error": repr(exc)}
        traceback.print_exc()
    for i, (k, n) in enumerate(SHAPES):
        if time.perf_counter() > deadline:
            log(f"deadline reached: skipping {k}x{n}")
            continue
        try:
            run_shape(k, n, copy_gbs, result, i == 0, deadline)
        except Exception as exc:  # noqa: BLE001
            result["shapes"].append({"K": k, "N": n, "error": repr(exc), "rows": []})
            traceback.print_exc()
    result["total_s"] = time.perf_counter() - T0
    print(table(result), flush=True)
    log("done")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_w12.json").write_text(json.dumps(result, indent=2))
        log(f"wrote {out / 'gpu_w12.json'}")


if __name__ == "__main__":
    main()
