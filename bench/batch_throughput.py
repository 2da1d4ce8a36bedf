"""Batched decoding throughput: the BatchEngine at several concurrencies, AR and drafters.

At each concurrency C the engine holds at most C requests (max_batch C) and 2C requests
(--waves 2) are submitted at once, so C stay in flight until the queue drains (a closed
loop). Every row is warmed first, then timed --repeats times (3), the rows interleaved so
that drift hits all alike; the table gives the median tok/s with its min-max, and ratios
of medians. Per
(mode, C): output tokens/s over the whole run (prefill included), the median decode step
(steps that admitted nothing, all C rows active), decode tokens/s (C × τ over that step:
what the batch makes once prefill is out of the way), tokens gained per step per request
(τ), and × C = 1 of the same mode (of tokens/s). Every run is first done once untimed on
the same engine (the CUDA graphs of its shapes captured, compiled code warm), then timed;
with `--prepare` every slot a request below the context can meet is made first
(BatchEngine.prepare, as `specpilot serve --prepare`), its count and seconds logged and in
the JSON (what the server's start-up would cost at that concurrency). A second table
splits the median run's wall time into steps that admitted requests (prefill or riding),
decode steps with every row busy, and decode steps with rows free and nothing waiting
(the ragged end: speculative rows finish at different steps), which is where whole-run
tok/s parts from decode tok/s.

Targets: `random:<preset>` (random bf16 weights, random prompts of --prompt tokens: AR
only, drafts mean nothing there; dense-27b shows where weights stop dominating a step) or
`embedded` (the real model on the dev requests, chat-templated, the categories taken in
turn: AR, the n-gram chain and the block drafter, batched: `--modes ar,ngram,block`; before
2026-12-06 a run took the file's first requests, so 2C = 32 at C = 16 were all code). Each mode also runs its first two requests on the
single-request `Engine` (row `<mode>-engine`, C = 1): what the batch must beat.

Correctness: on every (mode, C) the outputs are compared with the same requests' outputs at
C = 1 of AR (the single-request path of the batched engine); the table counts how many
match (fp32: all; bf16: near-ties may differ, counted, not hidden) and, of those that
differ, how many part from the reference at a near-tie: where stock's margin (top-1 minus
top-2 logit, forced through the single-request engine) is within twice stock's own noise
(the same reference forced in steps of 16 and of 1), at least 0.05, and, for every row but
stock's batched AR itself, within twice the largest margin at which the `ar` row of the
same C parted from it (stock's own batching), as the judges widen their near-tie in bf16
(judges/controller.py fold_batch_noise). Any other divergence is logged with its request,
position and margin (`--no-margins`: only count; `--no-compare`: not even that, no
single-request reference run: it decodes every request of the largest C one at a time).

    python3 bench/batch_throughput.py --target random:dense-27b --conc 1,4,16,32 --no-margins
        # H200; random weights' flat logits make most outputs part somewhere: forcing each
        # of 64 references in 64 one-token steps (about 20 ms each there) is 80 s or more
    python3 bench/batch_throughput.py --target random:dense-27b --conc 1,128 --no-compare
        # the reference at C = 128 would be 256 requests one at a time: about 5 min there
    python3 bench/batch_throughput.py --target embedded --modes ar,ngram,block --conc 1,4,16,32
    python3 bench/batch_throughput.py --entry batch-mechanisms --target embedded --conc 4,16,32 \
        --modes block,block:admit_chunk=64,block:dynamic_draft=true,block:node_budget=96,\
block:admit_chunk=64+dynamic_draft=true+node_budget=96      # H200: issue 28's table
    python3 bench/batch_throughput.py --entry batch-tree-verify --target embedded --conc 16 \
        --modes ar,block,block:tree_budget=16 --phases --profile 12 --no-compare
        # where a tree step's time goes against a chain step's: phases, then the kernels
    python3 bench/batch_throughput.py --smoke          # CPU: random:tiny-qwen3, 2 sizes
    python3 bench/batch_throughput.py --smoke --entry batch-mechanisms   # and a stacked mode
    python3 bench/batch_throughput.py --smoke --entry batch-tree-verify --modes ar,ngram,ngram:tree_budget=8

A mode is a drafter (ar, ngram, draft, block), optionally with engine options after a colon,
joined by + ("block:node_budget=96"): with `--entry ID` (the entry and its dependencies
applied to a temporary copy of stock, imported from there) the entry's options name modes,
and the "× its drafter" column is the ratio to the same drafter at stock's options; "× AR"
divides by the AR mode that shares the most of the mode's options (`ar_of`: with
"ar:admit_min=4" run beside "block:admit_min=4", the block mode against it).

Prints one table; writes batch_throughput.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Callable

import common  # noqa: F401  (the repository on sys.path)
from common import (T0, embedded_workload, entry_on_path, is_cuda, log, parse_mode,
                    print_table, profiled, smoke_device, write_json)

ENTRY = entry_on_path(sys.argv)   # before stock is imported

import torch  # noqa: E402

from stock.batch import BatchEngine  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import batch_engine, make_drafter  # noqa: E402


def load(args):
    """(model, requests [(prompt ids, max_new)], stop ids)."""
    dev = torch.device(args.device)
    if args.target.startswith("random:"):
        from stock.config import PRESETS
        from stock.model import Transformer

        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        net = Transformer.random(PRESETS[args.target[7:]], dev, dtype, seed=0)
        gen = torch.Generator().manual_seed(1)
        n = args.waves * max(args.conc)
        reqs = [(torch.randint(1, net.cfg.vocab_size, (args.prompt,), generator=gen).tolist(),
                 args.max_new) for _ in range(n)]
        return net, reqs, frozenset()
    return embedded_workload(args.device, args.max_new, args.waves * max(args.conc), args.target)


def run(engine: BatchEngine, reqs, phases: dict | None = None) -> dict:
    """Submit every request at once, step to the end; per step its time and whether it was a
    pure decode step (nothing admitted, every row busy); each request's time to its first
    token (TTFT: queueing and prefill, or riding, included). With `phases` (from
    `timed_phases`) each pure decode step's phase times are kept too."""
    first: dict[int, float] = {}
    t0 = time.perf_counter()
    subs = [engine.submit(p, m, on_tokens=lambda toks, i=i: first.setdefault(
        i, time.perf_counter())) for i, (p, m) in enumerate(reqs)]
    steps, split = [], []
    spent = dict.fromkeys(SPENT, 0.0)
    while not engine.idle:
        admits = bool(engine.waiting) and None in engine.rows
        busy = None not in engine.rows   # every row decoding as the step starts
        if phases is not None:
            phases.clear()
        s = time.perf_counter()
        engine.step()   # ends with its one host read: the step's time is wall time
        dt = time.perf_counter() - s
        spent["admit" if admits else "full" if busy else "tail"] += dt
        if not admits and all(r is not None for r in engine.rows):   # none left either
            steps.append(dt)
            if phases is not None:
                split.append(dict(phases))
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in subs)
    gained = [a for r in subs for a in r.accepted]
    ttft = [first[i] - t0 for i in range(len(subs)) if i in first]
    out = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall,
           "step_ms": 1e3 * statistics.median(steps) if steps else float("nan"),
           "decode_steps": len(steps), "tau": statistics.mean(gained),
           "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else float("nan"),
           "outputs": [r.tokens for r in subs],
           "spent_s": {k: round(v, 4) for k, v in spent.items()}}
    if phases is not None and split:
        out["phases_ms"] = {k: 1e3 * statistics.median(d.get(k, 0.0) for d in split)
                            for k in PHASES}
    return out


