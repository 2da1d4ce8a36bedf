"""W12 kernels against cuBLAS bf16 on 27B-class layer shapes (one H200 run, <= 100 s).

Kernels: "gemm" (kernels/w12/gemm.py, the first) and "gemv" (kernels/w12/gemv.py, split-K
for the memory-bound M <= 16 regime), each in the W12 view and the nested W8 view.

0. Precompile: every configuration either kernel may tune over is compiled in parallel
   worker processes on small stand-in shapes of the same specialisation (dims divisible by
   16, even chunks), filling Triton's on-disk cache, so tuning below only times (Triton
   compiles one kernel at a time per process, and the first GEMM's kernels take seconds
   each; workers are spawned, each with its own CUDA context, niced, and a task that fails
   only costs the main process that compile).
1. Copy bandwidth: a device-to-device copy of 1 GiB (read + write bytes over time), timed
   with do_bench as the kernels are, so "% copy" compares like with like.
2. For K x N in 5120x15360, 17408x5120, 5120x34816, 5120x151936 (random normal weights,
   std 0.02, bf16): GPU encode; exact-weight check (decode == weight, bitwise); on the first
   shape the GPU encoder against the CPU encoder (first 4096 rows, every plane bitwise).
   Then tuning of both kernels for this shape (time printed per kernel).
3. For M in 1, 4, 16, 64 (--full: 1, 2, 4, 8, 16, 32, 64): correctness first (W12 against
   cuBLAS on the same weights, W8 against x @ decode_w8^T: max abs and relative error),
   then medians of triton.testing.do_bench (L2 flushed between runs) for cuBLAS
   (torch.matmul) and each kernel and view. Effective GB/s = bytes the layer must read
   (weight planes, exceptions, x; the GEMV's fp32 partials are not counted) / time;
   % copy = that over the measured copy bandwidth.

    python bench/kernels_vs_cublas.py --out $OUT
    python bench/kernels_vs_cublas.py --full --budget-s 200 --out $OUT   # M = 1..64
    python bench/kernels_vs_cublas.py --smoke    # CPU under TRITON_INTERPRET=1 (set for you)

Prints one table (Markdown), writes kernels_vs_cublas.json to --out. (Before the suite this
was bench/gpu_w12.py, with the precompiler in bench/w12_precompile.py.)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
import traceback

if "--smoke" in sys.argv:  # before triton is imported anywhere: the interpreter on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from common import T0, log, write_json  # noqa: E402 - sets sys.path first

import torch  # noqa: E402

SHAPES = [(5120, 15360), (17408, 5120), (5120, 34816), (5120, 151936)]  # K x N
MS = [1, 4, 16, 64]
FULL_MS = [1, 2, 4, 8, 16, 32, 64]
KERNELS = ("gemm", "gemv")
XDTYPE = torch.bfloat16
DEV = "cuda"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def bench(fn, rep_ms: int = 30) -> float:
    """Median µs of fn (triton.testing.do_bench: L2 flushed before each run)."""
    from triton.testing import do_bench

    if DEV == "cpu":  # --smoke: plumbing only, no meaningful time
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    return 1000.0 * do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def bench_graph(fn, calls: int = 10, reps: int = 7) -> float | None:
    """Median µs per call of `calls` back-to-back calls captured in one CUDA graph: no CPU
    launch cost (the decode setting), but no L2 flush between calls either."""
    if DEV != "cuda":
        return None
    from kernels.w12.gemm import graph_us

    fn()  # compiles and warms up outside the capture
    torch.cuda.synchronize()
    return graph_us(fn, torch.device("cuda", torch.cuda.current_device()), calls=calls,
                    reps=reps, flush=False)


def graph_into(row: dict, key: str, fn) -> None:
    try:
        row[key] = bench_graph(fn)
    except Exception as exc:  # noqa: BLE001
        row[key.replace("_us", "_error")] = repr(exc)
        traceback.print_exc()


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
    other = (t.base.numel() + t.row_ptr().numel() * 4
             + t.exc_idx.numel() * t.exc_idx.element_size() + t.exc_val.numel() * 2)
    return planes + other + m * k * 2


# ---------------------------------------------------------------- one shape
def _matmul(kernel: str):
    from kernels.w12.ops import fused_matmul

    return fused_matmul(kernel)


def _config(kernel: str, m: int, t, view: str, dtype) -> str:
    if kernel == "gemm":
        from kernels.w12.gemm import _TUNED, _key

        cfg = _TUNED.get(_key(m, t, view, dtype)) or _TUNED.get(_key(1, t, view, dtype))
        return repr(cfg)
    from kernels.w12 import gemv

    cfg = gemv.chosen(m, t, view, dtype)
    if cfg is None:
        return "None"
    split, per = gemv.plan(cfg, m, t.shape[0], t.shape[1], t.device)
    return f"{cfg!r} splits={split}"


def tune_shape(t, k: int, g, shape: dict) -> None:
    """Tune both kernels (both views) for every M of this shape; times printed per kernel."""
    from kernels.w12 import gemm, gemv

    for kernel in KERNELS:
        t0 = time.perf_counter()
        try:
            for m in (MS[:1] if kernel == "gemm" else MS):  # gemm: M > 16 reuses M <= 16's
                x = torch.randn(m, k, device=DEV, generator=g).to(XDTYPE)
                for view in ("w12", "w8"):
                    if kernel == "gemm":
                        gemm.tune(x, t, view)
                    elif gemv.chosen(m, t, view, x.dtype) is None:  # w8 reuses w12's choice
                        gemv.tune(x, t, view)
            sync()
            shape[f"{kernel}_tune_s"] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001
            shape[f"{kernel}_tune_error"] = repr(exc)
            traceback.print_exc()
    log(f"{k}x{t.shape[0]}: tuning gemm {shape.get('gemm_tune_s', float('nan')):.1f} s, "
        f"gemv {shape.get('gemv_tune_s', float('nan')):.1f} s")


def run_shape(k: int, n: int, copy_gbs: float, result: dict, first: bool, deadline: float):
    from kernels.w12 import encode
    from kernels.w12.format import decode_w8

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
    tune_shape(t, k, g, shape)
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
            ref8 = torch.matmul(x, w8.T.to(x.dtype))
            row["ref_max_abs"] = ref.float().abs().max().item()
            row["cublas_us"] = bench(lambda: torch.matmul(x, w.T.to(x.dtype)))
            row["cublas_GB_s"] = (n * k * 2 + m * k * 2) / row["cublas_us"] / 1e3
            row["cublas_pct_copy"] = 100.0 * row["cublas_GB_s"] / copy_gbs if copy_gbs else None
            graph_into(row, "cublas_graph_us", lambda: torch.matmul(x, w.T.to(x.dtype)))
        except Exception as exc:  # noqa: BLE001
            row["error"] = repr(exc)
            traceback.print_exc()
            continue
        for kernel in KERNELS:
            fn = _matmul(kernel)
            p = "" if kernel == "gemm" else "gemv_"   # gemm keeps the first table's keys
            try:
                for view, r in (("w12", ref), ("w8", ref8)):
                    y = fn(x, t, view)
                    d = (y.float() - r.float()).abs()
                    row[f"{p}{view}_max_abs_err"] = d.max().item()
                    row[f"{p}{view}_rel_err"] = (d.norm() / r.float().norm()).item()
                    row[f"{p}{view}_ok"] = bool(row[f"{p}{view}_rel_err"] < 1e-2)
                for view in ("w12", "w8"):
                    row[f"{p}{view}_us"] = bench(lambda: fn(x, t, view))  # noqa: B023
                    row[f"{p}{view}_GB_s"] = read_bytes(t, m, k, view) / row[f"{p}{view}_us"] / 1e3
                    row[f"{p}{view}_speedup"] = row["cublas_us"] / row[f"{p}{view}_us"]
                    row[f"{p}{view}_pct_copy"] = (100.0 * row[f"{p}{view}_GB_s"] / copy_gbs
                                                  if copy_gbs else None)
                    row[f"{p}{view}_config"] = _config(kernel, m, t, view, x.dtype)
                row[f"{p}w8_over_w12"] = row[f"{p}w12_us"] / row[f"{p}w8_us"]
                graph_into(row, f"{p}w12_graph_us", lambda: fn(x, t, "w12"))  # noqa: B023
            except Exception as exc:  # noqa: BLE001
                row[f"{p}error"] = repr(exc)
                traceback.print_exc()
        log(line(k, n, row))
    del w, w8, t
    if DEV == "cuda":
        torch.cuda.empty_cache()


def _f(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def line(k: int, n: int, r: dict) -> str:
    out = (f"{k}x{n} M={r['M']:2d}: cuBLAS {_f(r.get('cublas_us'), '7.1f')} µs "
           f"(graph {_f(r.get('cublas_graph_us'), '.1f')})")
    for kernel, p in (("gemm", ""), ("gemv", "gemv_")):
        if f"{p}w12_us" not in r:
            out += f" | {kernel} error {r.get(f'{p}error', '?')[:80]}"
            continue
        out += (f" | {kernel} W12 {r[f'{p}w12_us']:7.1f} µs ({r[f'{p}w12_speedup']:.2f}x, "
                f"{r[f'{p}w12_GB_s']:.0f} GB/s, {_f(r[f'{p}w12_pct_copy'], '.0f')}% copy) "
                f"W8 {r[f'{p}w8_us']:7.1f} µs ({r[f'{p}w8_over_w12']:.2f}x W12) "
                f"graph W12 {_f(r.get(f'{p}w12_graph_us'), '.1f')}"
                + ("" if r[f"{p}w12_ok"] and r[f"{p}w8_ok"] else " MISMATCH"))
    return out


def table(result: dict) -> str:
    cols = ["K x N", "M", "cuBLAS µs", "W12 µs", "W8 µs", "W12 ×", "W8 ×", "W8/W12",
            "W12 GB/s", "W12 % copy", "W8 GB/s", "cuBLAS GB/s", "W12 max err",
            "GEMV W12 µs", "GEMV W8 µs", "GEMV W12 ×", "GEMV W8 ×", "GEMV W8/W12",
            "GEMV W12 GB/s", "GEMV W12 % copy", "GEMV W12 max err",
            "graph µs: cuBLAS", "W12", "GEMV W12"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for s in result["shapes"]:
        for r in s["rows"]:
            if "cublas_us" not in r:
                lines.append(f"| {s['K']}x{s['N']} | {r['M']} | error: {r.get('error', '?')} |")
                continue
            cells = [f"{s['K']}x{s['N']}", str(r["M"]), f"{r['cublas_us']:.1f}"]
            for p in ("", "gemv_"):
                if f"{p}w12_us" not in r:
                    blanks = 9 if p == "" else 7
                    cells += [f"error: {r.get(f'{p}error', '?')[:60]}"] + [""] * blanks
                    continue
                bad = "" if r[f"{p}w12_ok"] else " (!)"
                if p == "":
                    cells += [f"{r['w12_us']:.1f}", f"{r['w8_us']:.1f}", f"{r['w12_speedup']:.2f}",
                              f"{r['w8_speedup']:.2f}", f"{r['w8_over_w12']:.2f}",
                              f"{r['w12_GB_s']:.0f}", _f(r["w12_pct_copy"], ".0f"),
                              f"{r['w8_GB_s']:.0f}", f"{r['cublas_GB_s']:.0f}",
                              f"{r['w12_max_abs_err']:.2e}{bad}"]
                else:
                    cells += [f"{r['gemv_w12_us']:.1f}", f"{r['gemv_w8_us']:.1f}",
                              f"{r['gemv_w12_speedup']:.2f}", f"{r['gemv_w8_speedup']:.2f}",
                              f"{r['gemv_w8_over_w12']:.2f}", f"{r['gemv_w12_GB_s']:.0f}",
                              _f(r["gemv_w12_pct_copy"], ".0f"),
                              f"{r['gemv_w12_max_abs_err']:.2e}{bad}"]
            cells += [_f(r.get(key), ".1f") for key in ("cublas_graph_us", "w12_graph_us",
                                                         "gemv_w12_graph_us")]
            lines.append("| " + " | ".join(cells) + " |")
    tunes = [f"{s['K']}x{s['N']}: gemm {_f(s.get('gemm_tune_s'), '.1f')} s, gemv "
             f"{_f(s.get('gemv_tune_s'), '.1f')} s" for s in result["shapes"]]
    return "\n".join(lines) + "\n\ntuning per shape: " + "; ".join(tunes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--budget-s", type=float, default=92.0,
                    help="stop starting new measurements after this many seconds")
    ap.add_argument("--full", action="store_true", help="M in 1, 2, 4, 8, 16, 32, 64")
    ap.add_argument("--workers", type=int, default=0,
                    help="precompile worker processes (0: min(14, cpus - 2); -1: none)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU plumbing check under TRITON_INTERPRET=1 (tiny shapes, fp32 x)")
    args = ap.parse_args()
    deadline = T0 + args.budget_s
    global DEV, SHAPES, MS, XDTYPE
    if args.full:
        MS = list(FULL_MS)
    if args.smoke:
        DEV, SHAPES, MS, XDTYPE = "cpu", [(96, 80), (64, 48)], [1, 3, 17], torch.float32
    elif not torch.cuda.is_available():
        sys.exit("bench/kernels_vs_cublas.py needs a CUDA device (or --smoke)")
    import triton

    result = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)",
              "torch": torch.__version__, "triton": triton.__version__, "Ms": MS, "shapes": []}
    log(f"{result['device']}, torch {torch.__version__}, triton {triton.__version__}")
    pre = None
    if args.workers >= 0:
        workers = args.workers or max(1, min(14, (os.cpu_count() or 4) - 2))
        try:
            if DEV == "cuda":
                pre = Precompiler(MS, workers, log)
                result["precompile"] = pre.wait(max(10.0, 0.45 * args.budget_s))
            else:  # --smoke: the pool's plumbing on a few interpreter tasks, one worker
                pre = Precompiler(MS, 1, log, limit=4, dev="cpu", xdtype=XDTYPE)
                result["precompile"] = pre.wait(120.0)
        except Exception as exc:  # noqa: BLE001
            result["precompile"] = {"error": repr(exc)}
            traceback.print_exc()
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
        save(result, args.out)
    if pre is not None:
        try:
            result["precompile_at_end"] = pre.close()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    result["total_s"] = time.perf_counter() - T0
    print(table(result), flush=True)
    log("done")
    save(result, args.out, final=True)


def save(result: dict, out: str | None, final: bool = False) -> None:
    """Write kernels_vs_cublas.json (after every shape too, so a run cut short keeps what it
    measured)."""
    path = write_json(out, "kernels_vs_cublas.json", result)
    if final and path:
        log(f"wrote {path}")


# ---------------------------------------------------------------- precompile (step 0)
# Each task runs one (kernel, view, config, M) once on a small stand-in shape whose integer
# arguments fall in the same specialisation classes as the benchmark shapes (every dimension
# divisible by 16, every GEMV chunk full), so the main process later finds the compiled
# kernel in Triton's cache instead of compiling it.
PRE_N, PRE_K = 1024, 2048   # stand-in shape (N, K)


@functools.lru_cache(maxsize=2)
def _standin(n: int, k: int, dev: str):
    """The stand-in weight, encoded on the CPU once per worker and copied over: a worker
    puts little more than the kernels themselves on the GPU while the main process times
    (each process is its own CUDA context)."""
    from kernels.w12 import encode

    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    t_cpu = encode(w)
    ptr = t_cpu.row_ptr()
    t = t_cpu.to(dev)
    t._row_ptr = ptr.to(dev)
    return t


def compile_task(task, dev: str = "cuda", n: int = PRE_N, k: int = PRE_K,
                 xdtype: torch.dtype = torch.bfloat16):
    """Worker: run one (kernel, view, config, M) on the stand-in shape. Returns (task,
    seconds, error or None)."""
    kernel, view, cfg, m = task
    t0 = time.perf_counter()
    try:
        from kernels.w12.ops import fused_matmul

        t = _standin(n, k, dev)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(xdtype).to(dev)
        fused_matmul(kernel)(x, t, view, cfg)
        if dev == "cuda":
            torch.cuda.synchronize()
        return task, time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001
        return task, time.perf_counter() - t0, repr(exc)[:300]


def tasks_for(ms) -> list:
    """(kernel, view, config, M) for every configuration either kernel may use at these M,
    in the order they are needed: kernels that write fp32 partials (split > 1: every shape
    but the LM head) first, the slowest compiles (the first GEMM) first within each."""
    from kernels.w12 import gemm, gemv

    # split > 1 writes fp32 partials, split 1 writes y: two signatures per configuration
    def variants(cfg):
        return [dataclasses.replace(cfg, split=2), dataclasses.replace(cfg, split=1)]

    tasks = []
    for m in sorted({1 if m <= 16 else m for m in ms}):  # gemm: M is not specialised
        for cfg in gemm.CONFIGS:
            for rank, c in enumerate(variants(cfg)):
                for view in ("w12", "w8"):
                    tasks.append((rank, 0, ("gemm", view, c, m)))
    for m in ms:
        for cfg in gemv.CONFIGS[gemv.bucket(m)]:
            for rank, c in enumerate(variants(cfg)):
                for view in ("w12", "w8"):
                    tasks.append((rank, 1, ("gemv", view, c, m)))
    tasks.sort(key=lambda t: (t[0], t[1], -t[2][3]))
    return list(dict.fromkeys(t for _, _, t in tasks))  # without repeats, in order


def _nice() -> None:
    try:
        import os

        os.nice(10)   # the main process, which launches and times, comes first
    except OSError:
        pass


class Precompiler:
    """Compile every task in `workers` spawned processes (each with its own CUDA context),
    niced. `wait` blocks until all are done or a timeout passes; the rest go on compiling in
    the background until `close`, which cancels what has not started and ends the workers.
    dev="cpu" (--smoke): `limit` tasks under the interpreter on a tiny stand-in."""

    def __init__(self, ms, workers: int, log=print, limit: int | None = None,
                 dev: str = "cuda", xdtype: torch.dtype = torch.bfloat16):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.log, self.t0, self.workers = log, time.perf_counter(), workers
        self.tasks = tasks_for(ms)[:limit]
        run = functools.partial(compile_task, dev=dev, xdtype=xdtype,
                                **({"n": 48, "k": 64} if dev == "cpu" else {}))
        self.ex = cf.ProcessPoolExecutor(max_workers=workers, initializer=_nice,
                                         mp_context=mp.get_context("spawn"))
        self.futs = [self.ex.submit(run, task) for task in self.tasks]

    def summary(self) -> dict:
        done = [f.result() for f in self.futs if f.done() and not f.cancelled()]
        errors = [f"{t[0]} {t[1]} {t[2]} M={t[3]}: {e}" for t, _s, e in done if e]
        return {"tasks": len(self.tasks), "done": len(done), "workers": self.workers,
                "s": time.perf_counter() - self.t0, "errors": errors}

    def wait(self, timeout_s: float) -> dict:
        import concurrent.futures as cf

        cf.wait(self.futs, timeout=timeout_s)
        info = self.summary()
        rest = "" if info["done"] == info["tasks"] else "; the rest go on in the background"
        self.log(f"precompile: {info['done']}/{info['tasks']} kernels in {info['s']:.1f} s with "
                 f"{self.workers} workers, {len(info['errors'])} errors{rest}")
        for e in info["errors"][:6]:
            self.log(f"  precompile error: {e}")
        return info

    def close(self) -> dict:
        info = self.summary()
        procs = list((getattr(self.ex, "_processes", None) or {}).values())  # our workers
        self.ex.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        return info


if __name__ == "__main__":
    main()
