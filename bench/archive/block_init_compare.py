"""Block drafter: random init against init from the target's layers, same data, same steps.

    python bench/block_init_compare.py [--prompts 48] [--steps 40] [--device cpu]

The embedded target answers `--prompts` training prompts (max 64 new tokens), then a
3-layer drafter trains from each init on the same answers; validation holds out whole prompt
groups. Prints training loss every 5 steps and the validation history per init. A small
CPU-sized check of the start of training, not a drafter: τ needs the GPU run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from training.cli import embedded_setup
from training.data import generate_data
from training.loop import TrainConfig, train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    base = dict(seed=0, prompts=args.prompts, max_prompt=96, max_new=64)
    target, prompts, stops, _, groups, _, _ = embedded_setup(TrainConfig(**base), args.device)
    t = time.perf_counter()
    data = generate_data(target, prompts, 64, 48, stops, progress=lambda m: None)
    print(f"{len(prompts)} prompts answered in {time.perf_counter() - t:.1f}s", flush=True)
    rows = {}
    for init in ("", "last"):
        cfg = TrainConfig(**base, num_layers=3, steps=args.steps, batch=8, anchors=8, warmup=5,
                          val_every=10, holdout=0.2, init_from_target=init)
        torch.manual_seed(0)
        _, stats, losses = train(target, prompts, cfg, stops, progress=lambda m: None,
                                 data=data, groups=groups)
        rows[init or "random"] = {"train_loss": [round(x, 2) for x in losses[::5]],
                                  "val": stats["val_history"]}
    print("| init | train loss every 5 steps | val loss by check | val acc-len by check |")
    print("| --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {' '.join(map(str, r['train_loss']))} | "
              f"{' '.join(str(h['val_loss']) for h in r['val'])} | "
              f"{' '.join(str(h['val_acc_len']) for h in r['val'])} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
