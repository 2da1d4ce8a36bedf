"""GDN tree verification (memory entry tree-verify-gdn): the WY tree kernel against per-path
recomputation and the chain kernel, and a hybrid-27b tree verify step against the chain.

Needs the entries tree-verify and tree-verify-gdn applied (bench/gpu_hybrid.sh tree makes
that tree and runs this in it). Trees are best-first over a random lattice of 15 positions
x top-8 (stock/tree.py's build), budgets --budgets.

Parts:
  1. correctness (random inputs of the target's GDN shapes, per budget): the kernel
     (kernels/gdn/tree_kernel.py where it fits, else the PyTorch WY form) against the
     per-path oracle (each node's root path through the recurrence alone), fp32 and bf16;
     a chain-shaped tree against the chunked rule (fla on CUDA);
  2. one GDN layer's delta rule over N nodes, each replayed from a CUDA graph of its own:
     the WY tree kernel; per-path recomputation (every leaf's root path through the chunked
     rule, one call a leaf: what a tree costs without the WY form); the chunked rule over a
     chain of N tokens;
  3. the hybrid-27b verify step over a tree of N nodes beside a chain of N tokens: the
     model's dynamic forward for each, captured whole into CUDA graphs here (the tree's plan
     built before the capture), and the engine's graph runner's tree and chain slots (the
     tree's plan made on the device inside its graph), with eager layers and, on CUDA, as
     the engine runs them by default (compiled regions, fused projections, the split-KV
     attention kernel). Issue 26's goal: the 64-node tree slot within 1.25x of the chain.

    python bench/gdn_tree.py --out $OUT             # the H200 (bash bench/gpu_hybrid.sh tree)
    python bench/gdn_tree.py --smoke                # CPU: tiny-hybrid, fp32, no graphs

Prints three tables; writes gdn_tree.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os

import common  # noqa: F401  (the repository on sys.path)
from common import log, print_table, smoke_device, sync, timed, write_json

import torch  # noqa: E402

from kernels.gdn import chunk_rule, plan, tree_rule  # noqa: E402
from kernels.gdn import recurrent_reference  # noqa: E402
from kernels.gdn.tree import root_paths  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.graphs import capture  # noqa: E402
from stock.tree import build  # noqa: E402


def make_tree(budget: int, vocab: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(vocab, generator=g)[:8] for _ in range(15)])
    lp = torch.log_softmax(2 * torch.randn(15, 8, generator=g), -1).sort(-1, descending=True).values
    return build(ids, lp, 1, budget)


def gdn_inputs(cfg, n: int, dev, dtype, seed=0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                      cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    q, k = (torch.randn(1, n, hk, dk, device=dev, generator=gen, dtype=dtype) for _ in "qk")
    v = torch.randn(1, n, hv, dv, device=dev, generator=gen, dtype=dtype)
    g = -torch.rand(1, n, hv, device=dev, generator=gen)
    beta = torch.rand(1, n, hv, device=dev, generator=gen).to(dtype)
    s0 = 0.1 * torch.randn(1, hv, dk, dv, device=dev, generator=gen)
    return q, k, v, g, beta, s0


def rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def graphed(fn, dev):
    """fn replayed from a CUDA graph of its own (CPU: fn itself)."""
    if dev != "cuda":
        return fn

    def run():
        with torch.inference_mode():
            return fn()

    graph, _ = capture(run, torch.device("cuda"), None)
    return graph.replay


def leaf_paths(parents: list[int]) -> list[list[int]]:
    has_child = set(parents[1:])
    return [p for i, p in enumerate(root_paths(parents)) if i not in has_child]


def path_oracle(q, k, v, g, beta, parents, s0):
    """Every node's output with its root path alone through the fp32 recurrence (each
    leaf's path once: a node's output depends only on its own path's prefix)."""
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for path in leaf_paths(parents):
        ix = torch.tensor(path, device=v.device)
        o, _ = recurrent_reference(*(x.index_select(1, ix).float() for x in (q, k, v, g, beta)),
                                   s0)
        out[:, ix] = o.float()
    return out


