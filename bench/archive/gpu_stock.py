"""Stock engine on a GPU: speculative against autoregressive, bf16 weights, fp32 logits.

For each dev prompt: the AR output, then each drafter's speculative output. Where they
differ, the first divergence is located and the AR reference's own top-1 minus top-2 logit
margin there is read by token forcing (chunk 1, the AR step shape): a near-tie explains a
divergence, a large margin would be a bug. Prints one table; full JSON to --out.

    python bench/gpu_stock.py --prompts 8 --max-new 256 --out $OUT/gpu_stock.json

`--graphs on|off|both` (default: the option `cuda_graphs`, on): with `both`, the same model
runs through an engine with CUDA graphs and one without, and the summaries are printed side
by side. Every graph shape the runs can use is captured before timing starts.
`--compile on|off|both` (default: the option `compile`, on; it applies to the graph path):
with `both`, the graph runs are made with compiled layers and without, side by side; the
capture time then includes compiling (stock/compiled.py).

    python bench/gpu_stock.py --prompts 8 --max-new 256 --compile both --out $OUT/gpu_stock.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stock.engine import Engine  # noqa: E402
from stock.options import resolve  # noqa: E402
from specpilot.requests import load_dev, select  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--drafters", default="ngram,draft")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--opt", action="append", default=[], help="engine option NAME=VALUE")
    ap.add_argument("--graphs", choices=("on", "off", "both"), default=None,
                    help="CUDA graphs on, off, or both side by side (default: option cuda_graphs)")
    ap.add_argument("--compile", choices=("on", "off", "both"), default=None,
                    help="graph steps with compiled layers, eager layers, or both side by side "
                         "(default: option compile)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    opts = resolve(args.opt)
    system = load_system(args.model, opts, device=args.device, max_context=4096)
    load_s = time.perf_counter() - t0
    tok = system.tokenizer
    reqs = select(load_dev(), None, 2)[: args.prompts]
    prompts = [tok.chat(r.prompt) for r in reqs]
    drafters = [d for d in args.drafters.split(",") if d]
    graph_settings = {"on": [True], "off": [False], "both": [True, False],
                      None: [opts["cuda_graphs"]]}[args.graphs]
    compile_settings = {"on": [True], "off": [False], "both": [True, False],
                        None: [opts["compile"]]}[args.compile]
    # (cuda_graphs, compile); compile applies to the graph path only
    settings = [(g, c) for g in graph_settings for c in (compile_settings if g else [False])]
    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "dtype": str(system.engine.model.dtype),
              "load_s": round(load_s, 2), "max_new": args.max_new, "runs": []}
    for graphs, comp in settings:
        eng = system.engine
        if graphs != eng.options["cuda_graphs"] or comp != eng.options["compile"]:
            eng = Engine(eng.model, eng.options.with_values(cuda_graphs=graphs, compile=comp),
                         eng.max_context, eng.stop_ids)
        t1 = time.perf_counter()
        if eng.runner is not None:  # capture every shape the runs can reach, before timing
            end = max(len(p) for p in prompts) + args.max_new + 1
            for d in [None, *drafters]:
                drafter = make_drafter(d, eng)
                eng.runner.capture_upto(end, drafter.hidden_layers if drafter else ())
        capture_s = time.perf_counter() - t1
        summary, rows = run(eng, reqs, prompts, drafters, args)
        report["runs"].append({"cuda_graphs": eng.uses_graphs, "compiled": eng.compiled,
                               "label": ("graphs" if eng.uses_graphs else "eager")
                               + ("+compile" if eng.compiled else ""),
                               "capture_s": round(capture_s, 2),
                               "graph_slots": len(eng.runner.slots) if eng.runner else 0,
                               "options": eng.options.as_dict(), "summary": summary,
                               "rows": rows})
        print_run(report, report["runs"][-1])
        del eng
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if len(report["runs"]) >= 2:  # each run against the last (the least optimised) one
        base = report["runs"][-1]
        for on in report["runs"][:-1]:
            la, lb = on["label"], base["label"]
            print(f"\n{'mode':<8}{'tok/s ' + la:>22}{'tok/s ' + lb:>22}{'x':>7}"
                  f"{'step ms ' + la:>24}{'step ms ' + lb:>24}")
            for mode in on["summary"]:
                a, b = on["summary"][mode], base["summary"][mode]
                print(f"{mode:<8}{a['tokens_per_s']:>22}{b['tokens_per_s']:>22}"
                      f"{a['tokens_per_s'] / max(b['tokens_per_s'], 1e-9):>7.2f}"
                      f"{a['step_ms']:>24}{b['step_ms']:>24}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def run(eng, reqs, prompts, drafters, args):
    """Every mode on every prompt with one engine: (summary per mode, rows per request)."""
    eng.generate(prompts[0], 16)  # warm-up: kernels, allocator
    for d in drafters:
        eng.generate(prompts[0], 16, make_drafter(d, eng))

    rows, stats = [], {m: {"tokens": 0, "s": 0.0, "decode_s": 0.0, "steps": 0, "acc": 0,
                                     "tps": []}
                       for m in ["ar", *drafters]}
    for req, prompt in zip(reqs, prompts):
        ar = eng.generate(prompt, args.max_new)
        outs = {"ar": ar}
        for d in drafters:
            outs[d] = eng.generate(prompt, args.max_new, make_drafter(d, eng))
        for mode, res in outs.items():
            s = stats[mode]
            s["tokens"] += len(res.tokens)
            s["s"] += res.prefill_s + res.decode_s
            s["decode_s"] += res.decode_s
            s["steps"] += res.steps
            s["acc"] += sum(res.accepted)
            s["tps"].append(res.tokens_per_s)
        forced = eng.force(prompt, ar.tokens, chunk=1)
        for d in drafters:
            pos = first_divergence(ar.tokens, outs[d].tokens)
            rows.append({"request": req.id, "drafter": d, "tokens": len(ar.tokens),
                         "identical": pos is None and len(ar.tokens) == len(outs[d].tokens),
                         "first_divergence": pos,
                         "ar_margin_there": None if pos is None else round(forced.margin[pos], 5),
                         "min_ar_margin": round(min(forced.margin), 5)})

    summary = {}
    for mode, s in stats.items():
        summary[mode] = {
            "tokens_per_s": round(s["tokens"] / s["s"], 2),
            "median_request_tok_s": round(statistics.median(s["tps"]), 2),
            "tau": round(s["acc"] / max(s["steps"], 1), 3),
            "step_ms": round(1e3 * s["decode_s"] / max(s["steps"], 1), 3),
            "speedup_vs_ar": round((s["tokens"] / s["s"]) / (stats["ar"]["tokens"] / stats["ar"]["s"]), 3),
        }
    return summary, rows


def print_run(report: dict, run_: dict) -> None:
    rows, summary = run_["rows"], run_["summary"]
    print(f"\n{report['device']}  torch {report['torch']}  {report['dtype']}  "
          f"load {report['load_s']:.1f}s  cuda_graphs {run_['cuda_graphs']} "
          f"compile {run_['compiled']} "
          f"({run_['graph_slots']} graphs captured in {run_['capture_s']:.1f}s)")
    print(f"{'request':<18}{'drafter':<8}{'tokens':>7}{'same':>6}{'div@':>6}{'AR margin':>11}{'min margin':>11}")
    for r in rows:
        print(f"{r['request']:<18}{r['drafter']:<8}{r['tokens']:>7}{str(r['identical']):>6}"
              f"{'' if r['first_divergence'] is None else r['first_divergence']:>6}"
              f"{'' if r['ar_margin_there'] is None else r['ar_margin_there']:>11}{r['min_ar_margin']:>11}")
    print(f"\n{'mode':<8}{'tok/s':>9}{'median':>9}{'tau':>7}{'step ms':>9}{'x AR':>7}")
    for mode, s in summary.items():
        print(f"{mode:<8}{s['tokens_per_s']:>9}{s['median_request_tok_s']:>9}{s['tau']:>7}"
              f"{s['step_ms']:>9}{s['speedup_vs_ar']:>7}")


if __name__ == "__main__":
    main()
