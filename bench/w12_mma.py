"""The CUDA W12 mma kernel (kernels/w12/mma.py) against cuBLAS bf16 and the Triton GEMV, on
27B-class layer shapes, M = 1..64 (issue 29's kernel table). One H200 run.

0. Copy bandwidth (a 1 GiB device-to-device copy, bytes read + written over time) and the
   kernel's build (nvcc, seconds; cached after the first).
1. For each K x N: random normal weights (std 0.02, bf16), encoded on the GPU. For each M:
   correctness first (W12 against cuBLAS on the same weights, W8 against x @ decode_w8^T:
   relative error of the norm, and whether the two mma calls were bit-equal), then each
   kernel tuned (its own tuner, in CUDA graphs) and timed as the engine runs it:
   `kernels.w12.gemm.graph_us`, 8 calls back to back in a CUDA graph, each after an L2
   flush, median of 5 replays. cuBLAS is F.linear on the bf16 weight.
2. One Markdown table: cuBLAS, GEMV W12, mma W12, mma W8 (µs), mma W12 over cuBLAS, W8 over
   W12, mma W12's bytes/s as % of the copy, the configuration its tuner chose.

    python3 bench/w12_mma.py --out $OUT                     # issue shapes, M = 1..64
    python3 bench/w12_mma.py --layers --out $OUT            # the 6 layer shapes instead
    python3 bench/w12_mma.py --no-gemv                      # skip the Triton GEMV column
    python3 bench/w12_mma.py --no-gemv --staged             # + the staged kernels' table
    (--budget-s, default 420: no new shape starts after that many seconds)
    python3 bench/w12_mma.py --smoke     # CPU: the emulator on a tiny shape (no timings)
    ncu --clock-control none -k regex:w12_mma python3 bench/w12_mma.py --launch \
        "4,2,4,xs;2,4,4,xs;2,2,4;2,4,8,st" --ms 64   # one call a configuration, first shape, for ncu
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from common import log, print_table, write_json  # noqa: E402 - sets sys.path first

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ISSUE_SHAPES = [(5120, 15360), (17408, 5120), (5120, 34816), (5120, 151936)]  # K x N
LAYER_SHAPES = [(5120, 8192), (5120, 1024), (8192, 5120), (5120, 25600), (25600, 5120),
                (5120, 151936)]   # q, k/v, o, gate/up, down, head
MS = [1, 2, 4, 8, 16, 32, 64]


def rel(y: torch.Tensor, r: torch.Tensor) -> float:
    y, r = y.float(), r.float()
    return ((y - r).norm() / r.norm().clamp_min(1e-30)).item()


def bytes_read(t, m: int, k: int, view: str) -> int:
    planes = t.hi.numel() + (t.lo.numel() if view == "w12" else 0)
    return (planes + t.base.numel() + t.row_ptr().numel() * 4
            + t.exc_idx.numel() * t.exc_idx.element_size() + t.exc_val.numel() * 2 + m * k * 2)


def bytes_read_of(row: dict, us) -> float | None:
    """GB/s of a row's W12 bytes (row["bytes"]) over `us`."""
    return row["bytes"] / (us * 1e-6) / 1e9 if us and row.get("bytes") else None


def copy_gbs(dev) -> float:
    from kernels.w12.gemm import graph_us

    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    us = graph_us(lambda: dst.copy_(src), dev, calls=4, flush=False)
    return 2 * (1 << 30) / (us * 1e-6) / 1e9


