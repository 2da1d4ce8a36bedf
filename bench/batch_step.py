"""What one batched decode step costs, kernel by kernel: AR against block speculation at C
rows in a full batch, on random weights of the embedded model's shapes (no GGUF to stage).

Issue 27 asks block speculation at C = 16 for 1.5x AR; at τ 2.09 its decode step (1.80 ms
against AR's 1.18 on the H100, session 31) is what keeps it at 1.36x. This script measures
that step alone, with no admission, no drain and no profiler-slowed prefill in it:

1. For each mode and C: stock's BatchEngine (compiled regions, CUDA graphs) with C requests
   of --prompt random tokens that never finish within the run (max_new past the run's
   steps), admitted, then --warm steps (captures, compiles), then --steps timed steps: the
   wall time of each `step()` (it ends with the step's one host read), median and p10-p90.
2. --profile-steps more steps under torch.profiler: the kernels' device time a step, how
   many kernels a step, and the busy share (kernel time over the unprofiled median step: the
   rest is the host's, launches and bookkeeping between graph replays).
3. The kernels side by side: per kernel name, its microseconds a step in each mode, sorted
   by how much more the last mode spends than the first (where the extra time goes).

With random weights the drafter drafts random tokens: almost none is accepted, so each step
commits one token a row and the contexts grow by one a step (from --prompt). A step's cost
does not depend on the weights' values; the τ column says what acceptance there was.
`--target embedded` runs the real model and shipped drafter on dev prompts instead, with the
stop tokens dropped so that no row frees (τ then includes what follows a stop token).

    python3 bench/batch_step.py --conc 1,16 --modes ar,block:draft_len=7,block --out $OUT
    python3 bench/batch_step.py --conc 16 --static all  # regions compiled for each bucket's sizes
    python3 bench/batch_step.py --smoke       # CPU: random:tiny-qwen3, eager, no profile

Prints the tables; writes batch_step.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common  # noqa: F401  (the repository on sys.path)
from common import (is_cuda, kernel_times, log, parse_mode, print_table, quantile,
                    smoke_device, write_json)

import torch  # noqa: E402

from stock.drafters.block import BlockConfig, BlockNet  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import batch_engine  # noqa: E402


def load(args):
    """(model, prompts [C_max lists of ids], stop ids, a block net or None for the shipped)."""
    dev = torch.device(args.device)
    n = max(args.conc)
    if args.target.startswith("random:"):
        from stock.config import PRESETS
        from stock.model import Transformer

        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        model = Transformer.random(PRESETS[args.target[7:]], dev, dtype, seed=0)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(1, model.cfg.vocab_size, (args.prompt,), generator=gen).tolist()
                   for _ in range(n)]
        layers = min(3, model.cfg.num_layers)
        cfg = BlockConfig.for_target(model.cfg, num_layers=layers, block_size=args.block_size)
        net = BlockNet(cfg).init_weights(2, std=0.02).to(dev, dtype)
        return model, prompts, frozenset(), net
    from common import embedded_workload
    model, reqs, _stops = embedded_workload(args.device, 8, n, args.target)
    return model, [p for p, _ in reqs], frozenset(), None   # stops dropped: no row frees


def full_batch(eng, prompts, max_new: int) -> None:
    """Submit the prompts and step until every one is admitted and decoding."""
    for p in prompts:
        eng.submit(p, max_new)
    while eng.waiting or any(r is None for r in eng.rows):
        eng.step()
        if eng.idle:
            raise SystemExit("every request finished before the batch was full")


def steps(eng, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        eng.step()   # ends with the step's one host read
        out.append(time.perf_counter() - t)
    if any(r is None for r in eng.rows):
        raise SystemExit("a request finished inside the timed steps: raise --max-new")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="random:smollm2-135m")
    ap.add_argument("--modes", default="ar,block:draft_len=7,block")
    ap.add_argument("--conc", default="16", help="concurrencies (rows in the batch)")
    ap.add_argument("--prompt", type=int, default=250, help="random targets: prompt tokens")
    ap.add_argument("--block-size", type=int, default=16, help="random targets: the drafter's")
    ap.add_argument("--warm", type=int, default=40, help="steps before the timing")
    ap.add_argument("--steps", type=int, default=200, help="timed steps")
    ap.add_argument("--profile-steps", type=int, default=50, help="CUDA: profiled steps")
    ap.add_argument("--top", type=int, default=25, help="kernels in the side-by-side table")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--static", choices=("none", "requests", "tokens", "drafter", "all"),
                    default="none",
                    help="which sizes the regions compile for each bucket instead of one "
                         "dynamic graph (stock.compiled): none (stock), the requests dims, "
                         "the target's and the drafter's rows (DYNAMIC_REQUESTS off), the "
                         "target's tokens dims (DYNAMIC_TOKENS off), the batched drafter's "
                         "rows alone (DYNAMIC_DRAFTER off), all (DYNAMIC_SIZES off)")
    ap.add_argument("--smoke", action="store_true", help="CPU: random:tiny-qwen3, few steps")
    args = ap.parse_args()
    if args.smoke:
        args.target, args.prompt, args.conc = "random:tiny-qwen3", 12, "1,2"
        args.warm, args.steps, args.profile_steps, args.block_size = 2, 4, 0, 4
        args.modes = "ar,block:draft_len=3"
    args.device = smoke_device(args)
    if args.static != "none":
        from stock import compiled

        compiled.DYNAMIC_SIZES = args.static != "all"
        compiled.DYNAMIC_REQUESTS = args.static != "requests"
        compiled.DYNAMIC_TOKENS = args.static != "tokens"
        compiled.DYNAMIC_DRAFTER = args.static != "drafter"
    args.conc = [int(c) for c in args.conc.split(",")]
    modes = args.modes.split(",")
    cuda = is_cuda(args.device)
    model, prompts, stops, net = load(args)
    total = args.warm + args.steps + (args.profile_steps if cuda else 0)
    max_new = total * 17 + 64   # a block step commits at most block_size + 1 tokens
    ctx = args.prompt if net is not None else max(map(len, prompts))
    ctx = min(ctx + max_new + 8, model.cfg.max_position - 64)   # a row that reaches it stops
    log(f"{args.target} on {args.device}: modes {modes}, C {args.conc}, context {ctx}, "
        f"{args.warm} warm + {args.steps} timed steps each, "
        f"static sizes: {args.static}")
    res, rows, per_kernel = {}, [], {}
    for mode in modes:
        name, opts = parse_mode(mode)
        base = Engine(model, Options(opts), ctx, set(stops))
        for c in args.conc:
            key = f"{mode}@{c}"
            eng = batch_engine(base, None if name == "ar" else name, c,
                               net=net if name == "block" else None)
            t0 = time.perf_counter()
            full_batch(eng, prompts[:c], max_new)
            steps(eng, args.warm)
            log(f"{key}: batch full and {args.warm} warm steps in {time.perf_counter() - t0:.1f} s")
            gained0 = sum(len(r.tokens) for r in eng.active)
            wall = steps(eng, args.steps)
            gained = sum(len(r.tokens) for r in eng.active) - gained0
            ms = [1e3 * w for w in wall]
            r = res[key] = {"step_ms": statistics.median(ms), "p10": quantile(ms, 0.1),
                            "p90": quantile(ms, 0.9), "tau": gained / (c * args.steps),
                            "tok_s": gained / sum(wall)}
            if cuda and args.profile_steps:
                acc, pwall = kernel_times(lambda: steps(eng, args.profile_steps))
                per_kernel[key] = {k: (us / args.profile_steps, n / args.profile_steps)
                                   for k, (us, n) in acc.items()}
                k_ms = sum(us for us, _ in acc.values()) / args.profile_steps / 1e3
                r.update(kernel_ms=k_ms, launches=sum(n for _, n in acc.values()) / args.profile_steps,
                         busy=k_ms / r["step_ms"], profiled_step_ms=1e3 * pwall / args.profile_steps)
            rows.append([mode, c, f"{r['step_ms']:.3f}", f"{r['p10']:.3f}-{r['p90']:.3f}",
                         f"{r['tau']:.2f}", f"{r['tok_s']:.0f}",
                         f"{r['step_ms'] / res[f'ar@{c}']['step_ms']:.2f}" if f"ar@{c}" in res else "",
                         f"{r['kernel_ms']:.3f}" if "kernel_ms" in r else "",
                         f"{r['launches']:.0f}" if "launches" in r else "",
                         f"{100 * r['busy']:.0f}" if "busy" in r else ""])
            log(f"{key}: step {r['step_ms']:.3f} ms, τ {r['tau']:.2f}")
    print_table(["mode", "C", "step ms (median)", "p10-p90", "τ", "tok/s", "step x AR",
                 "kernel ms a step", "kernels a step", "busy %"], rows,
                f"{args.target}: a full batch's decode step")
    for c in args.conc if per_kernel else ():
        keys = [f"{m}@{c}" for m in modes if f"{m}@{c}" in per_kernel]
        names = set().union(*(per_kernel[k] for k in keys))
        first, last = per_kernel[keys[0]], per_kernel[keys[-1]]
        order = sorted(names, key=lambda n: -(last.get(n, (0, 0))[0] - first.get(n, (0, 0))[0]))
        krows = [[n[:60]] + [f"{per_kernel[k].get(n, (0, 0))[0]:.1f} ({per_kernel[k].get(n, (0, 0))[1]:.0f})"
                             for k in keys]
                 + [f"{last.get(n, (0, 0))[0] - first.get(n, (0, 0))[0]:+.1f}"]
                 for n in order[:args.top]]
        print_table(["kernel"] + [f"{k}: us a step (calls)" for k in keys]
                    + [f"{keys[-1]} - {keys[0]} us"], krows,
                    f"C = {c}: kernels a step, by what {keys[-1]} adds to {keys[0]}")
    write_json(args.out, "batch_step.json", {"args": vars(args), "results": res,
                                             "kernels": per_kernel})


if __name__ == "__main__":
    main()
