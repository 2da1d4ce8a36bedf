"""One W12 GEMV shape and configuration, launched a few times (for ncu: profile the last).

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:_w12_gemv_kernel \\
        python3 bench/w12_one_call.py --k 17408 --n 5120 --m 1 --cfg 16,512,4,2,auto
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels.w12 import encode  # noqa: E402
from kernels.w12.gemv import GemvConfig, w12_gemv  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--cfg", default="16,512,4,2,auto",
                    help="block_n,block_k,warps,stages,split[,dot[,swap]]")
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args()
    f = a.cfg.split(",")
    split = f[4] if f[4] == "auto" else int(f[4])
    cfg = GemvConfig(int(f[0]), int(f[1]), int(f[2]), int(f[3]), split,
                     dot=len(f) > 5 and f[5] == "1", swap=len(f) > 6 and f[6] == "1")
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(a.n, a.k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    t = encode(w)
    x = torch.randn(a.m, a.k, device="cuda", generator=g).to(torch.bfloat16)
    for _ in range(a.calls):
        y = w12_gemv(x, t, "w12", cfg)
    torch.cuda.synchronize()
    print(f"{a.k}x{a.n} M={a.m} {cfg}: exceptions {t.num_exceptions}, y {tuple(y.shape)}")


if __name__ == "__main__":
    main()
