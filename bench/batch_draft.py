"""What a batched block-speculation step is made of: the draft's last region (lattice or
chain), and the device's kernels over a whole run against the run's wall time.

At concurrency C on the embedded default (the shipped block drafter) the script builds
stock's BatchEngine with the batched block drafter (and one without a drafter, AR), warms
it on 2C dev requests, then:

1. **The draft, replayed from its CUDA graphs**, all C rows drafting 15 tokens from their
   contexts: `draft_chains` (the forward ending in an argmax, the chains left on the device,
   what the static step takes) against the same forward ending in the lattice (log-softmax
   and top-k over the vocabulary, packed; `draft` then reads it to the host), CUDA-event
   times, median of --iters.
2. **The last region alone** on [C, block, H] and [1, block, H] inputs, each compiled and
   captured in a CUDA graph: the target's head (final norm, lm_head, fp32 logits), head +
   argmax (`batch_block_chain`), head + log-softmax + top-k (`batch_block_lattice`), and
   the same lattice packed two other ways (top-k of the logits with logsumexp, and a
   two-stage top-k over chunks of 1024 ids), with how far each is from the lattice.
3. **A whole run under torch.profiler** for AR and block: the sum of kernel times against
   the run's wall time (how much of the run the GPU is busy: the rest is the host's), and
   the kernels that take most of it (kernels replayed from CUDA graphs are listed where the
   profiler sees them).

    python3 bench/batch_draft.py --conc 16 --out $OUT    # H200, the embedded GGUF staged
    python3 bench/batch_draft.py --smoke                  # CPU: random:tiny-qwen3, a random
                                                          # drafter, steps 1-2 only (eager)

Prints the tables; writes batch_draft.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace

import common  # noqa: F401  (the repository on sys.path)
from common import log, print_table, profiled, smoke_device, timed, write_json

import torch  # noqa: E402

from batch_throughput import load as load_target  # noqa: E402
from stock.drafters.block_batch_step import (batch_block_chain,  # noqa: E402
                                             batch_block_lattice)
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import batch_engine  # noqa: E402


def load(args):
    """(single-request engine, 2C requests [(prompt ids, max_new)]) for --target, loaded as
    bench/batch_throughput.py loads it (random targets: 12-token random prompts)."""
    model, reqs, stops = load_target(SimpleNamespace(
        target=args.target, device=args.device, waves=2, conc=[args.conc], prompt=12,
        max_new=args.max_new))
    ctx = max(len(p) for p, _ in reqs) + args.max_new + 8
    return Engine(model, Options(), ctx, set(stops)), reqs


def block_engine(single: Engine, conc: int, smoke: bool):
    """The batched engine with the block drafter: the shipped weights, or on --smoke a
    random drafter of the tiny target's shape."""
    if not smoke:
        return batch_engine(single, "block", conc)
    from stock.batch import BatchEngine
    from stock.drafters.block import BlockConfig, BlockNet
    from stock.drafters.block_batch import BatchBlockDrafter

    model = single.model
    net = BlockNet(BlockConfig.for_target(model.cfg, num_layers=2, block_size=4))
    net = net.init_from_target(model)
    bd = BatchBlockDrafter(net, model, single.max_context, rows=conc + 1, static=True,
                           capture=False)
    return BatchEngine(model, single.options, max_batch=conc, max_context=single.max_context,
                       static=True, capture=False, batch_drafter=bd,
                       stop_ids=single.stop_ids)


def run(engine, reqs) -> float:
    """Submit every request at once and step to the end; the wall seconds."""
    t0 = time.perf_counter()
    for p, m in reqs:
        engine.submit(p, m)
    engine.run()
    return time.perf_counter() - t0


def draft_times(bd, conc: int, iters: int, dev: str) -> list[list]:
    """Step 1: the draft of `conc` rows, chains (argmax) against lattices, as replayed."""
    rows = list(range(conc))
    pend = [1] * conc
    ks = [bd.net.cfg.block_size - 1] * conc
    ends = list(bd.ctx_len[:conc])
    out = []
    for name, fn in (("draft_chains (argmax, on the device)",
                      lambda: bd.draft_chains(rows, pend, ks)),
                     ("lattices (log-softmax + top-k, on the device)",
                      lambda: bd._lattices(rows, pend)),
                     ("draft (lattices read to the host)", lambda: bd.draft(rows, pend, ks))):
        t = timed(fn, iters, dev)
        bd.ctx_len[:conc] = ends   # drafting never moves the contexts; kept as they were
        out.append([name, f"{t['median_ms']:.3f}", f"{t['p10_ms']:.3f}-{t['p90_ms']:.3f}"])
    return out


def topk_logits(logits: torch.Tensor, k: int) -> torch.Tensor:
    """A lattice packed as block_step.pack_lattice packs it, without the log-softmax's
    [rows, vocab] tensor: top-k of the logits themselves (the same order: log-softmax is
    monotone), their log-probs as logit - logsumexp."""
    top = logits.topk(k, dim=-1)
    lp = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.stack([top.indices.double(), lp.double()])