def correctness(cfg, budgets, dev) -> list[list]:
    rows = []
    for n in budgets:
        tree = make_tree(n, cfg.vocab_size)
        tp = plan(tree.parents, cfg.linear_conv_kernel, dev)
        for dtype in (torch.float32, torch.bfloat16) if dev == "cuda" else (torch.float32,):
            q, k, v, g, beta, s0 = gdn_inputs(cfg, len(tree), dev, dtype)
            got = tree_rule(q, k, v, g, beta, tp, s0)
            want = path_oracle(q, k, v, g, beta, tp.parents, s0)
            rows.append([len(tree), str(dtype).split(".")[-1], f"{rel(got, want):.2e}"])
    n = max(budgets)
    q, k, v, g, beta, s0 = gdn_inputs(cfg, n, dev, torch.float32)
    chain = plan([-1] + list(range(n - 1)), cfg.linear_conv_kernel, dev)
    want, _ = chunk_rule(q, k, v, g, beta, s0)
    rows.append([f"chain {n}", "float32", f"{rel(tree_rule(q, k, v, g, beta, chain, s0), want):.2e}"])
    return rows


def layer_times(cfg, budgets, dev, iters) -> tuple[list[list], dict]:
    rows, res = [], {}
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    for n in budgets:
        tree = make_tree(n, cfg.vocab_size)
        n = len(tree)
        tp = plan(tree.parents, cfg.linear_conv_kernel, dev)
        q, k, v, g, beta, s0 = gdn_inputs(cfg, n, dev, dtype)
        leaves = leaf_paths(tp.parents)
        idx = [torch.tensor(p, device=dev) for p in leaves]

        def per_path():
            for ix in idx:
                chunk_rule(*(x.index_select(1, ix) for x in (q, k, v, g, beta)), s0)

        # each part logged first: on the H200 (2026-12-01) this part stalled past 280 s at
        # the first budget without saying where
        log(f"  {n} nodes: WY tree")
        t_wy = timed(graphed(lambda: tree_rule(q, k, v, g, beta, tp, s0), dev), iters, dev)
        log(f"  {n} nodes: per-path ({len(leaves)} leaves)")
        t_pp = timed(graphed(per_path, dev), iters, dev)
        log(f"  {n} nodes: chain")
        t_ch = timed(graphed(lambda: chunk_rule(q, k, v, g, beta, s0), dev), iters, dev)
        res[n] = {"wy": t_wy, "per_path": t_pp, "chain": t_ch, "leaves": len(leaves),
                  "path_tokens": sum(map(len, leaves))}
        rows.append([n, len(leaves), sum(map(len, leaves)), f"{t_wy['median_ms']:.4f}",
                     f"{t_pp['median_ms']:.4f}", f"{t_ch['median_ms']:.4f}",
                     f"{t_pp['median_ms'] / t_wy['median_ms']:.2f}",
                     f"{t_wy['median_ms'] / t_ch['median_ms']:.2f}"])
    return rows, res