PHASES = ("draft", "verify", "extend", "step")
# where a run's wall time went: steps that admitted requests (their prefill, or riding),
# pure decode steps with every row busy, and decode steps with a row free and nothing
# waiting (the run's ragged end: speculation finishes requests at different steps)
SPENT = ("admit", "full", "tail")
NEAR_TIE_EPSILON, NOISE_FACTOR = 0.05, 2.0   # the judges' defaults (specpilot/config.py gates)


class Margins:
    """Stock's margins (top-1 minus top-2 logit) along each reference output, forced through
    the single-request engine twice, in steps of 16 tokens and of 1: the first pass's margin
    at a divergence says whether it was a near-tie, the two passes' difference is stock's
    own noise there (the judges' reference pass measures it the same way: shape_noise, and
    widens the near-tie by it: outputs.tolerance). Forced once per request, on demand."""

    def __init__(self, engine: Engine, reqs, ref: dict[int, list[int]]):
        self.engine, self.reqs, self.ref = engine, reqs, ref
        self.margin: dict[int, list[float]] = {}
        self.forced: list[SimpleNamespace] = []   # each: noise, noise_flips (as a reference)

    def at(self, i: int, p: int) -> float:
        if i not in self.margin:
            from specpilot.judges.worker_main import shape_noise  # stdlib and torch only

            prompt, toks = self.reqs[i][0], self.ref[i]
            a = self.engine.force(prompt, toks, chunk=16)
            noise, flips = shape_noise(a, self.engine.force(prompt, toks, chunk=1))
            self.margin[i] = a.margin
            self.forced.append(SimpleNamespace(noise=noise, noise_flips=flips))
        return self.margin[i][p]

    def epsilon(self) -> float:
        from specpilot.judges.outputs import tolerance  # lazy: pydantic (staged wheels)

        return tolerance(self.forced, NEAR_TIE_EPSILON, 0.0, NOISE_FACTOR).epsilon