def topk_two_stage(logits: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """As `topk_logits`, the top-k found in two stages: every chunk of `chunk` ids' top-k,
    then the top-k of those (many short slices instead of one long one per row)."""
    v = logits.shape[-1]
    pad = -v % chunk
    x = torch.nn.functional.pad(logits, (0, pad), value=float("-inf")) if pad else logits
    part = x.view(*x.shape[:-1], -1, chunk).topk(k, dim=-1)
    base = torch.arange(0, v + pad, chunk, device=logits.device)[:, None]
    ids = (part.indices + base).flatten(-2)
    top = part.values.flatten(-2).topk(k, dim=-1)
    lp = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.stack([ids.gather(-1, top.indices).double(), lp.double()])


def region_times(bd, conc: int, iters: int, dev: str) -> list[list]:
    """Step 2: the draft's last region alone on [conc, block, H] (and [1, block, H]: the
    single-request drafter's shape), in CUDA graphs on CUDA: the head, head + argmax, the
    lattice as packed now, and two ways of packing the same lattice with less traffic."""
    from stock.compiled import head
    from stock.graphs import capture

    model, net = bd.target, bd.net
    out = []
    pool = torch.cuda.graph_pool_handle() if dev.startswith("cuda") else None
    for rows in dict.fromkeys((conc, 1)):
        x = torch.randn(rows, net.cfg.block_size, model.cfg.hidden_size, device=dev,
                        dtype=model.dtype)
        fns = {"head (norm, lm_head, fp32 logits)": lambda: head(x, net.norm, model.lm_head),
               "head + argmax (batch_block_chain)": lambda: batch_block_chain(
                   x, net.norm, model.lm_head),
               "head + log-softmax + top-k (batch_block_lattice)": lambda: batch_block_lattice(
                   x, net.norm, model.lm_head, bd.topk),
               "head + top-k of logits + logsumexp": lambda: topk_logits(
                   head(x, net.norm, model.lm_head), bd.topk),
               "head + two-stage top-k + logsumexp": lambda: topk_two_stage(
                   head(x, net.norm, model.lm_head), bd.topk)}
        with torch.inference_mode():
            want = fns["head + log-softmax + top-k (batch_block_lattice)"]()
            for name, fn in fns.items():
                call, res = fn, None
                if pool is not None:   # compiled, captured; the replay's output is `res`
                    graph, res = capture(torch.compile(fn, dynamic=False), torch.device(dev),
                                         pool)
                    call = graph.replay
                call()
                res = fn() if res is None else res
                same = ""
                if res.dim() == 4:   # a lattice: its ids and log-probs against the lattice's
                    same = (f"ids {float((res[0] == want[0]).float().mean()):.4f}, "
                            f"log-probs within {float((res[1] - want[1]).abs().max()):.1e}")
                t = timed(call, iters, dev)
                out.append([rows, name, f"{t['median_ms']:.3f}",
                            f"{t['p10_ms']:.3f}-{t['p90_ms']:.3f}", same])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--conc", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--top", type=int, default=14, help="kernels listed per profiled run")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: random:tiny-qwen3, small")
    args = ap.parse_args()
    if args.smoke:
        args.target, args.conc, args.max_new, args.iters = "random:tiny-qwen3", 2, 8, 3
    args.device = smoke_device(args)
    single, reqs = load(args)
    cuda = args.device.startswith("cuda")
    log(f"{args.target} on {args.device}: C = {args.conc}, {len(reqs)} requests a run")
    engines = {"ar": batch_engine(single, None, args.conc),
               "block": block_engine(single, args.conc, args.smoke)}
    for name, eng in engines.items():
        run(eng, reqs)   # warm: graphs captured, regions compiled
        log(f"{name}: warm run {run(eng, reqs):.3f} s")
    bd = engines["block"].batch_drafter
    res = {"target": args.target, "device": args.device, "conc": args.conc}
    res["draft"] = draft_times(bd, args.conc, args.iters, args.device)
    print_table(["the draft of C rows", "ms (median)", "p10-p90"], res["draft"],
                f"step 1: the batched block drafter's draft at C = {args.conc}, "
                f"{'replayed from CUDA graphs' if bd.capture else 'eager'}")
    res["regions"] = region_times(bd, args.conc, args.iters, args.device)
    print_table(["rows", "the draft's last region", "ms (median)", "p10-p90",
                 "= the lattice (eager)"], res["regions"],
                f"step 2: on [rows, {bd.net.cfg.block_size}, hidden]"
                + (", compiled, in CUDA graphs" if cuda else ", eager"))
    if cuda:
        res["profiled"] = {}
        for name, eng in engines.items():
            info, rows = profiled(lambda: run(eng, reqs), args.top)   # step 3
            res["profiled"][name] = {**info, "top": rows}
            print_table(["kernel", "calls", "ms", "% of kernel time"], rows,
                        f"step 3: {name} at C = {args.conc}, one run of {len(reqs)} requests "
                        f"under the profiler: wall {info['wall_s']:.3f} s, kernels "
                        f"{info['kernel_s']:.3f} s ({100 * info['kernel_s'] / info['wall_s']:.0f}"
                        f"% busy), {info['kernels']} distinct")
    write_json(args.out, "batch_draft.json", res)


if __name__ == "__main__":
    main()