def shape_rows(k: int, n: int, ms, args, copy: float, dev) -> list[dict]:
    from kernels.w12 import encode
    from kernels.w12 import mma
    from kernels.w12.format import decode_w8

    g = torch.Generator(device=dev).manual_seed(k * 7 + n)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    t = encode(w)
    w8 = decode_w8(t)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        ref, ref8 = F.linear(x, w), F.linear(x, w8)
        row = {"K": k, "N": n, "M": m}
        if args.smoke:   # the emulator stands in for the kernel: errors only, no times
            xc, tc = x.cpu(), t.to("cpu")
            y, y8 = mma.emulate(xc, tc, "w12"), mma.emulate(xc, tc, "w8")
            row.update(err_w12=rel(y, ref.cpu()), err_w8=rel(y8, ref8.cpu()), equal_runs=None)
            rows.append(row)
            continue
        from kernels.w12.gemm import graph_us

        y = mma.w12_mma(x, t, "w12")   # tunes
        y8 = mma.w12_mma(x, t, "w8")
        row.update(err_w12=rel(y, ref), err_w8=rel(y8, ref8),
                   equal_runs=bool(torch.equal(y, mma.w12_mma(x, t, "w12"))),
                   config=repr(mma._TUNED.get(mma._key(m, t, "w12"))))
        row["cublas_us"] = graph_us(lambda: F.linear(x, w), x.device)
        row["mma_w12_us"] = graph_us(lambda: mma.w12_mma(x, t, "w12"), x.device)
        row["mma_w8_us"] = graph_us(lambda: mma.w12_mma(x, t, "w8"), x.device)
        if not args.no_gemv:
            from kernels.w12.gemv import w12_gemv

            row["gemv_err"] = rel(w12_gemv(x, t, "w12"), ref)   # tunes
            row["gemv_w12_us"] = graph_us(lambda: w12_gemv(x, t, "w12"), x.device)
        if args.staged:   # the staged kernels, tuned among themselves
            cands = mma.STAGED_CONFIGS[mma.tiles(m)]
            cfg = mma.tune(x, t, "w12", cands)
            cfg8 = mma.tune(x, t, "w8", cands)
            ys, ys8 = mma.w12_mma(x, t, "w12", cfg), mma.w12_mma(x, t, "w8", cfg8)
            row.update(err_st=rel(ys, ref), err_st8=rel(ys8, ref8), st_config=repr(cfg),
                       st_equal=bool(torch.equal(ys, y)))
            row["st_w12_us"] = graph_us(lambda: mma.w12_mma(x, t, "w12", cfg), x.device)
            row["st_w8_us"] = graph_us(lambda: mma.w12_mma(x, t, "w8", cfg8), x.device)
            log(f"{k}x{n} M={m}: staged {row['st_w12_us']:.1f} us "
                f"(x{row['cublas_us'] / row['st_w12_us']:.2f}), w8 {row['st_w8_us']:.1f}, "
                f"err {row['err_st']:.1e} {row['st_config']}")
        if args.parts:   # the pick's own kernels: its tiles and the split-K sum
            cfg = mma._TUNED.get(mma._key(m, t, "w12"))
            fuse = mma.fuses(dev) and cfg.fuse
            row["split"] = mma.split_of(cfg, m, n, k, "w12", dev, fuse)
            row["sum"] = "one split" if row["split"] == 1 else "fused" if fuse else "second"
            parts = kernel_parts(lambda: mma.w12_mma(x, t, "w12"))
            row["tiles_us"], row["reduce_us"] = parts.get("tiles"), parts.get("reduce", 0.0)
            if mma.fuses(dev):   # the same pick with the other sum (MmaConfig.fuse), beside
                other = replace(cfg, fuse=not cfg.fuse)
                row["other_split"] = mma.split_of(other, m, n, k, "w12", dev, other.fuse)
                row["other_us"] = graph_us(lambda: mma.w12_mma(x, t, "w12", other), x.device)
                row["other_equal"] = bool(torch.equal(mma.w12_mma(x, t, "w12", other), y))
        row["bytes"] = bytes_read(t, m, k, "w12")
        row["mma_gbs"] = row["bytes"] / (row["mma_w12_us"] * 1e-6) / 1e9
        row["pct_copy"] = 100 * row["mma_gbs"] / copy if copy else None
        log(f"{k}x{n} M={m}: cuBLAS {row['cublas_us']:.1f} us, mma {row['mma_w12_us']:.1f} "
            f"(x{row['cublas_us'] / row['mma_w12_us']:.2f}), w8 {row['mma_w8_us']:.1f}, "
            f"err {row['err_w12']:.1e} {row['config']}")
        rows.append(row)
    return rows


