"""Run chosen W12 GEMV configurations on one layer shape, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats -k regex:_w12_gemv_kernel \
        python3 bench/w12_ncu.py --shape 17408x5120 --m 16

Each configuration (GemvConfig fields; the M = 1 bucket's first and the M = 16 bucket's
first, in both K orders, by default) is checked against decode-then-matmul once, then
launched --reps times; the kernel names in the profile come in that order. Needs CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if "kernels" not in sys.modules and not any(Path(p, "kernels").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels.w12 import decode, encode  # noqa: E402
from kernels.w12 import gemv as G  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="17408x5120", help="KxN")
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="every configuration of the M bucket")
    args = ap.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    t = encode(w)
    wd = decode(t)
    x = torch.randn(args.m, k, device="cuda", generator=g).to(torch.bfloat16)
    ref = x.float() @ wd.float().T
    first = G.CONFIGS[G.bucket(args.m)][0]
    cfgs = list(G.CONFIGS[G.bucket(args.m)]) if args.all else [first]
    if first.swap and not args.all:
        cfgs.append(dataclasses.replace(first, shared_k=not first.shared_k))
    for cfg in cfgs:
        y = torch.empty(args.m, n, dtype=torch.bfloat16, device="cuda")
        G._launch(x, t, y, True, cfg)
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        print(f"{cfg}: rel err {err:.2e}", flush=True)
        for _ in range(args.reps):
            G._launch(x, t, y, True, cfg)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
