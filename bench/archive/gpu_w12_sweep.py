"""Sweep W12 GEMV configurations per layer shape and row count against cuBLAS (one H200 run).

kernels/w12/gemv.py tunes over at most a handful of configurations per M bucket; this
script looks wider, to find what the shipped candidate lists should hold and why a shape is
slow. For each K x N (the 27B-class config's own layers: q, k/v, o, gate/up, down, head;
the W12 groups qkv and gate_up; the issue's table shapes) and each M:

1. cuBLAS bf16 on the decoded weights (the reference, exact weights), then every candidate
   (a GemvConfig from the grid below, then each split count that gives a distinct plan)
   is checked against it (relative error of the fp32 norms) and timed (do_bench median,
   L2 flushed);
2. the table: cuBLAS µs, the shipped tuner's choice (what the engine would run), the best
   candidate, their speedups over cuBLAS and effective bandwidth (W12 bytes over time);
   the top 3 candidates of each row go to the JSON.

Every candidate is compiled first in parallel worker processes (bench/w12_precompile.py's
scheme: a stand-in shape of the same specialisation), so the sweep itself mostly times.

    python3 bench/gpu_w12_sweep.py --out $OUT --budget-s 240
    PYTHONPATH=. TRITON_INTERPRET=1 python bench/gpu_w12_sweep.py --smoke   # plumbing, CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

if "kernels" not in sys.modules and not any(Path(p, "kernels").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

T0 = time.perf_counter()
E2E = {"q": (5120, 8192), "kv": (5120, 1024), "o": (8192, 5120), "gate/up": (5120, 25600),
       "down": (25600, 5120), "head": (5120, 151936)}
ISSUE = {"i15360": (5120, 15360), "i17408": (17408, 5120), "i34816": (5120, 34816)}
# the W12 groups of the 27B-class config (q/k/v and gate/up as one matrix each)
GROUPS = {"qkv": (5120, 10240), "gate_up": (5120, 51200)}
SETS = {"e2e": E2E, "issue": ISSUE, "groups": GROUPS}
SPLITS = ("auto", 1, 2, 4, 8, 16, 32)


def short(c) -> str:
    """n<block_n> k<block_k> w<warps> s<stages>, then fma | dot | swap, then the split."""
    kind = "swap" if c.dot and c.swap else "dot" if c.dot else "fma"
    kind += "-sharedk" if getattr(c, "shared_k", False) else ""
    kind += f" r{c.maxnreg}" if getattr(c, "maxnreg", None) else ""
    return f"n{c.block_n} k{c.block_k} w{c.num_warps} s{c.num_stages} {kind} {c.split}"


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


GRID_LIMIT: int | None = None  # --smoke: the first few candidates only


MAXNREG: tuple[int, ...] = ()  # --maxnreg: the bucket's candidates under these caps only
M1_DOT = False  # --m1-dot: at M = 1 also every tensor-core candidate of buckets 4, 16, 64


def grid(m: int):
    """Candidate configurations for M rows (splits are swept separately)."""
    from kernels.w12.gemv import CONFIGS, GemvConfig as C, bucket

    out = list(CONFIGS[bucket(m)])
    if MAXNREG:
        out += [dataclasses.replace(c, maxnreg=r) for r in MAXNREG for c in CONFIGS[bucket(m)]]
    if M1_DOT and m == 1:  # every tensor-core candidate of the larger buckets, at BLOCK_M 16
        out += [c for b in (4, 16, 64) for c in CONFIGS[b]]
    if MAXNREG or M1_DOT:  # those instead of the wide grid
        pass
    elif m == 1:
        out += [C(bn, bk, w, st) for bn in (8, 16, 32, 64) for bk in (256, 512, 1024)
                for w in (2, 4, 8) for st in (1, 3)]
    else:
        if m <= 4:
            out += [C(bn, bk, 4, 2) for bn in (8, 16, 32) for bk in (128, 256, 512)]
        out += [C(bn, bk, w, st, dot=True, swap=True)
                for bn, w in ((64, 4), (128, 4), (128, 8), (256, 8))
                for bk in (64, 128, 256) for st in (2, 3, 4)]
    return list(dict.fromkeys(dataclasses.replace(c, split="auto") for c in out))[:GRID_LIMIT]


def precompile(ms, workers: int, budget_s: float) -> None:
    import concurrent.futures as cf
    import functools
    import multiprocessing as mp

    from bench.w12_precompile import _nice, compile_task

    tasks = []
    for m in ms:
        for cfg in grid(m):
            for split in (2, 1):  # two signatures: fp32 partials, or y itself
                for view in ("w12",):
                    tasks.append(("gemv", view, dataclasses.replace(cfg, split=split), m))
    run = functools.partial(compile_task, dev="cuda")
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(max_workers=workers, initializer=_nice,
                                mp_context=mp.get_context("spawn")) as ex:
        futs = [ex.submit(run, t) for t in tasks]
        done, _ = cf.wait(futs, timeout=budget_s)
        errs = [f.result()[2] for f in done if f.result()[2]]
        for f in futs:
            f.cancel()
    log(f"precompiled {len(done)}/{len(tasks)} in {time.perf_counter() - t0:.1f} s with "
        f"{workers} workers, {len(errs)} errors" + (f"; first: {errs[0]}" if errs else ""))


def us_of(fn, smoke: bool) -> float:
    if smoke:
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    from triton.testing import do_bench

    return 1000.0 * do_bench(fn, warmup=3, rep=6, return_mode="median")


def sweep_shape(name, k, n, ms, copy_bps, deadline, smoke, result):
    from kernels.w12 import decode, encode
    from kernels.w12 import gemv as G

    dev = "cpu" if smoke else "cuda"
    g = torch.Generator(device=dev).manual_seed(k * 7 + n)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    t = encode(w)
    t._row_ptr = t.row_ptr()
    wd = decode(t)
    assert torch.equal(wd.view(torch.int16), w.view(torch.int16)), "round trip"
    del w
    wbytes = t.hi.numel() + t.lo.numel() + 6 * t.num_exceptions + 2 * n
    for m in ms:
        if time.perf_counter() > deadline:
            log(f"{name} M={m}: skipped (budget)")
            continue
        xdt = torch.float32 if smoke else torch.bfloat16
        x = torch.randn(m, k, device=dev, generator=g).to(xdt)
        ref = (x.float() @ wd.float().T)
        wx = wd.to(xdt)
        cub = us_of(lambda: torch.matmul(x, wx.T), smoke)
        y = torch.empty(m, n, dtype=xdt, device=dev)
        shipped = G.tune(x, t, "w12") if not smoke else G.CONFIGS[G.bucket(m)][0]
        rows, seen = [], set()
        for cfg in grid(m):
            for split in SPLITS:
                c = dataclasses.replace(cfg, split=split)
                plan = (c.block_n, c.block_k, c.num_warps, c.num_stages, c.dot, c.swap,
                        c.shared_k, c.maxnreg, G.plan(c, m, n, k, x.device))
                if plan in seen:
                    continue
                seen.add(plan)
                try:
                    G._launch(x, t, y, True, c)
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    if not err < 2e-2:
                        rows.append({"cfg": short(c), "error": f"rel err {err:.3g}"})
                        continue
                    us = us_of(lambda c=c: G._launch(x, t, y, True, c), smoke)
                    rows.append({"cfg": short(c), "us": us, "splits": plan[-1][0], "err": err})
                except Exception as exc:  # noqa: BLE001 - a config that does not fit
                    rows.append({"cfg": short(c), "error": repr(exc)[:160]})
            if time.perf_counter() > deadline:
                break
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        ship_us = us_of(lambda: G._launch(x, t, y, True, shipped), smoke)
        best = ok[0] if ok else None
        entry = {"shape": name, "K": k, "N": n, "M": m, "cublas_us": cub,
                 "shipped": short(shipped), "shipped_us": ship_us, "tried": len(rows),
                 "failed": sum("error" in r for r in rows), "top": ok[:3], "all": ok,
                 "w12_bytes": wbytes, "bf16_bytes": 2 * n * k}
        if best:
            entry.update(best_us=best["us"], best_cfg=best["cfg"],
                         best_x_cublas=cub / best["us"],
                         best_gbs=wbytes / best["us"] / 1e3,
                         best_pct_copy=100 * wbytes / (best["us"] * 1e-6) / copy_bps
                         if copy_bps else None)
        result["rows"].append(entry)
        log(f"{name} {k}x{n} M={m}: cuBLAS {cub:.1f} us ({2 * n * k / cub / 1e3:.0f} GB/s), "
            f"shipped {ship_us:.1f} us ({short(shipped)}), best "
            + (f"{best['us']:.1f} us {best['cfg']} splits {best['splits']}" if best else "none")
            + f"; {len(rows)} tried, {entry['failed']} failed")
    del t, wd
    if not smoke:
        torch.cuda.empty_cache()


def copy_bandwidth(smoke: bool) -> float | None:
    if smoke:
        return None
    a = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    us = us_of(lambda: b.copy_(a), False)
    return 2 * a.numel() * 2 / (us * 1e-6)


def table(result) -> None:
    print(f"\n{'shape':<9}{'K x N':>14}{'M':>4}{'cuBLAS':>9}{'shipped':>9}{'best':>9}"
          f"{'ship x':>8}{'best x':>8}{'GB/s':>7}{'%copy':>7}  best config")
    for r in result["rows"]:
        b = r.get("best_us")
        print(f"{r['shape']:<9}{r['K']:>7}x{r['N']:<6}{r['M']:>4}{r['cublas_us']:>9.1f}"
              f"{r['shipped_us']:>9.1f}{(b or 0):>9.1f}{r['cublas_us'] / r['shipped_us']:>8.2f}"
              f"{(r['cublas_us'] / b if b else 0):>8.2f}{(r.get('best_gbs') or 0):>7.0f}"
              f"{(r.get('best_pct_copy') or 0):>7.1f}  {r.get('best_cfg', '')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--shapes", default="e2e,issue",
                    help="comma list of sets (e2e, issue, groups) or shape names (q, o, qkv, ...)")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--m1-dot", action="store_true", help="at M = 1 also every tensor-core "
                    "candidate of the larger buckets (x padded to 16 rows)")
    ap.add_argument("--maxnreg", default="", help="e.g. 168,128: sweep the bucket's own "
                    "candidates under these register caps instead of the wide grid")
    args = ap.parse_args()
    global MAXNREG, M1_DOT
    MAXNREG = tuple(int(r) for r in args.maxnreg.split(",") if r)
    M1_DOT = args.m1_dot
    ms = [int(m) for m in args.ms.split(",")]
    deadline = T0 + args.budget_s
    shapes = {}
    for token in args.shapes.split(","):
        if token in SETS:
            shapes.update(SETS[token])
        else:
            found = [s for s in SETS.values() if token in s]
            if not found:
                raise SystemExit(f"unknown shape or set {token!r}: sets {', '.join(SETS)}, "
                                 f"shapes {', '.join(k for s in SETS.values() for k in s)}")
            shapes[token] = found[0][token]
    if args.smoke:
        shapes = {"tiny": (128, 48)}
        global GRID_LIMIT
        GRID_LIMIT = 3
    result = {"device": "cpu" if args.smoke else torch.cuda.get_device_name(),
              "torch": torch.__version__, "rows": [], "errors": []}
    try:
        if not args.smoke:
            precompile(ms, args.workers, min(150.0, 0.45 * args.budget_s))
        result["copy_bps"] = copy_bps = copy_bandwidth(args.smoke)
        if copy_bps:
            log(f"copy bandwidth {copy_bps / 1e12:.3f} TB/s (read + write)")
        for name, (k, n) in shapes.items():
            try:
                sweep_shape(name, k, n, ms, copy_bps, deadline, args.smoke, result)
            except Exception as exc:  # noqa: BLE001
                result["errors"].append(f"{name}: {exc!r}")
                traceback.print_exc()
    finally:
        table(result)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_w12_sweep.json").write_text(json.dumps(result, indent=1))
        log(f"wrote {Path(args.out, 'gpu_w12_sweep.json')}")


if __name__ == "__main__":
    main()