def parse_configs(text: str) -> list:
    """'ng,depth,wk[,xs[N]|,st];...' -> MmaConfig list ('xs': x shared; 'xsN': x shared
    with registers capped for N blocks an SM, mma.CAPPED; 'st': the staged kernel, depth
    its stages, mma.STAGED)."""
    from kernels.w12.mma import MmaConfig

    out = []
    for part in (p.strip() for p in text.split(";") if p.strip()):
        f = [v.strip() for v in part.split(",")]
        if len(f) not in (3, 4) or (len(f) == 4 and f[3] not in ("xs", "xs3", "xs4", "st")):
            raise SystemExit(f"--launch: {part!r} is not 'ng,depth,wk' or "
                             f"'ng,depth,wk,xs' ('xs3', 'xs4': capped; 'st': staged)")
        if len(f) == 4 and f[3] == "st":
            out.append(MmaConfig(int(f[0]), int(f[1]), int(f[2]), staged=True))
            continue
        out.append(MmaConfig(int(f[0]), int(f[1]), int(f[2]), share_x=len(f) == 4,
                             blocks=int(f[3][2:] or 0) if len(f) == 4 else 0))
    return out


def launch(text: str, ms: list[int], shape: tuple[int, int]) -> None:
    """One w12_mma call per configuration and M (nothing timed, nothing tuned), each
    printed with its output's norm: what a profiler (ncu -k regex:w12_mma) attaches to."""
    from kernels.w12 import encode, mma

    configs = parse_configs(text)
    if not torch.cuda.is_available():
        raise SystemExit("--launch runs the CUDA kernel: no CUDA device here")
    dev, (k, n) = torch.device("cuda"), shape
    g = torch.Generator(device=dev).manual_seed(k * 7 + n)
    t = encode((torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16))
    rows = []
    for m in ms:
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        for cfg in configs:
            y = mma.w12_mma(x, t, "w12", config=cfg)
            torch.cuda.synchronize()
            rows.append([f"{k}x{n}", m, repr(cfg).replace("MmaConfig", ""),
                         f"{float(y.float().norm()):.4g}"])
    print_table(["K x N", "M", "config", "|y|"], rows, "W12 mma, one call each")