def step_times(cfg_name, budgets, dev, iters, context) -> tuple[list[list], dict]:
    from stock import body
    from stock.fused import fuse_projections
    from stock.graphs import GraphRunner
    from stock.model import Transformer
    from stock.tree import ancestors, visibility

    cfg = PRESETS[cfg_name]
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = Transformer.random(cfg, dev, dtype, seed=0)
    max_context = context + 2 * max(budgets) + 64
    cache = model.new_cache(-(-(max_context + 64) // 64) * 64)
    ids = torch.randint(0, cfg.vocab_size, (1, context), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(1))
    model(ids, cache, 0, logits="none")
    cache.commit(context)
    # the engine's slots: eager layers, and on CUDA as the engine runs them by default
    # (compiled regions, fused projections, the split-KV attention kernel)
    runners = {"eager": GraphRunner(model, cache, max_context, capture=dev == "cuda")}
    if dev == "cuda":
        fuse_projections(model)   # views: the eager layers' modules and outputs are unchanged
        runners["compiled"] = GraphRunner(model, cache, max_context, capture=True,
                                          compile=True, attention="triton", fused=True)
    rows, res, real_plan = [], {}, body.gdn_plan
    for n in budgets:
        tree = make_tree(n, cfg.vocab_size)
        n = len(tree)
        toks = torch.tensor([tree.tokens], device=dev)
        parents = torch.tensor(tree.parents, device=dev)
        depths = torch.tensor(tree.depths, device=dev)
        seen = visibility(ancestors(parents), context, context + n)
        pos = context + torch.arange(n, device=dev)
        prebuilt = real_plan(tree.parents, cfg.linear_conv_kernel, dev)
        body.gdn_plan = lambda *_a, _p=prebuilt: _p      # no host work inside the capture
        cpu_parents = torch.tensor(tree.parents)

        def tree_fwd():
            return model(toks, cache, context, positions=pos, kv_len=context + n, mask=seen,
                         rope=context + depths, logits="all", tree_parents=cpu_parents)

        def chain_fwd():
            return model(toks, cache, context, logits="all")

        log(f"step: {n} nodes, dynamic forwards")
        t_tree = timed(graphed(tree_fwd, dev), iters, dev)
        t_chain = timed(graphed(chain_fwd, dev), iters, dev)
        body.gdn_plan = real_plan
        cache.rollback(context)
        res[n] = {"tree": t_tree, "chain_dynamic": t_chain}
        row = [n, tree.max_depth, f"{t_tree['median_ms']:.3f}", f"{t_chain['median_ms']:.3f}"]
        for name, runner in runners.items():
            log(f"step: {n} nodes, {name} slots")
            s = runner.slot(runner.bucket(n), runner.kv_bucket(context + n))
            runner.load(s, tree.tokens, context)
            t_slot = timed(lambda: runner.launch(s), iters, dev)
            cache.rollback(context)
            ts = runner.slot(runner.bucket(n), runner.kv_bucket(context + n), tree=True)
            _ids, parents_p, depths_p = tree.padded(ts.t)   # as tree_step pads
            runner.load(ts, tree.tokens, context, n - 1, (depths_p, parents_p))
            t_tslot = timed(lambda: runner.launch(ts), iters, dev)
            cache.rollback(context)
            res[n][f"chain_slot_{name}"], res[n][f"tree_slot_{name}"] = t_slot, t_tslot
            row += [f"{t_tslot['median_ms']:.3f}", f"{t_slot['median_ms']:.3f}",
                    f"{t_tslot['median_ms'] / t_slot['median_ms']:.3f}"]
        rows.append(row)
    sync(dev)
    return rows, res, list(runners)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="hybrid-27b")
    ap.add_argument("--budgets", default="16,32,64,128")
    ap.add_argument("--step-budgets", default="16,32,64")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-hybrid, fp32, no graphs")
    args = ap.parse_args()
    dev = smoke_device(args)
    if args.smoke:
        args.preset, args.budgets, args.step_budgets, args.context, args.iters = (
            "tiny-hybrid", "8,16", "8", 24, 2)
    budgets = [int(x) for x in args.budgets.split(",")]
    cfg = PRESETS[args.preset]
    out: dict = {"preset": args.preset, "device": dev}
    parts = args.parts.split(",")
    if "1" in parts:
        log("1. the tree rule against the per-path oracle")
        rows = correctness(cfg, budgets, dev)
        out["correctness"] = rows
        print_table(["nodes", "dtype", "rel err (max |Δ| / max |want|)"], rows,
                    f"{args.preset} GDN shapes: tree rule against each node's root path alone")
    if "2" in parts:
        log("2. one GDN layer's delta rule over N nodes, from graphs")
        rows, out["layer"] = layer_times(cfg, budgets, dev, args.iters)
        print_table(["nodes", "leaves", "path tokens", "WY tree ms", "per-path ms",
                     "chain of N ms", "per-path / WY", "WY / chain"], rows,
                    f"{args.preset}: one GDN layer's delta rule (median of {args.iters})")
    if "3" in parts:
        log(f"3. {args.preset} verify steps: tree against chain of the same node count")
        rows, out["step"], names = step_times(
            args.preset, [int(x) for x in args.step_budgets.split(",")], dev, args.iters,
            args.context)
        cols = ["nodes", "depth", "dynamic tree ms", "dynamic chain ms"]
        for name in names:
            cols += [f"{name}: tree slot ms", f"{name}: chain slot ms", f"{name}: tree / chain"]
        print_table(cols, rows, f"{args.preset} verify step at context {args.context} "
                    "(dynamic forwards captured whole; slots: the engine's graph runner)")
    write_json(args.out, "gdn_tree.json", out)


if __name__ == "__main__":
    main()
