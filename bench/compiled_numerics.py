"""Compiled regions' numerics: stock's static step through torch.compile (inductor) against
the same step uncompiled, in fp32 and in bf16, each bf16 step measured against the fp32 step
of the same (bf16-representable) weights.

Issue 25 left open whether the compiled hybrid step's bf16 logits 8e-2 off the dynamic
forward's (H200, hybrid-27b) were a fault of a compiled region or bf16 rounding. A fault
shows as the compiled step far from the fp32 truth while the uncompiled bf16 step is near;
rounding as both equally far. Dense and hybrid presets side by side: random weights (std
0.08), a committed context of 20 tokens, one verify step of T tokens.

    python bench/compiled_numerics.py                      # CUDA where present (inductor: Triton)
    python bench/compiled_numerics.py --device cpu         # inductor's C++ backend
    python bench/compiled_numerics.py --smoke              # CPU, 4 layers, T 1

Prints one table; writes compiled_numerics.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import common  # noqa: F401  (the repository on sys.path)
from common import device_name, log, print_table, smoke_device, write_json

import torch  # noqa: E402

from stock import compiled as C  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.static_step import static_forward  # noqa: E402

CONTEXT = 20


def model_of(preset: str, layers: int, dtype, dev: str, seed: int = 5) -> Transformer:
    base = PRESETS[preset]
    kw = {"num_layers": layers}
    if base.hybrid:   # the preset's layer pattern, repeated to `layers`
        kw["layer_types"] = (base.layer_types * layers)[:layers]
    return Transformer.random(dataclasses.replace(base, **kw), dev, dtype, seed=seed, std=0.08)


def step_logits(model: Transformer, t: int, compiled: bool) -> torch.Tensor:
    dev = model.device
    gen = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, model.cfg.vocab_size, (1, CONTEXT), generator=gen).to(dev)
    ids = torch.randint(0, model.cfg.vocab_size, (1, t), generator=gen).to(dev)
    cache = model.new_cache(CONTEXT + 64 + t)
    with torch.inference_mode():
        model(ctx, cache, 0)
        cache.commit(CONTEXT)
        out = static_forward(model, ids, torch.arange(CONTEXT, CONTEXT + t, device=dev), cache,
                             64, (), compiled=compiled)
    return out.logits[0].float()


def off(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).abs().max() / ref.abs().max())


def agree(x: torch.Tensor, ref: torch.Tensor) -> str:
    return f"{int((x.argmax(-1) == ref.argmax(-1)).sum())}/{ref.shape[0]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny-qwen3,tiny-hybrid")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", default="1,16", help="verify step sizes T")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--smoke", action="store_true", help="CPU, 4 layers, T 1")
    args = ap.parse_args()
    dev = smoke_device(args)
    layers, tokens = (4, [1]) if args.smoke else (args.layers,
                                                  [int(t) for t in args.tokens.split(",")])
    rows, report = [], {"device": device_name(dev), "layers": layers, "rows": []}
    for preset in args.presets.split(","):
        bf = model_of(preset, layers, torch.bfloat16, dev)
        f32 = model_of(preset, layers, torch.float32, dev)
        with torch.no_grad():   # the truth: fp32 arithmetic on the bf16 weights
            for p, q in zip(f32.parameters(), bf.parameters()):
                p.copy_(q.float())
        for t in tokens:
            log(f"{preset} T={t}")
            C.reset()
            truth = step_logits(f32, t, False)
            f32c = step_logits(f32, t, True)
            eager, comp = step_logits(bf, t, False), step_logits(bf, t, True)
            fell = dict(C.fallbacks())
            r = {"preset": preset, "t": t, "fp32_compiled_vs_eager": off(f32c, truth),
                 "bf16_eager_vs_truth": off(eager, truth),
                 "bf16_compiled_vs_truth": off(comp, truth),
                 "bf16_compiled_vs_eager": off(comp, eager),
                 "argmax_eager": agree(eager, truth), "argmax_compiled": agree(comp, truth),
                 "graphs": C.graphs_compiled(), "fallbacks": fell}
            report["rows"].append(r)
            rows.append([preset, t, f"{r['fp32_compiled_vs_eager']:.1e}",
                         f"{r['bf16_eager_vs_truth']:.1e}", f"{r['bf16_compiled_vs_truth']:.1e}",
                         f"{r['bf16_compiled_vs_truth'] / r['bf16_eager_vs_truth']:.2f}",
                         f"{r['bf16_compiled_vs_eager']:.1e}", r["argmax_eager"],
                         r["argmax_compiled"], "none" if not fell else ", ".join(fell)])
    C.reset()
    print_table(["preset", "T", "fp32: compiled vs eager", "bf16 eager vs fp32",
                 "bf16 compiled vs fp32", "compiled / eager", "bf16 compiled vs eager",
                 "argmax eager", "argmax compiled", "fallbacks"], rows,
                f"{report['device']}, {layers} layers, max relative logit difference")
    write_json(args.out, "compiled_numerics.json", report)


if __name__ == "__main__":
    main()