def kernel_parts(fn, calls: int = 20) -> dict[str, float]:
    """Device microseconds a call of `fn` spends in each W12 mma kernel (the tile kernel, the
    split-K sum), by torch.profiler over `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if "w12_mma" in e.key:
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            name = "reduce" if "reduce" in e.key else "tiles"
            out[name] = out.get(name, 0.0) + total / calls
    return out


def fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--layers", action="store_true", help="the 6 layer shapes")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--no-gemv", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new shapes after this many seconds (a device call's limit)")
    ap.add_argument("--launch", default="",
                    help="'ng,depth,wk[,xs|xs3|xs4];...': one call of each configuration at each --ms "
                         "on the first shape, untimed and untuned (a profiler's target)")
    ap.add_argument("--staged", action="store_true",
                    help="also the staged kernels (mma.STAGED_CONFIGS), tuned among themselves")
    ap.add_argument("--parts", action="store_true",
                    help="also the tuned pick's K splits and its two kernels' times (torch.profiler): "
                         "the tiles and the split-K sum")
    ap.add_argument("--smoke", action="store_true", help="CPU: the emulator, tiny shapes")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",") if v]
    if args.launch:
        return launch(args.launch, ms, LAYER_SHAPES[0] if args.layers else ISSUE_SHAPES[0])
    dev = torch.device("cpu" if args.smoke else "cuda")
    result: dict = {"ms": ms}
    if args.smoke:
        shapes, ms, copy = [(128, 64)], [1, 17], 0.0
    else:
        from kernels.w12 import mma

        shapes = LAYER_SHAPES if args.layers else ISSUE_SHAPES
        copy = copy_gbs(dev)
        torch.cuda.empty_cache()
        t0 = time.perf_counter()
        path = mma.build("cuda", mma._arch(dev))
        result.update(copy_gbs=copy, build_s=time.perf_counter() - t0, library=str(path),
                      device=torch.cuda.get_device_name(dev))
        log(f"copy {copy:.0f} GB/s; kernel library {path.name} in {result['build_s']:.1f} s")
    rows, t_start = [], time.perf_counter()
    for k, n in shapes:
        if time.perf_counter() - t_start > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: {k}x{n} and later shapes not run")
            break
        rows += shape_rows(k, n, ms, args, copy, dev)
        result["rows"] = rows
        write_json(args.out, "w12_mma.json", result)
    cols = ["K x N", "M", "cuBLAS us", "GEMV W12 us", "mma W12 us", "mma W8 us",
            "mma W12 x cuBLAS", "W8 / W12", "% copy", "err W12", "err W8", "config"]
    out = []
    for r in rows:
        c, mw, m8 = r.get("cublas_us"), r.get("mma_w12_us"), r.get("mma_w8_us")
        out.append([f"{r['K']}x{r['N']}", r["M"], fmt(c, ".1f"), fmt(r.get("gemv_w12_us"), ".1f"),
                    fmt(mw, ".1f"), fmt(m8, ".1f"), fmt(c / mw if c and mw else None, ".2f"),
                    fmt(mw / m8 if mw and m8 else None, ".2f"), fmt(r.get("pct_copy"), ".0f"),
                    f"{r['err_w12']:.1e}", f"{r['err_w8']:.1e}",
                    (r.get("config") or "").replace("MmaConfig", "")])
    title = ("W12 mma kernel (emulated on the CPU: errors only)" if args.smoke else
             f"W12 mma kernel against cuBLAS bf16 ({result['device']}, copy "
             f"{copy:.0f} GB/s; CUDA graphs, L2 flushed)")
    print_table(cols, out, title)
    if args.parts and not args.smoke:
        pt = []
        for r in rows:
            c, mw, tl, rd, uf = (r.get(k) for k in ("cublas_us", "mma_w12_us", "tiles_us",
                                                     "reduce_us", "other_us"))
            pt.append([f"{r['K']}x{r['N']}", r["M"], r.get("split"), r.get("sum"),
                       fmt(c, ".1f"), fmt(mw, ".1f"), fmt(tl, ".1f"), fmt(rd, ".1f"),
                       fmt(c / tl if c and tl else None, ".2f"), r.get("other_split"),
                       fmt(uf, ".1f"), fmt(uf / mw if uf and mw else None, ".2f"),
                       fmt(c / uf if c and uf else None, ".2f"), str(r.get("other_equal", ""))])
        print_table(["K x N", "M", "K splits", "sum", "cuBLAS us", "mma W12 us", "tiles us",
                     "split-K sum us", "cuBLAS / tiles", "other sum's splits", "other sum us",
                     "other / pick", "other x cuBLAS", "same bits"], pt,
                    "Where the tuner's pick spends its time (torch.profiler, 20 calls, L2 not "
                    "flushed; on sm_90+ the pick's splits are summed in the tiles kernel "
                    "(fused) or by a second kernel (MmaConfig.fuse), and the same pick with "
                    "the other sum is timed beside, CUDA graphs, L2 flushed)")
    if args.staged and not args.smoke:
        st = []
        for r in rows:
            c, mw, sw, s8 = (r.get(k) for k in ("cublas_us", "mma_w12_us", "st_w12_us",
                                                 "st_w8_us"))
            st.append([f"{r['K']}x{r['N']}", r["M"], fmt(c, ".1f"), fmt(mw, ".1f"),
                       fmt(sw, ".1f"), fmt(s8, ".1f"), fmt(c / sw if c and sw else None, ".2f"),
                       fmt(mw / sw if mw and sw else None, ".2f"),
                       fmt(sw / s8 if sw and s8 else None, ".2f"),
                       fmt(bytes_read_of(r, sw), ".0f"),
                       f"{r['err_st']:.1e}", str(r.get("st_equal")),
                       (r.get("st_config") or "").replace("MmaConfig", "")])
        print_table(["K x N", "M", "cuBLAS us", "mma W12 us", "staged W12 us", "staged W8 us",
                     "staged x cuBLAS", "staged x mma", "W8 / W12 staged", "staged GB/s",
                     "err staged", "= mma's bits", "staged config"], st,
                    "The staged kernels beside the tuner's pick (same run)")


if __name__ == "__main__":
    main()
