"""Engine and drafter tokens/s: AR, n-gram, draft model and block drafter side by side.

For each request: the AR output, then each drafter's speculative output, every mode on the
same engine back to back (slow drift of the machine hits all modes alike). τ is the mean of
tokens gained per verification step, bonus included. Where a speculative output differs
from AR's, the first divergence is located and the AR reference's own top-1 minus top-2
logit margin there is read by token forcing (chunk 1, the AR step's shape): in fp32 (CPU)
outputs must be identical; in bf16 a divergence must sit at a near-tie.

Models: `embedded` (default: real weights, dev requests, the first --per-category of each
category, the shipped block drafter or --weights DIR) or `random:<preset>` (random bf16
weights, --requests random 16-token prompts as the controller's workers use, and a
randomly initialised block drafter of the shipped shape: τ about 1, but a step's shapes are
the real ones, so ms a step and its split are representative).

Modes (--modes, AR first): `ar`, `ngram`, `draft` (the target truncated to draft_layers),
`block` (as the options say: on CUDA its fixed-shape step replayed from CUDA graphs and
compiled), `block-eager` (eager context update and forward) and `block-graphs` (from graphs
whatever the options); `<mode>-tree<B>` (block-tree32, ngram-tree8) verifies that drafter's
lattice as a best-first tree of B tokens (option tree_budget: needs the memory entry
tree-verify applied, `git specpilot replay tree-verify --worktree DIR`), its tree built on
the device inside the verify step where the drafter keeps its lattice there (the block
drafter; option tree_build); `<mode>-host` (block-host, block-tree32-host) reads the
lattice to the host every step as draft() does and builds any tree there, the behaviour
before the lattice stayed on the device. Where it stays there (the block drafter's chains
on the static path and its device-built trees) the draft ms hold only the drafter's
launches: its GPU time lands in the step. `<mode>-2l`
(ngram-2l, draft-2l, block-2l; block-tree32-2l over a tree) runs two-level verification
(option two_level, memory entry two-level, with `--opt weights=w12`): τ is then tokens per
exact step. "Block 16" is
block_size 16 with draft_len 15: 16 tokens verified a step. Per mode: tokens/s, the median request's tokens/s, τ, ms a decoding step, ms of it
inside the drafter's draft() (which ends with its one host read), × AR (and decode alone:
τ over step ms against AR's one token a step), outputs identical to AR, the largest AR
margin at a divergence, τ per category. --graphs/--compile both: the same runs with CUDA
graphs (or compiled layers) on and off, side by side. --rounds N repeats every request N
times and adds the rounds' tokens/s range.

    python3 bench/engine_tokens.py --per-category 4 --max-new 128 --modes ar,block,ngram  # H200
    python3 bench/engine_tokens.py --graphs both --max-new 128 --modes ar,ngram           # H200
    python3 bench/engine_tokens.py --model random:smollm2-135m --modes ar,ngram,block,block-graphs
    python3 bench/engine_tokens.py --device cpu --per-category 1 --max-new 48 --no-force
    python3 bench/engine_tokens.py --device cpu --per-category 4 --max-new 128 --no-force \
        --modes ar,block,block-tree8,block-tree16,block-tree32,block-tree64   # τ table, tree-verify
    python3 bench/engine_tokens.py --device cpu --per-category 2 --max-new 64 --no-force \
        --draft-len 8 --opt weights=w12 --modes ar,ngram,ngram-2l,draft,draft-2l   # two-level
    python3 bench/engine_tokens.py --smoke        # CPU: random:tiny-qwen3, 2 requests x 6 tokens

Prints one table; writes engine_tokens.json to --out. (Before the suite: bench/gpu_block.py
for the block drafter, bench/gpu_stock.py for AR/n-gram/draft with graphs on and off,
bench/gpu_block_step.py for the random target: `gpu_block.py --also ngram` is
`--modes ar,block,ngram` here.)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
import traceback
from contextlib import contextmanager, nullcontext

from common import first_divergence, log, print_table, smoke_device, write_json

import torch  # noqa: E402

from stock.engine import Engine  # noqa: E402
from stock.options import resolve  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402

SHORT = {"code": "code", "chat": "chat", "math": "math", "summarisation": "summ",
         "long-form": "long"}


class TimedDrafts:
    """A drafter whose draft() calls add their wall time to totals[key] (draft() ends with
    the drafter's one host read, so its wall time is its launches plus its GPU work); every
    other attribute is the drafter's. Modes sharing one drafter (block, block-tree32) each
    have their own."""

    def __init__(self, drafter, key: str, totals: dict[str, float], packed: bool = True):
        self.inner, self.key, self.totals = drafter, key, totals
        self.packed = packed   # False (`-host` modes): drafts read to the host

    def draft(self, ctx, k):
        t = time.perf_counter()
        try:
            return self.inner.draft(ctx, k)
        finally:
            self.totals[self.key] = self.totals.get(self.key, 0.0) + time.perf_counter() - t

    def __getattr__(self, name):
        if name in ("draft_packed", "draft_chain"):   # absent where drafts are read to the host
            if not self.packed:
                raise AttributeError(name)
            return self._on_device(getattr(self.inner, name))
        return getattr(self.inner, name)

    def _on_device(self, inner):
        """A draft left on the device (the block drafter's chain on the static path,
        `draft_chain`; its lattice for trees with tree_build=device, `draft_packed`): no
        host read, so its wall time is the drafter's launches alone; its GPU work lands in
        the verify step's."""
        def timed(ctx, k):
            t = time.perf_counter()
            try:
                return inner(ctx, k)
            finally:
                self.totals[self.key] = self.totals.get(self.key, 0.0) + time.perf_counter() - t
        return timed


def tree_budget(mode: str) -> int:
    """`block-tree32` (and `block-tree32-2l`): the block drafter verified as a best-first
    tree of 32 tokens (option tree_budget, memory entry tree-verify); 0 for a chain mode."""
    found = re.search(r"-tree(\d+)", mode)
    return int(found.group(1)) if found else 0


def mode_engine(eng: Engine, mode: str):
    """The engine with the mode's tree_budget, or with two_level for `<mode>-2l` (runtime
    options: the same model, cache, graphs and drafter); the engine itself for plain chain
    modes."""
    values = {}
    if tree_budget(mode):
        values["tree_budget"] = tree_budget(mode)
    if tree_budget(mode) and mode.endswith("-host"):
        values["tree_build"] = "host"
    if mode.endswith("-2l"):
        values["two_level"] = True
    if not values:
        return nullcontext(eng)
    return _with_options(eng, eng.options.with_values(**values))


@contextmanager
def _with_options(eng: Engine, opts):
    old, eng.options = eng.options, opts
    try:
        yield eng
    finally:
        eng.options = old


def random_block_drafter(engine: Engine, block_size: int):
    """A randomly initialised block drafter of the shipped shape for a random target (as
    stock.system.make_drafter builds the shipped one: graphs and compile per the options),
    kept in engine.drafters so that make_drafter returns it."""
    from stock.compiled import compile_enabled
    from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet

    torch.manual_seed(0)
    net = BlockNet(BlockConfig.for_target(engine.model.cfg, block_size=block_size))
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    opts, dev = engine.options, engine.model.device
    engine.drafters["block"] = BlockDrafter(
        net, engine.model, engine.max_context, opts["block_topk"],
        graphs=opts["block_graphs"] and dev.type == "cuda", compiled=compile_enabled(opts, dev))
    return engine.drafters["block"]


def load(args, opts):
    """(engine, requests, weights note): requests are (id, category, prompt ids, max_new)."""
    if args.model.startswith("random:"):
        from specpilot.judges.prompts import pick_requests
        from stock.config import PRESETS
        from stock.model import Transformer

        dev = torch.device(args.device)
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        net = Transformer.random(PRESETS[args.model[7:]], dev, dtype, seed=0)
        eng = Engine(net, opts, 2048, set())
        reqs = [(rid, "random", ids, args.max_new)
                for rid, _p, ids in pick_requests(args.model, args.requests)]
        return eng, reqs, "random block drafter (τ about 1)"
    from specpilot.requests import load_dev, select

    system = load_system(args.model, opts, device=args.device, max_context=4096)
    tok = system.tokenizer
    reqs = [(r.id, r.category, tok.chat(r.prompt), min(args.max_new, r.max_new_tokens))
            for r in select(load_dev(), None, args.per_category)]
    note = ""
    if any(m.startswith("block") for m in args.modes):
        from pathlib import Path

        from stock.drafters.block_weights import DEFAULT_DIR, read_manifest

        man = read_manifest(Path(args.weights) if args.weights else DEFAULT_DIR)
        note = (f"block weights: {man.target_name} seed {man.seed}, {man.config.num_layers} "
                f"layers, context layers {list(man.config.target_layers)}, trained block "
                f"{man.config.block_size}, steps {man.training.get('steps')}, val loss "
                f"{man.training.get('val_loss')}")
    return system.engine, reqs, note


def run_setting(eng: Engine, reqs, args, errors: list[str]) -> dict:
    """Every mode on every request with one engine: per mode its totals, per category and
    per round, and per request the identity check against AR."""
    draft_s: dict[str, float] = {}
    drafters: dict[str, object] = {}
    if args.model.startswith("random:") and any(m.startswith("block") for m in args.modes):
        random_block_drafter(eng, args.block_size)

    def make(m):
        if m == "ar":
            return None
        if m not in drafters:
            d = make_drafter(m.split("-")[0], eng)
            host = m.endswith("-host")
            if m in ("block-graphs", "block-eager"):
                from stock.drafters.block import BlockDrafter

                on = m == "block-graphs"  # the plain path: eager context update and forward
                d = BlockDrafter(d.net, d.target, d.max_len, d.topk, graphs=on,
                                 compiled=on and d.compiled, static=on)
            drafters[m] = TimedDrafts(d, m, draft_s, packed=not host)
        return drafters[m]

    for m in args.modes:  # warm-up: kernels, allocator, compiles
        with mode_engine(eng, m) as e:
            e.generate(reqs[0][2], 8, make(m))
    draft_s.clear()
    slots = lambda: len(eng.runner.slots) if eng.runner is not None else 0  # noqa: E731
    capture_s = 0.0
    if eng.uses_graphs and not args.no_precapture:
        # every verify graph a timed run can use, for every hidden-layer set (AR and n-gram
        # ask for none, the block drafter for its context layers), captured before timing
        t1 = time.perf_counter()
        end = min(max(len(r[2]) for r in reqs) + args.max_new + 64, eng.max_context)
        drafts = 0
        for m in args.modes:   # each mode's own slots (trees: host- or device-built)
            with mode_engine(eng, m) as e:   # the drafter's graphs too, as its steps take it
                e.prepare(make(m), end)
            drafts += len(getattr(make(m), "_graphs", ())) if m.startswith("block") else 0
        capture_s = time.perf_counter() - t1
        log(f"captured {slots()} verify graphs and {drafts} drafter graphs in {capture_s:.1f}s")

    cats = sorted({r[1] for r in reqs}, key=lambda c: list(SHORT).index(c) if c in SHORT else 99)
    zero = lambda: {"tokens": 0, "s": 0.0, "steps": 0, "acc": 0, "dec": 0.0, "draft": 0.0}  # noqa: E731
    stats = {m: {"cat": {c: zero() for c in cats}, "rounds": [zero() for _ in range(args.rounds)],
                 "tps": [], "new_graphs": 0} for m in args.modes}
    rows = []
    for rnd in range(args.rounds):
        for i, (rid, cat, prompt, max_new) in enumerate(reqs):
            # a prompt length's first prefill pays one-time setup (about 1 s on the H200):
            # paid here, before any mode is timed
            eng.generate(prompt, 1)
            outs = {}
            for m in args.modes:
                try:
                    before, d0 = slots(), draft_s.get(m, 0.0)
                    with mode_engine(eng, m) as e:
                        res = e.generate(prompt, max_new, make(m))
                    res.new_slots = slots() - before  # verify graphs captured inside the run
                    res.draft_ms = 1e3 * (draft_s.get(m, 0.0) - d0) / max(res.steps, 1)
                except Exception as exc:  # one failure must not lose the rest
                    errors.append(f"{rid} {m}: {exc!r}")
                    traceback.print_exc()
                    continue
                outs[m] = res
                st = stats[m]
                st["tps"].append(res.tokens_per_s)
                st["new_graphs"] += res.new_slots
                for s in (st["cat"][cat], st["rounds"][rnd]):
                    s["tokens"] += len(res.tokens)
                    s["s"] += res.prefill_s + res.decode_s
                    s["steps"] += res.steps
                    s["acc"] += sum(res.accepted)
                    s["dec"] += res.decode_s
                    s["draft"] += res.draft_ms * res.steps / 1e3
            if rnd == 0:
                rows.append(check_row(eng, rid, cat, prompt, outs, args, errors))
            log(f"[{rnd + 1}/{args.rounds} {i + 1}/{len(reqs)}] {rid}: " + ", ".join(
                f"{m} τ {r.tau:.2f} {r.tokens_per_s:.1f} tok/s step {r.step_ms:.2f} ms (draft "
                f"{r.draft_ms:.2f}, +{r.new_slots} graphs)" for m, r in outs.items()))
    return {"stats": stats, "rows": rows, "cats": cats, "capture_s": round(capture_s, 2),
            "graph_slots": slots()}


def check_row(eng, rid, cat, prompt, outs, args, errors) -> dict:
    row = {"request": rid, "category": cat, "tokens": {m: len(r.tokens) for m, r in outs.items()}}
    if "ar" not in outs:
        return row
    forced = None
    for m, res in outs.items():
        if m == "ar":
            continue
        pos = first_divergence(outs["ar"].tokens, res.tokens)
        row[f"{m}_identical"] = pos is None
        if pos is not None and not args.no_force and pos < len(outs["ar"].tokens):
            try:
                forced = forced or eng.force(prompt, outs["ar"].tokens, chunk=1)
                row[f"{m}_div_at"] = pos
                row[f"{m}_ar_margin_there"] = round(forced.margin[pos], 5)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{rid} force: {exc!r}")
    return row


def agg(parts: list[dict]) -> dict:
    s = {k: sum(p[k] for p in parts) for k in ("tokens", "s", "steps", "acc", "dec", "draft")}
    return {"tau": s["acc"] / max(s["steps"], 1), "tokens_per_s": s["tokens"] / max(s["s"], 1e-9),
            "step_ms": 1e3 * s["dec"] / max(s["steps"], 1),
            "draft_ms": 1e3 * s["draft"] / max(s["steps"], 1), "tokens": s["tokens"]}


def summarise(res: dict, modes: list[str]) -> dict:
    out = {}
    for m in modes:
        st = res["stats"][m]
        total = agg(list(st["cat"].values()))
        rounds = [agg([r])["tokens_per_s"] for r in st["rounds"] if r["tokens"]]
        out[m] = {**total, "by_category": {c: agg([v])["tau"] for c, v in st["cat"].items()},
                  "round_tokens_per_s": rounds,
                  "median_request_tok_s": statistics.median(st["tps"]) if st["tps"] else None,
                  "graphs_captured_in_timed_runs": st["new_graphs"]}
    ar = out.get("ar")
    for m, s in out.items():
        if ar and m != "ar" and ar["tokens_per_s"]:
            s["x_ar"] = s["tokens_per_s"] / ar["tokens_per_s"]
            s["x_ar_decode"] = s["tau"] / max(s["step_ms"], 1e-9) * ar["step_ms"]
        same = [r.get(f"{m}_identical") for r in res["rows"] if f"{m}_identical" in r]
        s["identical_to_ar"] = f"{sum(map(bool, same))}/{len(same)}" if same else None
        margins = [r[f"{m}_ar_margin_there"] for r in res["rows"] if f"{m}_ar_margin_there" in r]
        s["max_margin_at_divergence"] = max(margins) if margins else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="embedded, or random:<preset>")
    ap.add_argument("--device", default=None)
    ap.add_argument("--modes", default="ar,block,ngram",
                    help="ar, ngram, draft, block, block-eager, block-graphs (AR first)")
    ap.add_argument("--per-category", type=int, default=2, help="embedded: dev requests each")
    ap.add_argument("--requests", type=int, default=4, help="random: prompts")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--draft-len", type=int, default=None, help="default block_size - 1")
    ap.add_argument("--weights", default="", help="block-drafter folder (default: shipped)")
    ap.add_argument("--no-force", action="store_true", help="skip the forcing check")
    ap.add_argument("--no-precapture", action="store_true",
                    help="capture verify graphs on first use inside the timed runs")
    ap.add_argument("--graphs", choices=("on", "off", "both"), default=None,
                    help="CUDA graphs on, off, or both side by side (default: option cuda_graphs)")
    ap.add_argument("--compile", choices=("on", "off", "both"), default=None,
                    help="graph steps with compiled layers, eager layers, or both side by side "
                         "(default: option compile)")
    ap.add_argument("--opt", action="append", default=[], help="engine option NAME=VALUE")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true",
                    help="CPU plumbing check: random:tiny-qwen3, 2 requests x 6 tokens, ar, "
                         "ngram, draft (1 layer) and block")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.requests, args.max_new = "random:tiny-qwen3", 2, 6
        args.modes, args.opt = "ar,ngram,draft,block", [*args.opt, "draft_layers=1"]
    args.device = smoke_device(args)
    args.modes = [m for m in dict.fromkeys(args.modes.split(",")) if m]
    if "ar" in args.modes:
        args.modes.remove("ar")
        args.modes.insert(0, "ar")
    draft_len = args.draft_len or max(args.block_size - 1, 1)
    opt_items = [f"block_size={args.block_size}", f"draft_len={draft_len}", *args.opt]
    if args.weights:
        opt_items.append(f"block_weights={args.weights}")
    opts = resolve(opt_items)

    t0 = time.perf_counter()
    base, reqs, note = load(args, opts)
    log(f"{args.model} loaded on {base.model.device} in {time.perf_counter() - t0:.1f}s; "
        f"{len(reqs)} requests")
    if note:
        log(note)
    both = {"on": [True], "off": [False], "both": [True, False]}
    graphs = both.get(args.graphs, [opts["cuda_graphs"]])
    comps = both.get(args.compile, [opts["compile"]])
    # (cuda_graphs, compile); compile applies to the graph path only
    settings = [(g, c) for g in graphs for c in (comps if g else [False])]
    report = {"device": str(base.model.device), "torch": torch.__version__,
              "dtype": str(base.model.dtype), "model": args.model, "modes": args.modes,
              "block_size": args.block_size, "draft_len": draft_len, "max_new": args.max_new,
              "rounds": args.rounds, "weights": note, "runs": [], "errors": []}
    for g, c in settings:
        eng = base
        if g != eng.options["cuda_graphs"] or c != eng.options["compile"]:
            eng = Engine(base.model, base.options.with_values(cuda_graphs=g, compile=c),
                         base.max_context, base.stop_ids)
        label = ("graphs" if eng.uses_graphs else "eager") + ("+compile" if eng.compiled else "")
        log(f"setting {label}")
        res = run_setting(eng, reqs, args, report["errors"])
        report["runs"].append({"label": label, "options": eng.options.as_dict(),
                               "capture_s": res["capture_s"], "graph_slots": res["graph_slots"],
                               "summary": summarise(res, args.modes), "cats": res["cats"],
                               "rows": res["rows"]})
        if eng is not base:
            del eng
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_json(args.out, "engine_tokens.json", report)

    dev = report["device"]
    name = torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu"
    print(f"\n{name}  torch {report['torch']}  {report['dtype']}  {args.model}, "
          f"{len(reqs)} requests x <= {args.max_new} new tokens, {args.rounds} round(s); block "
          f"{args.block_size}, draft_len {draft_len}")
    cols = ["setting", "mode", "τ", "tok/s", "median request tok/s", "step ms", "draft ms",
            "x AR (decode alone)", "identical to AR", "max AR margin at divergence",
            "τ by category"]
    if args.rounds > 1:
        cols.insert(4, "tok/s of rounds, min-max")
    rows = []
    for run in report["runs"]:
        for m, s in run["summary"].items():
            cats = "/".join(f"{SHORT.get(c, c)} {v:.2f}" for c, v in s["by_category"].items())
            x = (f"{s['x_ar']:.3f} ({s['x_ar_decode']:.3f})" if "x_ar" in s else "")
            row = [run["label"], m, f"{s['tau']:.3f}", f"{s['tokens_per_s']:.2f}",
                   f"{s['median_request_tok_s']:.2f}" if s["median_request_tok_s"] else "",
                   f"{s['step_ms']:.3f}", f"{s['draft_ms']:.3f}" if m != "ar" else "", x,
                   s["identical_to_ar"] or "", s["max_margin_at_divergence"], cats]
            if args.rounds > 1:
                rt = s["round_tokens_per_s"]
                row.insert(4, f"{min(rt):.2f}-{max(rt):.2f}" if rt else "")
            rows.append(row)
    print_table(cols, rows)
    captured = {f"{r['label']} {m}": s["graphs_captured_in_timed_runs"]
                for r in report["runs"] for m, s in r["summary"].items()
                if s["graphs_captured_in_timed_runs"]}
    if captured:
        print(f"graphs captured inside timed runs (inflate their step time): {captured}")
    if report["errors"]:
        print("errors:", *report["errors"], sep="\n  ")


if __name__ == "__main__":
    main()
