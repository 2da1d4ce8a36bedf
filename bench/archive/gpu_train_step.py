"""Where a block-drafter training step's time goes (training/loop.py).

Answers `--prompts` corpus prompts with the embedded target (as the training command does), then
times training steps of a freshly initialised drafter two ways, side by side:

- `cached`: the target's hidden states of every row computed once (the training loop's default),
  eager head and loss;
- `cached, compiled loss`: the same with the head and loss through torch.compile
  (training/loss.py; what the training loop does on CUDA);
- `live`: one target forward per step over that step's rows (`--features live`).

For `cached` each phase of a step is timed alone with CUDA events (the block forward and
its head, the loss, the backward, the clip and optimizer step), and `--profile` lists the
kernels that took the most device time over a few steps (torch.profiler).

    python3 bench/gpu_train_step.py --out $OUT                  # H200
    python3 bench/gpu_train_step.py --device cpu --prompts 8 --max-new 16 --batch 2 \
        --anchors 2 --steps 2 --warm 1                            # plumbing only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stock.drafters.block import BlockConfig  # noqa: E402
from training import loop  # noqa: E402
from training.cli import embedded_setup  # noqa: E402
from training.data import generate_data  # noqa: E402
from training.loss import HeadLoss  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _time(dev, fn, n):
    """Mean ms of fn() over n calls (synchronised around the loop)."""
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(dev)
    return (time.perf_counter() - t0) * 1e3 / n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=2048)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    cfg = loop.TrainConfig(seed=0, prompts=args.prompts, max_new=args.max_new,
                         gen_batch=args.gen_batch, batch=args.batch, anchors=args.anchors)
    t0 = time.perf_counter()
    target, prompts, stops, _, _, _, _ = embedded_setup(cfg, args.device)
    prompts = prompts[:args.prompts]
    dev = target.device
    data = generate_data(target, prompts, cfg.max_new, cfg.gen_batch, stops, lambda m: None)
    n_tok = int((data.end - data.prompt_cols).clamp(min=0).sum())
    print(f"{len(data.end)} answers, {n_tok} answer tokens, width {data.tokens.shape[1]}, "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    for p in target.parameters():
        p.requires_grad_(False)
    bcfg = BlockConfig.for_target(target.cfg, cfg.num_layers, cfg.block_size,
                                  num_target_layers=cfg.num_target_layers)
    rows = torch.nonzero(data.end - data.prompt_cols >= 2).flatten()
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    results = {"answers": len(data.end), "answer_tokens": n_tok, "batch": args.batch,
               "anchors": args.anchors}

    cached = loop.extract_features(target, data, bcfg.target_layers, cfg.feat_batch)
    variants = {"cached": (cached, False), "cached, compiled loss": (cached, True),
                "live": (loop.LiveFeatures(target, data, bcfg.target_layers), False)}
    for name, (feats, compiled) in variants.items():
        net, _ = loop.init_net(target, bcfg, cfg)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, betas=(0.9, 0.95))
        gen = torch.Generator().manual_seed(0)
        head = HeadLoss(target.lm_head.weight, cfg.decay, compiled=compiled)

        def step():
            idx = rows[torch.randint(len(rows), (args.batch,), generator=gen)]
            with autocast:
                loss, _ = loop.block_loss(net, target, data, feats, idx, gen, args.anchors,
                                        cfg.decay, head)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            return float(loss.detach())

        _time(dev, step, args.warm)  # (the compiled loss compiles here)
        ms = _time(dev, step, args.steps)
        results[f"{name}_step_ms"] = round(ms, 3)
        print(f"{name}: {ms:.2f} ms/step", flush=True)
        if name != "cached":
            continue
        # phases alone, on one fixed batch
        idx = rows[torch.randint(len(rows), (args.batch,), generator=gen)]
        p = loop.sample_anchors(data, idx, args.anchors, gen)

        def fwd():
            with autocast:
                return loop.block_forward(net, target, data, feats, idx, p)

        def fwd_loss():
            logits, labels = fwd()
            return loop._loss_acc(logits, labels, cfg.decay)[0]

        def fwd_bwd():
            fwd_loss().backward()

        def opt_only():
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()

        def feat_only():
            loop.feature_rows(feats, idx, int(data.end[idx].max()))

        phase = {"block_forward + head": fwd, "+ loss": fwd_loss, "+ backward": fwd_bwd,
                 "clip + AdamW": opt_only, "features (gather)": feat_only}
        for k, fn in phase.items():
            _time(dev, fn, 2)
            results[f"phase {k}"] = round(_time(dev, fn, args.steps), 3)
        opt.zero_grad(set_to_none=True)
        live = loop.LiveFeatures(target, data, bcfg.target_layers)
        s = int(data.end[idx].max())
        results["phase live target forward"] = round(
            _time(dev, lambda: live.rows(idx, s), args.steps), 3)
        if args.profile and dev.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                _sync(dev)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                              max_name_column_width=70)
            print(table, flush=True)
            results["profile_top"] = table
    print("\n| measure | ms |\n| --- | --- |")
    for k, v in results.items():
        if k != "profile_top" and ("ms" in k or k.startswith("phase")):
            print(f"| {k} | {v} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "train_step.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
