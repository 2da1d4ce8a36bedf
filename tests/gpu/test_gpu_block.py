"""Block drafter on CUDA: its forward replayed from CUDA graphs (option block_graphs) drafts
the lattices of the eager forward bit for bit, and generation stays the AR output."""

from __future__ import annotations

import torch

from stock.config import PRESETS
from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options


def test_block_graphs_draft_what_the_eager_forward_drafts():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=21, std=0.08)
    net = BlockNet(BlockConfig.for_target(cfg, num_layers=2, block_size=8)).init_weights(1, 0.2)
    gen = torch.Generator().manual_seed(3)
    # 240 + 40 tokens: the drafter's key buckets 256 then 512 (both captured)
    prompt = torch.randint(0, cfg.vocab_size, (240,), generator=gen).tolist()
    engine = Engine(model, Options({"draft_len": 7}), max_context=512)
    lattices = {}
    for graphs in (False, True):
        drafter = BlockDrafter(net, model, 512, graphs=graphs)
        seen = []
        inner = drafter.draft

        def record(ctx, k, inner=inner, seen=seen):
            lat = inner(ctx, k)
            seen.append((lat.ids.clone(), lat.logprobs.clone()))
            return lat
        drafter.draft = record
        res = engine.generate(prompt, 40, drafter)
        lattices[graphs] = (res.tokens, seen)
        if graphs:
            assert sorted(drafter._graphs) == [256, 512]  # captured and replayed
    assert lattices[True][0] == lattices[False][0] == engine.generate(prompt, 40).tokens
    assert len(lattices[True][1]) == len(lattices[False][1])
    for (a_ids, a_lp), (b_ids, b_lp) in zip(lattices[True][1], lattices[False][1]):
        assert torch.equal(a_ids, b_ids) and torch.equal(a_lp, b_lp)