def divergences(outputs: list[list[int]], ref: dict[int, list[int]], margins: Margins,
                batching: float = 0.0) -> dict:
    """Of the outputs that differ from the reference: each one's first divergence and the
    reference's margin there; `near_ties` counts those within epsilon (NOISE_FACTOR times
    stock's own noise on the requests forced so far, at least NEAR_TIE_EPSILON; and at least
    NOISE_FACTOR times `batching`, the largest margin at which stock's batched AR at the same
    C parted from it, as the controller's throughput mode widens it: fold_batch_noise),
    `beyond` lists the others (index, position, margin); an output longer than its
    reference there is beyond by definition (margin None)."""
    from specpilot.judges.outputs import first_difference  # lazy: pydantic (staged wheels)

    found = []
    for i, out in enumerate(outputs):
        p = first_difference(out, ref[i])
        if p is not None:
            found.append((i, p, margins.at(i, p) if p < len(ref[i]) else None))
    eps = max(margins.epsilon(), NOISE_FACTOR * batching)
    beyond = [(i, p, m) for i, p, m in found if m is None or m > eps]
    return {"differ": len(found), "near_ties": len(found) - len(beyond), "epsilon": eps,
            "beyond": beyond, "found": found}


def timed_phases(engine: BatchEngine) -> tuple[dict, Callable[[], None]]:
    """Wrap a step's phases (the drafts, the verify forward with its acceptance, the batch
    drafter's context update) with a device synchronisation on both sides; returns the dict
    each step's phase seconds land in and the undo. `step` is the whole step, synchronised
    the same way: what is left of it past the phases is the host's bookkeeping."""
    sync = (torch.cuda.synchronize if engine.model.device.type == "cuda" else lambda: None)
    cur: dict[str, float] = {}

    def timed(name, fn):
        def inner(*a, **k):
            sync()
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                sync()
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
        return inner

    where = [(engine, "_draft_seqs", "draft"), (engine, "_run", "verify"),
             (engine, "step", "step")]
    if engine.batch_drafter is not None:
        where.append((engine.batch_drafter, "extend_rows", "extend"))
    where = [w for w in where if hasattr(w[0], w[1])]   # an entry's engine may lack one
    for obj, attr, name in where:
        setattr(obj, attr, timed(name, getattr(obj, attr)))

    def undo():
        for obj, attr, _ in where:
            delattr(obj, attr)
    return cur, undo


def summarise(runs: list[dict]) -> dict:
    """One row from interleaved timed runs of the same requests: median tok/s and its range,
    the median of the runs' median steps, τ and TTFT of the median run; whether every run
    gave the same outputs (greedy: they must)."""
    by_speed = sorted(runs, key=lambda r: r["tok_s"])
    mid = by_speed[len(by_speed) // 2]
    return {**mid, "tok_s": statistics.median(r["tok_s"] for r in runs),
            "tok_s_min": by_speed[0]["tok_s"], "tok_s_max": by_speed[-1]["tok_s"],
            "step_ms": statistics.median(r["step_ms"] for r in runs),
            "runs": len(runs), "stable": all(r["outputs"] == runs[0]["outputs"] for r in runs)}


def single_engine(eng, reqs, mode) -> dict:
    """The same requests one after another on stock's single-request Engine (compiled
    layers and CUDA graphs where the options say so): the baseline a batch must beat."""
    drafter = make_drafter(None if mode == "ar" else mode, eng)
    for p, m in reqs:                                  # warm
        eng.generate(p, m, drafter)
    t0, outs, steps = time.perf_counter(), [], []
    for p, m in reqs:
        res = eng.generate(p, m, drafter)
        outs.append(res.tokens)
        steps += res.accepted
    wall = time.perf_counter() - t0
    tokens = sum(map(len, outs))
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "step_ms": float("nan"),
            "decode_steps": 0, "tau": statistics.mean(steps), "ttft_p50_ms": float("nan"),
            "outputs": outs}


