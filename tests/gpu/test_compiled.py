"""Compiled layers on CUDA (option `compile`): compiled in warm-up, captured into the slot's
graph (replays equal the compiled forward run without a graph, bit for bit), close to the
eager static forward in bf16, one graph per region and T whatever the layer count, no
fallback to eager; the engine uses it by default and not with compile=false."""

from __future__ import annotations

import dataclasses

import torch

from stock import compiled as C
from stock.config import PRESETS
from stock.engine import Engine
from stock.graphs import GraphRunner
from stock.model import Transformer
from stock.options import Options

CTX = 192


def _runners(model, prompt, **kinds):
    out = {}
    for name, (capture, compile) in kinds.items():
        cache = model.new_cache(CTX + 64)
        model(torch.tensor([prompt], device="cuda"), cache, 0, logits="none")
        out[name] = GraphRunner(model, cache, CTX, capture=capture, compile=compile)
    return out


def test_compiled_graphs_replay_the_compiled_forward_and_stay_close_to_eager():
    cfg = dataclasses.replace(PRESETS["tiny-qwen3"], num_layers=4)
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=31, std=0.08)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    r = _runners(model, prompt, graph=(True, True), plain=(False, True), eager=(False, False))
    start = len(prompt)
    before = C.graphs_compiled()
    for t in (1, 4, 9):
        ids = torch.randint(0, cfg.vocab_size, (t,), generator=gen).tolist()
        for _ in range(2):
            got = r["graph"].step(ids, start).logits[:t].clone()
            plain = r["plain"].step(ids, start).logits[:t].clone()
            want = r["eager"].step(ids, start).logits[:t].clone()
            assert torch.equal(got, plain), t
            rel = ((got - want).norm() / want.norm()).item()
            assert rel < 2e-2, (t, rel)
        start += 1
    assert C.graphs_compiled() - before <= 3 * 4  # T buckets 1, 4, 16: 4 regions each
    assert not C.fallbacks()
    assert all(s.graph is not None for s in r["graph"].slots.values())
    for layer in range(cfg.num_layers):  # the same K/V written (bf16 rounding aside)
        a, b = r["graph"].cache.k[layer][:, :, :start + 8], r["eager"].cache.k[layer][:, :, :start + 8]
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 2e-2


def test_engine_compiles_by_default_and_not_with_the_option_off():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=32, std=0.08)
    on = Engine(model, max_context=512)
    off = Engine(model, Options({"compile": False}), max_context=512)
    assert on.compiled and on.runner.compile and on.uses_graphs
    assert not off.compiled and not off.runner.compile and off.uses_graphs
    prompt = list(range(3, 60))
    assert on.generate(prompt, 24).tokens and not C.fallbacks()
