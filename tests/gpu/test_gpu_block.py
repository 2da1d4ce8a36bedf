"""Block drafter on CUDA: its fixed-shape step replayed from CUDA graphs (option block_graphs)
drafts the lattices of the same step run eagerly bit for bit; compiled (option compile) and
the plain eager path draft nearly the same (bf16 rounding); generation stays the AR output."""

from __future__ import annotations

import torch

from stock import compiled as C
from stock.config import PRESETS
from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options

VARIANTS = {"plain": {}, "static": {"static": True}, "graphs": {"graphs": True},
            "compiled": {"graphs": True, "compiled": True}}


def test_block_step_variants_draft_what_the_eager_step_drafts():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=21, std=0.08)
    net = BlockNet(BlockConfig.for_target(cfg, num_layers=2, block_size=8)).init_weights(1, 0.2)
    gen = torch.Generator().manual_seed(3)
    # 240 + 40 tokens: the drafter's key buckets 256 then 512 (both captured)
    prompt = torch.randint(0, cfg.vocab_size, (240,), generator=gen).tolist()
    engine = Engine(model, Options({"draft_len": 7}), max_context=512)
    ar = engine.generate(prompt, 40).tokens
    lattices = {}
    for name, kw in VARIANTS.items():
        drafter = BlockDrafter(net, model, 512, **kw)
        seen = []
        inner = drafter.draft

        def record(ctx, k, inner=inner, seen=seen):
            lat = inner(ctx, k)
            seen.append((lat.ids.clone(), lat.logprobs.clone()))
            return lat
        drafter.draft = record
        res = engine.generate(prompt, 40, drafter)
        assert res.tokens == ar, name
        lattices[name] = seen
        if drafter.graphs:
            assert sorted(drafter._graphs) == [256, 512]  # captured and replayed
    assert C.fallbacks() == {}
    want = lattices["static"]
    assert len(lattices["graphs"]) == len(want)
    for (a_ids, a_lp), (b_ids, b_lp) in zip(lattices["graphs"], want):
        assert torch.equal(a_ids, b_ids) and torch.equal(a_lp, b_lp)
    for name in ("plain", "compiled"):  # other kernels, other bf16 rounding: nearly the same
        got = lattices[name]
        assert len(got) == len(want)
        top = torch.cat([a[0][:, 0] for a in got]), torch.cat([b[0][:, 0] for b in want])
        assert (top[0] == top[1]).float().mean() >= 0.9, name
        lp = torch.cat([a[1][:, 0] for a in got]), torch.cat([b[1][:, 0] for b in want])
        assert (lp[0] - lp[1]).abs().median() < 0.05, name
