"""Hybrid GDN target (Qwen3.5-27B-class shapes, random weights) on one GPU: the AR step
against its floor, verify steps of T = 1, 8, 16, 32, 64 tokens from CUDA graphs, and the
GDN layers' share of the step.

Parts:
  1. kernels: the GDN mixing the engine runs (flash-linear-attention's chunked and fused
     recurrent kernels where installed, else stock's plain-PyTorch reference) against the
     plain-PyTorch recurrence on random inputs of the model's GDN shapes (relative error);
  2. the floor: every parameter byte but the embedding table's read once per step, plus
     each GDN layer's fp32 state read and written, at the device's copy bandwidth;
  3. correctness at a context of --context tokens, per way of running the layers: graph
     replay against the eager static forward (bit for bit) and the static forward against
     the dynamic one (argmax, relative error);
  4. timings: per T, the step replayed from its graph (CUDA events, median and p10-p90 of
     --iters), its layers as the model's own modules (eager inside the graph) and, on CUDA,
     as the engine runs them by default (stock/compiled.py's regions, fused projections,
     the split-KV attention kernel), side by side; beside one GDN layer's mixing (its
     projections, conv, delta rule, gated norm)
     replayed from a graph of its own, times the GDN layer count: their share of the step.

  5. with --recurrent-max-t 1,64: the steps again (compiled layers where timed, else eager)
     with fla's fused recurrent kernel for verify steps of up to 64 tokens
     (kernels/gdn/ops.py RECURRENT_MAX_T) instead of its chunked kernel, side by side, and
     the logits of each T against those with the first value (relative error, argmax).

    python bench/step_hybrid.py --out $OUT          # the H200 (bash bench/gpu_hybrid.sh)
    python bench/step_hybrid.py --recurrent-max-t 1,64 --out $OUT
    python bench/step_hybrid.py --smoke             # CPU: tiny-hybrid, fp32, no graphs

Prints progress, then one table; writes step_hybrid.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import os

import common  # noqa: F401  (the repository on sys.path)
from common import GiB, copy_bandwidth, log, print_table, sync, timed, write_json

import torch  # noqa: E402

import kernels.gdn.ops as gdn_ops  # noqa: E402
from kernels.gdn import fla_available, recurrent_reference  # noqa: E402
from kernels.gdn.ops import chunk_rule, recurrent_rule  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.fused import fuse_projections  # noqa: E402
from stock.gdn import mix  # noqa: E402
from stock.graphs import GraphRunner, capture  # noqa: E402
from stock.model import Transformer  # noqa: E402


def kernel_check(cfg, dev) -> list[list]:
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                      cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    for t in (1, 16, 64):
        q, k = (torch.randn(1, t, hk, dk, device=dev, generator=gen, dtype=dtype) for _ in "qk")
        v = torch.randn(1, t, hv, dv, device=dev, generator=gen, dtype=dtype)
        g = -torch.rand(1, t, hv, device=dev, generator=gen)
        beta = torch.rand(1, t, hv, device=dev, generator=gen).to(dtype)
        s0 = 0.1 * torch.randn(1, hv, dk, dv, device=dev, generator=gen)
        want_o, want_s = recurrent_reference(q.float(), k.float(), v.float(), g, beta.float(), s0)
        for name, fn in (("chunk", chunk_rule), ("recurrent", recurrent_rule)):
            o, s = fn(q, k, v, g, beta, s0)
            rel_o = float((o.float() - want_o).abs().max() / want_o.abs().max())
            rel_s = float((s - want_s).abs().max() / want_s.abs().max())
            rows.append([f"{name} T={t}", "fla" if dev == "cuda" and fla_available()
                         else "reference", f"{rel_o:.2e}", f"{rel_s:.2e}"])
    return rows


def floor_ms(model, bandwidth: float) -> float:
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                  if "embed_tokens" not in n)
    n_gdn = sum(cfg.layer_type(i) == "linear_attention" for i in range(cfg.num_layers))
    state = n_gdn * 2 * 4 * cfg.linear_num_value_heads * cfg.linear_key_head_dim \
        * cfg.linear_value_head_dim
    return 1e3 * (weights + state) / bandwidth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="hybrid-27b")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--ts", default="1,8,16,32,64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--compile", choices=["both", "off"], default="both",
                    help="CUDA: also time the layers as compiled regions (the engine's default)")
    ap.add_argument("--recurrent-max-t", default="",
                    help="values of kernels/gdn/ops.py RECURRENT_MAX_T to time side by side "
                         "(the first is the baseline), e.g. 1,64")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-hybrid, fp32, no graphs")
    args = ap.parse_args()
    dev = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    if args.smoke:
        args.preset, args.context, args.ts, args.iters = "tiny-hybrid", 40, "1,8", 3
    ts = [int(x) for x in args.ts.split(",")]
    cfg = PRESETS[args.preset]
    result: dict = {"preset": args.preset, "device": dev, "context": args.context,
                    "fla": fla_available()}

    log("1. GDN kernels against the plain recurrence")
    print_table(["mixing", "implementation", "rel err out", "rel err state"],
                kernel_check(cfg, dev), "GDN mixing against the recurrence")

    bw = copy_bandwidth(GiB if dev == "cuda" else 1 << 24, dev)["read_plus_write_bytes_per_s"]
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    log(f"2. {args.preset} on {dev} ({dtype}), copy bandwidth {bw / 1e9:.0f} GB/s")
    model = Transformer.random(cfg, dev, dtype, seed=0)
    floor = floor_ms(model, bw)
    max_context = args.context + 64
    cache = model.new_cache(-(-(max_context + 64) // 64) * 64)
    ids = torch.randint(0, cfg.vocab_size, (1, args.context), device=dev,
                        generator=torch.Generator(device=dev).manual_seed(1))
    model(ids, cache, 0, logits="none")
    cache.commit(args.context)
    # the layers as the model's own modules inside the graph, and as the engine runs them
    # on CUDA by default: stock/compiled.py's regions, fused projections, split-KV attention
    variants = {"eager layers": {}}
    if dev == "cuda" and args.compile == "both":
        fuse_projections(model)   # views: the eager layers' modules and outputs are unchanged
        variants["compiled"] = {"compile": True, "attention": "triton", "fused": True}
    runners = {name: (GraphRunner(model, cache, max_context, capture=dev == "cuda", **kw),
                      GraphRunner(model, cache, max_context, capture=False, **kw))
               for name, kw in variants.items()}

    log("3. graph replay against the eager static forward, static against dynamic")
    rows, checks = [], {}
    gen = torch.Generator().manual_seed(2)
    step_ids = {t: torch.randint(1, cfg.vocab_size, (t,), generator=gen).tolist() for t in ts}
    for name, (graphs, eager) in runners.items():
        for t in sorted({1, 16} & set(ts)) or ts[:1]:
            want = eager.step(step_ids[t], args.context).logits[:t].clone()
            got = graphs.step(step_ids[t], args.context).logits[:t].clone()
            dyn = model(torch.tensor([step_ids[t]], device=dev), cache, args.context).logits[0]
            cache.rollback(args.context)   # drop the staged step: nothing is committed
            checks[f"{name} T={t}"] = {
                "graph_equals_eager": bool(torch.equal(got, want)),
                "argmax_static_vs_dynamic": float((want.argmax(-1) == dyn.argmax(-1))
                                                  .float().mean()),
                "rel_err_vs_dynamic": float((want - dyn).abs().max() / dyn.abs().max())}
    result["checks"] = checks
    print_table(["layers, T", "graph == eager static (bits)", "argmax static = dynamic",
                 "rel err static vs dynamic"],
                [[k, c["graph_equals_eager"], f"{c['argmax_static_vs_dynamic']:.2f}",
                  f"{c['rel_err_vs_dynamic']:.1e}"] for k, c in checks.items()], "Correctness")

    log("4. steps and one GDN layer's mixing, from graphs")
    gdn = next(layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn"))
    n_gdn = sum(hasattr(layer, "linear_attn") for layer in model.model.layers)
    timings: dict = {}
    for t in ts:
        timings[t] = {}
        for name, (graphs, _) in runners.items():
            s = graphs.slot(graphs.bucket(t), graphs.kv_bucket(args.context + t))
            graphs.load(s, step_ids[t], args.context)
            timings[t][name] = timed(lambda: graphs.launch(s), args.iters, dev)
        hx = torch.randn(1, t, cfg.hidden_size, device=dev, dtype=dtype)
        mixing = _graphed(lambda: mix(gdn, hx, cache, None), dev)
        layer = timings[t]["gdn_layer"] = timed(mixing, args.iters, dev)
        cache.rollback(args.context)
    sync(dev)
    for name in runners:
        ar = timings[ts[0]][name]["median_ms"]
        for t in ts:
            step, layer = timings[t][name], timings[t]["gdn_layer"]
            rows.append([name, t, f"{step['median_ms']:.3f}",
                         f"{step['p10_ms']:.3f}-{step['p90_ms']:.3f}",
                         f"{step['median_ms'] / floor:.2f}", f"{step['median_ms'] / ar:.3f}",
                         f"{timings[t]['eager layers']['median_ms'] / step['median_ms']:.3f}",
                         f"{layer['median_ms']:.3f}",
                         f"{n_gdn * layer['median_ms'] / step['median_ms']:.0%}"])
    result.update(floor_ms=floor, bandwidth=bw, timings=timings, gdn_layers=n_gdn)
    print_table(["layers", "T", "step ms", "p10-p90", "x floor", "x AR step",
                 "eager layers / this", "1 GDN layer ms (eager)", f"{n_gdn} GDN layers' share"],
                rows, f"{args.preset} verify steps at context {args.context} "
                f"(floor {floor:.3f} ms)")
    write_json(args.out, "step_hybrid.json", result)
    limits = [int(x) for x in args.recurrent_max_t.split(",") if x]
    if len(limits) > 1:
        name = "compiled" if "compiled" in runners else "eager layers"
        result["recurrent_max_t"] = recurrent_sweep(model, cache, max_context, variants[name],
                                                    name, limits, ts, step_ids, args, floor,
                                                    n_gdn, gdn, dev, dtype)
        write_json(args.out, "step_hybrid.json", result)


def recurrent_sweep(model, cache, max_context, kw, name, limits, ts, step_ids, args, floor,
                    n_gdn, gdn, dev, dtype) -> dict:
    """Part 5: the same steps with each RECURRENT_MAX_T (new graphs for each: the kernel is
    chosen when a step is captured), logits against the first value's."""
    log(f"5. verify steps with fla's fused recurrent kernel up to T tokens: {limits} ({name})")
    saved, out, base, rows = gdn_ops.RECURRENT_MAX_T, {}, {}, []
    try:
        for limit in limits:
            gdn_ops.RECURRENT_MAX_T = limit
            graphs = GraphRunner(model, cache, max_context, capture=dev == "cuda", **kw)
            out[limit] = {}
            for t in ts:
                logits = graphs.step(step_ids[t], args.context).logits[:t].float().clone()
                cache.rollback(args.context)
                base.setdefault(t, logits)
                s = graphs.slot(graphs.bucket(t), graphs.kv_bucket(args.context + t))
                graphs.load(s, step_ids[t], args.context)
                step = timed(lambda: graphs.launch(s), args.iters, dev)
                hx = torch.randn(1, t, model.cfg.hidden_size, device=dev, dtype=dtype)
                layer = timed(_graphed(lambda: mix(gdn, hx, cache, None), dev), args.iters, dev)
                cache.rollback(args.context)
                ref = base[t]
                out[limit][t] = {"step": step, "gdn_layer": layer,
                                 "rel_err_vs_first": float((logits - ref).abs().max()
                                                           / ref.abs().max()),
                                 "argmax_vs_first": float((logits.argmax(-1) == ref.argmax(-1))
                                                          .float().mean())}
            sync(dev)
            ar = out[limit][ts[0]]["step"]["median_ms"]
            for t in ts:
                r = out[limit][t]
                first = out[limits[0]][t]["step"]["median_ms"]
                rows.append([limit, t, f"{r['step']['median_ms']:.3f}",
                             f"{r['step']['median_ms'] / floor:.2f}",
                             f"{r['step']['median_ms'] / ar:.3f}",
                             f"{first / r['step']['median_ms']:.3f}",
                             f"{r['gdn_layer']['median_ms']:.3f}",
                             f"{n_gdn * r['gdn_layer']['median_ms'] / r['step']['median_ms']:.0%}",
                             f"{r['rel_err_vs_first']:.1e}", f"{r['argmax_vs_first']:.2f}"])
    finally:
        gdn_ops.RECURRENT_MAX_T = saved
    print_table(["recurrent up to T", "T", "step ms", "x floor", "x AR step",
                 f"speed x (up to {limits[0]})", "1 GDN layer ms", "GDN share",
                 "logits rel err", "argmax agree"], rows,
                f"{name} steps: fla's fused recurrent kernel for verify steps (RECURRENT_MAX_T)")
    return out


def _graphed(fn, dev):
    """fn replayed from a CUDA graph of its own (stock.graphs.capture; CPU: fn itself)."""
    if dev != "cuda":
        return fn

    def run():
        with torch.inference_mode():
            return fn()

    graph, _ = capture(run, torch.device("cuda"), None)
    return graph.replay


if __name__ == "__main__":
    main()
