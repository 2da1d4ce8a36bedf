"""Where a block-speculative step's time goes: each phase's host time and its device time.

One process, one engine; the block drafter in up to four variants (`--variants`): `plain`
(eager context update of the committed span, then the block forward, all eager), `static`
(the fixed-shape step of stock/drafters/block_step.py run eagerly), `graphs` (that step
replayed from a CUDA graph) and `compiled` (its regions torch.compile'd, in the graph: the
default on CUDA). For each variant a generate runs with the phases wrapped:

- `host`: nothing added; each phase's wall time is what the host spends launching it (a
  phase that reads the GPU, e.g. draft()'s lattice read, also waits for the work before it);
- `sync` (the last variant only): torch.cuda.synchronize() before and after every phase, so
  a phase's time is its launches and its own device work, whichever is longer.

Phases: the drafter's `extend` (context update, eager), `_load` (step inputs), `_replay`
(with graphs) or `_packed` (without): the step's forward and top-k, the rest of `draft()`
(the lattice's host read and, on the fixed-shape path, the span's copy); the
engine's verify (`runner.load`, `runner.launch`) and the rest of a step (the accepted-length
read, hidden-state copies, bookkeeping). Then each piece alone in a loop of 50 (CUDA events
for device time, perf_counter for host time): each variant's forward, the eager extend of 1
and 16 positions, and the verify graph at T = 1 and 16. AR and n-gram steps of the same
engine are timed beside them. Every verify graph the runs can reach is captured first.

    python3 bench/gpu_draft_split.py --out $OUT                   # H200, random target
    python3 bench/gpu_draft_split.py --model embedded --out $OUT  # real weights, shipped drafter
    python3 bench/gpu_draft_split.py --device cpu --max-new 8     # plumbing only (no graphs)

`random` is the embedded model's shape with random bf16 weights and a random drafter of the
shipped shape (τ about 1, shapes as the real ones: `bench/gpu_block_step.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stock.options import resolve  # noqa: E402

VARIANTS = {"plain": {}, "static": {"static": True}, "graphs": {"graphs": True},
            "compiled": {"graphs": True, "compiled": True}}
PHASES = ("draft", "extend", "load", "forward", "verify", "verify.load", "verify.launch")


def build(args):
    """(engine, drafter factory, prompt ids) for the chosen model."""
    opts = [f"block_size={args.block_size}", f"draft_len={args.block_size - 1}", *args.opt]
    if args.model == "embedded":
        from specpilot.requests import load_dev, select
        from stock.system import load_system

        system = load_system("embedded", resolve(opts), device=args.device, max_context=2048)
        req = select(load_dev(), ["code"], 1)[0]
        return system.engine, system.drafter, system.tokenizer.chat(req.prompt)
    from stock.config import PRESETS
    from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet
    from stock.engine import Engine
    from stock.model import Transformer
    from stock.system import make_drafter

    dev = torch.device(args.device)
    cfg = PRESETS["smollm2-135m"]
    target = Transformer.random(cfg, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32,
                                seed=0)
    eng = Engine(target, resolve(opts), 2048)
    torch.manual_seed(0)
    bnet = BlockNet(BlockConfig.for_target(cfg, block_size=args.block_size)).init_weights(0)

    def drafter(name):
        if name == "block":
            return BlockDrafter(bnet, target, eng.max_context, eng.options["block_topk"])
        return make_drafter(name, eng)
    g = torch.Generator().manual_seed(1)
    return eng, drafter, torch.randint(0, cfg.vocab_size, (args.prompt,), generator=g).tolist()


def wrap(obj, name: str, key: str, acc: dict, sync: bool) -> None:
    inner = getattr(obj, name)

    def timed(*a, **kw):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            if sync:
                torch.cuda.synchronize()
            acc[key] += time.perf_counter() - t
    setattr(obj, name, timed)


def variant(drafter, name: str):
    """A block drafter of the factory's weights, built as one of VARIANTS (a new one: stock
    keeps one block drafter per engine, which the variants must not share)."""
    from stock.drafters.block import BlockDrafter

    base = drafter("block")
    return BlockDrafter(base.net, base.target, base.max_len, base.topk, **VARIANTS[name])


def split(eng, drafter, prompt, max_new: int, sync: bool, name: str) -> dict:
    acc: dict[str, float] = defaultdict(float)
    d = variant(drafter, name)
    eng.generate(prompt, 16, d)  # warm-up: graphs of the buckets this request reaches
    for name, key in (("draft", "draft"), ("extend", "extend"), ("_load", "load")):
        wrap(d, name, key, acc, sync)
    wrap(d, "_replay" if d.graphs else "_packed", "forward", acc, sync)
    wrap(eng, "_verify", "verify", acc, sync)
    if eng.runner is not None:
        wrap(eng.runner, "load", "verify.load", acc, sync)
        wrap(eng.runner, "launch", "verify.launch", acc, sync)
    try:
        res = eng.generate(prompt, max_new, d)
    finally:
        for obj, names in ((d, ("draft", "extend", "_load", "_replay", "_packed")),
                           (eng, ("_verify",)), (eng.runner, ("load", "launch"))):
            for n in names:  # back to the class's methods
                if obj is not None and n in vars(obj):
                    delattr(obj, n)
    ms = {k: 1e3 * acc[k] / res.steps for k in PHASES}
    ms["draft.rest"] = ms["draft"] - ms["extend"] - ms["load"] - ms["forward"]
    ms["step"] = res.step_ms
    ms["step.rest"] = ms["step"] - ms["draft"] - ms["verify"]
    return {"steps": res.steps, "tau": round(res.tau, 3),
            "ms": {k: round(v, 4) for k, v in ms.items()}}


def loop(fn, n: int = 50, cuda: bool = True) -> dict:
    """Host ms a call (perf_counter over n calls, one sync at the end) and device ms a call
    (CUDA events around the n calls)."""
    fn()
    if not cuda:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return {"host_ms": round(1e3 * (time.perf_counter() - t) / n, 4)}
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    a.record()
    for _ in range(n):
        fn()
    host = time.perf_counter() - t
    b.record()
    torch.cuda.synchronize()
    return {"host_ms": round(1e3 * host / n, 4), "device_ms": round(a.elapsed_time(b) / n, 4)}


@torch.inference_mode()
def pieces(eng, drafter, prompt, names) -> dict:
    cuda = eng.model.device.type == "cuda"
    out = {}
    for name in names:
        d = variant(drafter, name)
        eng.generate(prompt, 16, d)
        kv = d.kv_bucket(d.ctx_len + d.net.cfg.block_size)
        d._load(0, d.ctx_len - 1)
        out[f"{name}: step forward"] = loop(
            (lambda: d._replay(kv)) if d.graphs else (lambda: d._packed(kv)), cuda=cuda)
    ctx = d.ctx_len
    h = d.net.cfg.hidden_size
    for n in (1, 16):
        hid = {layer: torch.randn(1, n, h, device=eng.model.device, dtype=eng.model.dtype)
               for layer in d.hidden_layers}

        def ext(hid=hid, n=n):
            d.ctx_len = ctx
            d.extend(hid, ctx + n)
        out[f"eager extend {n}"] = loop(ext, cuda=cuda)
    d.ctx_len = ctx
    if eng.runner is not None:
        start = eng.cache.length
        for t in (1, 16):
            s = eng.runner.slot(t, eng.runner.kv_bucket(start + t), tuple(d.hidden_layers))
            eng.runner.load(s, prompt[:t], start)
            out[f"verify T={t} (graph)" if s.graph is not None else f"verify T={t}"] = loop(
                lambda s=s: eng.runner.launch(s), cuda=cuda)
    return out


@torch.inference_mode()
def profile_forward(eng, drafter, prompt, name: str) -> str:
    from torch.profiler import ProfilerActivity, profile

    d = variant(drafter, name)
    eng.generate(prompt, 16, d)
    kv = d.kv_bucket(d.ctx_len + d.net.cfg.block_size)
    d._load(0, d.ctx_len - 1)
    for _ in range(3):
        d._packed(kv)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(20):
            d._packed(kv)
        torch.cuda.synchronize()
    return p.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("random", "embedded"), default="random")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt", type=int, default=256, help="random: prompt tokens")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--opt", action="append", default=[], help="engine option NAME=VALUE")
    ap.add_argument("--variants", default=None,
                    help=f"comma-separated of {','.join(VARIANTS)} (default: all on CUDA, "
                         "plain,static on CPU)")
    ap.add_argument("--profile", action="store_true",
                    help="also a torch.profiler table of the last variant's step forward, run "
                         "without its graph (kernels by device time)")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    eng, drafter, prompt = build(args)
    cuda = eng.model.device.type == "cuda"
    print(f"{args.model} on {eng.model.device} ({time.perf_counter() - t0:.1f} s), prompt "
          f"{len(prompt)} tokens, options {' '.join(args.opt) or 'defaults'}", flush=True)
    names = (args.variants.split(",") if args.variants
             else list(VARIANTS) if cuda else ["plain", "static"])
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")
    if eng.runner is not None:  # no verify graph captured inside a timed run
        end = len(prompt) + args.max_new + 64
        for layers in ((), tuple(drafter("block").hidden_layers)):
            eng.runner.capture_upto(min(end, eng.max_context), layers)
    steps = {}
    for name in ("ar", "ngram"):
        d = drafter(name) if name != "ar" else None
        eng.generate(prompt, 16, d)
        res = eng.generate(prompt, args.max_new, drafter(name) if name != "ar" else None)
        steps[name] = {"step_ms": round(res.step_ms, 4), "tau": round(res.tau, 3),
                       "steps": res.steps}
    runs = {name: split(eng, drafter, prompt, args.max_new, False, name) for name in names}
    if cuda:
        runs[f"{names[-1]} sync"] = split(eng, drafter, prompt, args.max_new, True, names[-1])
    alone = pieces(eng, drafter, prompt, names)
    table = profile_forward(eng, drafter, prompt, names[-1]) if args.profile and cuda else None
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "model": args.model,
              "torch": torch.__version__, "options": eng.options.as_dict(),
              "steps": steps, "split": runs, "alone": alone, "profile": table}
    print("\nsteps (ms a decoding step): " + ", ".join(
        f"{k} {v['step_ms']:.3f} (τ {v['tau']})" for k, v in steps.items()))
    keys = [*PHASES, "draft.rest", "step.rest", "step"]
    print(f"\n{'phase, ms a step':<18}" + "".join(f"{r:>15}" for r in runs))
    for k in keys:
        print(f"{k:<18}" + "".join(f"{runs[r]['ms'][k]:>15.3f}" for r in runs))
    print(f"{'τ':<18}" + "".join(f"{runs[r]['tau']:>15}" for r in runs))
    print(f"\n{'alone, ms a call':<30}{'host':>10}{'device':>10}")
    for k, v in alone.items():
        print(f"{k:<30}{v['host_ms']:>10.4f}{v.get('device_ms', float('nan')):>10.4f}")
    if table:
        print(f"\n== {names[-1]}: step forward without its graph, 20 calls\n{table}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"gpu_draft_split_{args.model}.json").write_text(
            json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