def ar_of(mode: str, modes: list[str]) -> str | None:
    """The AR mode a mode's "× AR" divides by: of the AR modes run, the one whose options
    this mode also sets to the same values, the most of them ("block:draft_len=7+admit_min=4"
    against "ar:admit_min=4" where both ran, else "ar"); None where no AR mode qualifies."""
    opts = parse_mode(mode)[1]
    fits = [m for m in modes if parse_mode(m)[0] == "ar"
            and all(opts.get(k) == v for k, v in parse_mode(m)[1].items())]
    return max(fits, key=lambda m: len(parse_mode(m)[1]), default=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="random:dense-27b")
    ap.add_argument("--modes", default=None, help="default ar (--smoke: ar,ngram, and with "
                    "--entry a stacked batch-mechanisms mode)")
    ap.add_argument("--conc", default=None, help="concurrencies (default 1,4,16,32; --smoke 1,2)")
    ap.add_argument("--prompt", type=int, default=128, help="random targets: prompt tokens")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--entry", default=None,
                    help="run with this memory entry applied (its options then name modes: "
                         "block:admit_chunk=64+node_budget=96)")
    ap.add_argument("--smoke", action="store_true", help="CPU: random:tiny-qwen3, small")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs of every row, interleaved; the table gives medians")
    ap.add_argument("--waves", type=int, default=2,
                    help="requests per run: waves x C (at most C in flight)")
    ap.add_argument("--prepare", action="store_true",
                    help="make (on CUDA: capture) every slot before the warm run, as "
                         "`specpilot serve --prepare`; logs how many and how long")
    ap.add_argument("--no-margins", dest="margins", action="store_false",
                    help="do not force the references where outputs differ (only count)")
    ap.add_argument("--no-compare", dest="compare", action="store_false",
                    help="no single-request reference run, so no comparison of outputs (its "
                         "cost grows with the largest C: every request, one at a time)")
    ap.add_argument("--phases", action="store_true",
                    help="after each timed run, a run synchronised around each phase of a "
                         "step (draft, verify, the drafter's context update): a second table")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="CUDA: after the timing, one run of each row under torch.profiler: "
                         "its kernel time against its wall time and its N largest kernels")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop timing once another round of timed runs would end past this "
                         "many seconds from the start (a lent GPU's call limit): the table "
                         "then gives the medians of the rounds done, and says how many")
    args = ap.parse_args()
    if args.smoke:
        args.target, args.prompt, args.max_new = "random:tiny-qwen3", 12, 8
        args.conc = args.conc or "1,2"
        args.modes = args.modes or ("ar,ngram" if not ENTRY
                                    else "ar,ngram,ngram:admit_chunk=8+node_budget=4")
        args.repeats = min(args.repeats, 2)
    args.modes = args.modes or "ar"
    args.device = smoke_device(args)
    args.conc = [int(c) for c in (args.conc or "1,4,16,32").split(",")]
    modes = args.modes.split(",")
    opts = Options()
    model, reqs, stops = load(args)
    ctx = max(len(p) for p, _ in reqs) + args.max_new + 8
    log(f"{args.target} on {args.device}: {len(reqs)} requests, context {ctx}, modes {modes}, "
        f"{args.repeats} timed runs each")
    single = Engine(model, opts, ctx, set(stops))
    res, rows, split, engines, prepared = {}, [], [], {}, {}
    for mode in modes:
        name, mode_opts = parse_mode(mode)
        if not mode_opts:   # the single-request baseline of a drafter at stock's options
            res[f"{mode}-engine@1"] = single_engine(single, reqs[:2], mode)
            log(f"{mode} single-request Engine: {res[f'{mode}-engine@1']['tok_s']:.1f} tok/s")
        base = Engine(model, Options(mode_opts), ctx, set(stops)) if mode_opts else single
        for c in args.conc:
            eng = batch_engine(base, None if name == "ar" else name, c)
            if args.prepare:   # every slot a request below ctx can meet, as `serve --prepare`
                t0 = time.perf_counter()
                n = eng.prepare(ctx)
                prepared[f"{mode}@{c}"] = (n, time.perf_counter() - t0)
                log(f"{mode}@{c}: prepared {n} slots in {prepared[f'{mode}@{c}'][1]:.1f} s")
            run(eng, reqs[: args.waves * c])        # warm: graphs captured, code compiled
            engines[f"{mode}@{c}"] = (eng, reqs[: args.waves * c])
    # the timed runs interleaved (every row once, then again): drift hits all rows alike
    timed: dict[str, list[dict]] = {key: [] for key in engines}
    for rep in range(args.repeats):
        t_round = time.perf_counter()
        for key, (eng, work) in engines.items():
            timed[key].append(run(eng, work))
        log(f"timed run {rep + 1}/{args.repeats}: " + ", ".join(
            f"{k} {v[-1]['tok_s']:.0f}" for k, v in timed.items()))
        spent = time.perf_counter() - T0
        if (args.budget_s and rep + 1 < args.repeats
                and spent + (time.perf_counter() - t_round) > args.budget_s):
            log(f"--budget-s {args.budget_s:.0f}: {spent:.0f} s spent, another round would "
                f"pass it: {rep + 1} timed runs of {args.repeats}")
            args.repeats = rep + 1
            break
    for key, runs in timed.items():
        res[key] = r = summarise(runs)
        mode, c = key.split("@")
        if args.phases:   # once more, synchronised around each phase (after the timing)
            eng, work = engines[key]
            cur, undo = timed_phases(eng)
            try:
                r["phases_ms"] = run(eng, work, cur).get("phases_ms", {})
            finally:
                undo()
            ph = r["phases_ms"]
            rest = ph.get("step", 0) - sum(ph.get(k, 0) for k in PHASES[:3])
            split.append([mode, c, f"{r['step_ms']:.2f}"]
                         + [f"{ph.get(k, float('nan')):.2f}" for k in PHASES] + [f"{rest:.2f}"])
    profiles = []
    for key, (eng, work) in engines.items() if args.profile and is_cuda(args.device) else ():
        info, top = profiled(lambda: run(eng, work), args.profile)   # after the timing
        res[key]["profiled"] = {**info, "top": top}
        mode, c = key.split("@")
        profiles += [[mode, c, f"{info['wall_s']:.3f}", f"{info['kernel_s']:.3f}",
                      f"{100 * info['kernel_s'] / info['wall_s']:.0f}", *row] for row in top]
    if args.profile and not is_cuda(args.device):
        log("--profile: CUDA only (no kernels to list on this device)")
    ref = {}
    if args.compare and "ar" in modes and 1 in args.conc:   # single-request outputs, in order
        base = BatchEngine(model, opts, max_batch=1, max_context=ctx, stop_ids=stops)
        todo = reqs[: args.waves * max(args.conc)]
        log(f"the single-request reference: {len(todo)} requests one at a time "
            "(--no-compare skips it)")
        outs = run(base, todo)["outputs"]
        ref = dict(enumerate(outs))
    if not ref and args.margins and args.compare:   # nothing to compare outputs with
        log("no C = 1 AR row (modes ar, conc 1): outputs not compared with single-request AR")
    margins = Margins(single, reqs, ref) if args.margins and ref else None
    batching = {}   # C -> the largest margin at which stock's batched AR parted from C = 1
    stock_rows = {}   # C -> stock's batched AR row's divergences (its own row reuses them)
    for c in args.conc if margins else ():
        if f"ar@{c}" in res:
            d = stock_rows[c] = divergences(res[f"ar@{c}"]["outputs"], ref, margins)
            batching[c] = max((m for _i, _p, m in d["found"] if m is not None), default=0.0)
            if d["found"]:
                log(f"ar@{c}: stock's batching parted {len(d['found'])} outputs from C = 1, at "
                    f"margins up to {batching[c]:.3g}: the other rows' near-tie there is "
                    f"{max(d['epsilon'], NOISE_FACTOR * batching[c]):.3g}")
    for key, r in res.items():
        mode, c = key.split("@")
        c = int(c)
        one = res.get(f"{mode.removesuffix('-engine')}@1")
        same = sum(o == ref[i] for i, o in enumerate(r["outputs"])) if ref else None
        if margins and same is not None and same < len(r["outputs"]):   # near-ties, or not?
            # stock's batched AR row itself against the near-tie alone; the others also
            # against what stock's batching moved at their C (the controller's rule)
            r["divergences"] = d = (stock_rows[c] if mode == "ar" and c in stock_rows else
                                    divergences(r["outputs"], ref, margins, batching.get(c, 0.0)))
            if d["beyond"]:
                log(f"{key}: {len(d['beyond'])} outputs part from AR beyond a near-tie "
                    f"(epsilon {d['epsilon']:.3g}): (request, position, margin) "
                    f"{d['beyond'][:4]}")
        r["decode_tok_s"] = 1e3 * c * r["tau"] / r["step_ms"] if r["decode_steps"] else 0.0
        plain = parse_mode(mode)[0]
        spread = (f"{r['tok_s_min']:.0f}-{r['tok_s_max']:.0f}" if r.get("runs", 1) > 1 else "")
        rows.append([mode, c, f"{r['tok_s']:.1f}", spread, f"{r['decode_tok_s']:.1f}",
                     f"{r['tok_s'] / one['tok_s']:.2f}" if one else "",
                     f"{r['tok_s'] / res[f'{base}@{c}']['tok_s']:.2f}"
                     if (base := ar_of(mode, modes)) and f"{base}@{c}" in res else "",
                     f"{r['tok_s'] / res[f'{plain}@{c}']['tok_s']:.2f}"
                     if plain != mode and f"{plain}@{c}" in res else "",
                     f"{r['step_ms']:.2f}", r["decode_steps"], f"{r['tau']:.2f}",
                     f"{r['ttft_p50_ms']:.0f}",
                     (f"{same}/{len(r['outputs'])}" if ref else "-")
                     + (f" ({r['divergences']['near_ties']} near-ties, "
                        f"{len(r['divergences']['beyond'])} beyond)" if "divergences" in r else "")
                     + ("" if r.get("stable", True) else " (runs differ)")])
        r.pop("outputs")
    print_table(["mode", "C", "tok/s (median)", "min-max", "decode tok/s", "× C=1", "× AR",
                 "× its drafter", "decode step ms", "steps timed", "τ", "TTFT p50 ms",
                 "= single AR"], rows,
                f"{args.target}, {args.device}, {args.max_new} new tokens, {args.waves}C "
                f"requests per run, median of {args.repeats} interleaved timed runs (ratios of "
                "medians)" + (f", entry {ENTRY} applied" if ENTRY else ""))
    print_table(["mode", "C", "wall s", "admitting steps s", "full decode steps s",
                 "tail steps s (rows free)"],
                [[k.split("@")[0], k.split("@")[1], f"{r['wall_s']:.3f}"]
                 + [f"{r['spent_s'][x]:.3f}" for x in SPENT]
                 for k, r in res.items() if "spent_s" in r],
                "where the median run's time went (host time between steps is the rest)")
    if split:
        print_table(["mode", "C", "decode step ms (timed run)", "draft ms", "verify ms",
                     "extend ms", "step ms (synchronised)", "host rest ms"], split,
                    "medians over pure decode steps of a run synchronised around each phase")
    if profiles:
        print_table(["mode", "C", "wall s (profiled)", "kernel s", "% busy", "kernel", "calls",
                     "ms", "% of kernel time"], profiles,
                    f"one run of each row under torch.profiler, its {args.profile} largest "
                    "kernels (the profiler slows the host: wall is not the timed run's)")
    write_json(args.out, "batch_throughput.json",
               {"target": args.target, "device": args.device, "runs": res,
                "prepared": {k: {"slots": n, "s": round(t, 3)} for k, (n, t) in prepared.items()}})


if __name__ == "__main__":
    main()
