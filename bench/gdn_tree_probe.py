"""The GDN WY tree kernel's launch variants, each in a process of its own (memory entry
tree-verify-gdn applied: `bash bench/gpu_hybrid.sh probe`). A variant that faults (the
two-pass kernel's first H200 run, 2026-12-05: an illegal memory access at 64 nodes) loses
only its own CUDA context; the table says which ran (and gave the per-path oracle's
outputs within TOLERANCE: "wrong" otherwise), their error and their time per layer from a
CUDA graph.

    python bench/gdn_tree_probe.py --out $OUT        # the H200: every variant below
    python bench/gdn_tree_probe.py --smoke           # CPU, the interpreter: both kernels
                                                     # run, a variant of BV 24 alone must not

A variant is KERNEL:NODES:STAGES:WARPS:BV:BK (STAGES 0: Triton's default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import common  # noqa: F401  (the repository on sys.path)
from common import log, print_table, smoke_device, timed, write_json

VARIANTS = [f"{k}:{n}:{s}:{w}:{bv}:{bk}" for k, n, s, w, bv, bk in [
    ("one-pass", 16, 0, 4, 32, 32), ("two-pass", 16, 0, 4, 32, 16),
    ("one-pass", 32, 0, 8, 64, 32), ("two-pass", 32, 0, 8, 64, 16),
    ("one-pass", 64, 0, 8, 32, 32), ("two-pass", 64, 0, 8, 32, 16),
    ("two-pass", 64, 1, 8, 32, 16), ("two-pass", 64, 0, 4, 32, 16),
    ("two-pass", 64, 1, 4, 16, 16), ("two-pass", 64, 0, 8, 32, 32)]]


TOLERANCE = 2e-2   # bf16 inputs and outputs: 1.7e-3 to 3.0e-3 on the H200 (docs/results.md)


def one(variant: str, preset: str, iters: int) -> None:
    """The child: one variant, its result as the last line of stdout."""
    import torch

    from gdn_tree import gdn_inputs, graphed, make_tree, path_oracle, rel
    from kernels.gdn import plan
    from kernels.gdn import tree_kernel
    from stock.config import PRESETS

    kernel, n, stages, warps, bv, bk = variant.split(":")
    cfg = PRESETS[preset]
    dev = smoke_device(None)
    tree = make_tree(int(n), cfg.vocab_size)
    tp = plan(tree.parents, cfg.linear_conv_kernel, dev)
    launch = {"kernel": kernel, "BV": int(bv), "BK": int(bk), "num_warps": int(warps)}
    if int(stages):
        launch["num_stages"] = int(stages)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    q, k, v, g, beta, s0 = gdn_inputs(cfg, len(tree), dev, dtype)
    run = lambda: tree_kernel.tree_wy(q, k, v, g, beta, tp.anc8, s0, config=launch)  # noqa: E731
    err = rel(run(), path_oracle(q, k, v, g, beta, tp.parents, s0))
    ms = timed(graphed(run, dev), iters, dev)["median_ms"] if dev == "cuda" else None
    print(f"RESULT {len(tree)} {err:.2e} {ms if ms is None else f'{ms:.4f}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--preset", default="hybrid-27b")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout-s", type=int, default=120, help="per variant")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-hybrid, three variants")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one, args.preset, args.iters)
    variants = args.variants.split(",")
    if args.smoke:
        args.preset, variants = "tiny-hybrid", ["one-pass:16:0:4:16:16", "two-pass:16:0:4:24:16",
                                                "two-pass:16:0:4:16:16"]
    env = dict(os.environ)
    if args.smoke:
        env["TRITON_INTERPRET"] = "1"
    rows = []
    for var in variants:
        log(f"{var}")
        try:
            child = subprocess.run([sys.executable, __file__, "--one", var, "--preset", args.preset,
                                    "--iters", str(args.iters)], capture_output=True, text=True,
                                   timeout=args.timeout_s, env=env)
            lines = [x for x in child.stdout.splitlines() if x.startswith("RESULT ")]
            if child.returncode == 0 and lines:
                nodes, err, ms = lines[-1].split()[1:]
                ok = float(err) <= TOLERANCE
                rows.append([var, nodes, "ran" if ok else "wrong", err, ms])
            else:
                why = (child.stderr.strip().splitlines() or ["no output"])[-1]
                rows.append([var, "", f"failed: {why[:90]}", "", ""])
        except subprocess.TimeoutExpired:
            rows.append([var, "", f"over {args.timeout_s} s", "", ""])
    print_table(["variant", "nodes", "status", "rel err vs per-path", "ms a layer"], rows,
                f"{args.preset}: GDN WY tree kernel variants (kernel:nodes:stages:warps:BV:BK)")
    if args.out:
        write_json(args.out, "gdn_tree_probe.json", {"preset": args.preset, "rows": rows})
    if args.smoke and [r[2] == "ran" for r in rows] != [True, False, True]:
        sys.exit("gdn_tree_probe --smoke: expected the BV 24 variant alone not to run right")


if __name__ == "__main__":
    main()
