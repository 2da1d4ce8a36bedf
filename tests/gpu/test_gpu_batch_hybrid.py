"""Batched hybrid GDN steps on CUDA (flash-linear-attention's kernels where installed): on the
dynamic forward every request's output is its single-request one, or departs from it at a
near-tie of the single-request reference (bf16; fla's products run in TF32); the verify
steps replayed from CUDA graphs give what the same static steps give run eagerly."""

from __future__ import annotations

import torch

from kernels.gdn import fla_available
from stock.batch import BatchEngine
from stock.config import PRESETS
from stock.drafters.draft_model import DraftModelDrafter
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options

NEAR_TIE = 0.25   # bf16 logits of a random tiny target: a top-1 minus top-2 margin below this


def test_hybrid_rows_batched_on_cuda_equal_their_single_request_outputs_but_near_ties():
    model = Transformer.random(PRESETS["tiny-hybrid"], "cuda", torch.bfloat16, seed=4, std=0.08)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist()
               for n in (5, 17, 9, 30, 3, 12, 44, 8)]
    single = Engine(model, Options({"draft_len": 4}), 256)
    want = [single.generate(p, 24).tokens for p in prompts]
    be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256,
                     prefill_chunk=16, static=False,
                     drafter_factory=lambda: DraftModelDrafter(model, 256, num_layers=3))
    assert be.runner is None   # the dynamic forward (the graphs: the test below)
    reqs = [be.submit(p, 24) for p in prompts]
    be.run()
    equal, margins = 0, []
    for p, req, ref in zip(prompts, reqs, want):
        if req.tokens == ref:
            equal += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(req.tokens, ref)) if a != b)
        margins.append(single.force(p, ref[:at + 1], chunk=1).margin[at])
    print(f"fla {fla_available()}: {equal}/{len(prompts)} equal; margins at divergence {margins}")
    assert all(m < NEAR_TIE for m in margins), margins
    assert equal >= len(prompts) // 2
    assert max(a for r in reqs for a in r.accepted) > 1


def test_hybrid_batches_replayed_from_graphs_equal_the_eager_static_steps():
    """stock/batch_graphs.py on a hybrid target: the same static steps (requests and tokens
    buckets, the GDN staging in the slot's buffers handed back after each replay) captured
    and replayed, against run eagerly; token for token, the draft-model drafter accepting
    part of its drafts (rows ragged, states committed at every count)."""
    model = Transformer.random(PRESETS["tiny-hybrid"], "cuda", torch.bfloat16, seed=4, std=0.08)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist()
               for n in (5, 17, 9, 30, 3, 12, 44, 8)]
    outs = []
    for capture in (False, True):
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256,
                         prefill_chunk=16, static=True, capture=capture,
                         drafter_factory=lambda: DraftModelDrafter(model, 256, num_layers=3))
        if capture:
            assert be.prepare(160) > 0
            assert all(s.graph is not None for s in be.runner.slots.values())
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
        outs.append([(r.tokens, r.accepted) for r in reqs])
    assert outs[0] == outs[1]
    assert max(a for _, acc in outs[1] for a in acc) > 1
