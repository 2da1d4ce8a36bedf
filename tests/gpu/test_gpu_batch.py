"""Batched steps on CUDA: replayed from CUDA graphs (stock/batch_graphs.py) they give the
tokens of the eager static step, and every request's output is its single-request one
within bf16 near-ties (here: the same tokens on a random tiny target)."""

from __future__ import annotations

import torch

from stock.batch import BatchEngine
from stock.config import PRESETS
from stock.drafters.block import BlockConfig, BlockNet
from stock.drafters.block_batch import BatchBlockDrafter
from stock.drafters.ngram import NGramDrafter
from stock.model import Transformer
from stock.options import Options


def _tiny_block(block_size: int, lengths=(5, 17, 9, 30, 3)):
    """The tiny random target on CUDA in bf16, a 2-layer block drafter initialised from it,
    and random prompts of these lengths."""
    model = Transformer.random(PRESETS["tiny-qwen3"], "cuda", torch.bfloat16, seed=1, std=0.08)
    cfg = BlockConfig.for_target(model.cfg, num_layers=2, block_size=block_size)
    net = BlockNet(cfg).init_from_target(model)
    gen = torch.Generator().manual_seed(0)
    return model, net, [torch.randint(1, 512, (n,), generator=gen).tolist() for n in lengths]


def test_graph_replayed_batches_equal_the_eager_static_ones():
    model = Transformer.random(PRESETS["tiny-qwen3"], "cuda", torch.bfloat16, seed=1, std=0.08)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (5, 17, 9, 30, 3)]
    outs = []
    for capture in (True, False):
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256,
                         drafter_factory=lambda: NGramDrafter(4, 1, 4), capture=capture)
        assert be.runner is not None
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
        outs.append([r.tokens for r in reqs])
        if capture:
            assert all(s.graph is not None for s in be.runner.slots.values())
    assert outs[0] == outs[1]


def test_graph_replayed_batches_with_the_batched_block_drafter_equal_the_eager_ones():
    """The BatchRunner's slots also return the block drafter's target hidden states: the
    same tokens and acceptance with graphs as without."""
    model, net, prompts = _tiny_block(4)
    outs = []
    for capture in (True, False):
        be = BatchEngine(model, Options({"draft_len": 3, "block_size": 4}), max_batch=4,
                         max_context=256, capture=capture,
                         batch_drafter=BatchBlockDrafter(net, model, 256, rows=5,
                                                         capture=capture))
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
        outs.append([(r.tokens, r.accepted) for r in reqs])
        if capture:   # the drafter's draft steps were replayed from graphs of its own
            graphs = be.batch_drafter._graphs.values()
            assert graphs and all(g[2] is not None for g in graphs)
    assert outs[0] == outs[1]


def test_the_compiled_batched_drafter_drafts_what_the_eager_regions_draft():
    """Option block_compile (with compile, the default on CUDA): the batched drafter's draft
    and context update run inductor-compiled regions inside their CUDA graphs. Against the
    same regions run eagerly in graphs: the same served tokens (the target decides them),
    the same top-1 draft wherever it leads by more than 0.05 in log-probability and
    log-probs within bf16 rounding, every drafter region compiled, no fallback; the chains
    left on the device (option batch_chain_device, its argmax region) are the lattices'
    top-1 wherever it leads so."""
    from stock import compiled as C

    model, net, prompts = _tiny_block(4)
    runs = {}
    for chains in (False, True):
        for compiled in (False, True):
            bd = BatchBlockDrafter(net, model, 256, rows=5, compiled=compiled)
            seen, lattices = [], bd._lattices   # draft() and draft_chains() draft through it
            bd._lattices = lambda rows, pend, top1=False, f=lattices, seen=seen: \
                seen.append(f(rows, pend, top1).clone()) or seen[-1]
            be = BatchEngine(model, Options({"draft_len": 3, "block_size": 4,
                                             "batch_chain_device": chains}),
                             max_batch=4, max_context=256, batch_drafter=bd)
            reqs = [be.submit(p, 24) for p in prompts]
            be.run()
            runs[chains, compiled] = ([r.tokens for r in reqs], seen)
    assert all(r[0] == runs[False, False][0] for r in runs.values())
    assert not C.fallbacks()
    assert {n for n, _ in C._compiled} >= {"batch_block_prologue", "batch_block_context",
                                           "batch_block_lattice", "batch_block_chain"}
    for compiled in (False, True):   # chains [rows, T] against the eager lattices' top-1
        sure = 0
        for lat, ch in zip(runs[False, False][1], runs[True, compiled][1]):
            if lat.shape[1:3] != ch.shape:   # the drafts parted
                break
            lead = lat[1, :, :, 0] - lat[1, :, :, 1] > 0.05
            assert torch.equal(lat[0, :, :, 0][lead].long(), ch[lead])
            sure += int(lead.sum())
        assert sure > 20, (compiled, sure)
    runs = {c: runs[False, c] for c in (False, True)}
    sure = worst = 0.0
    for a, b in zip(runs[False][1], runs[True][1]):   # [2, rows, T, top-k] each
        if a.shape != b.shape:   # the drafts parted: acceptance, then the batches, differ
            break
        # bf16 rounding may swap near-tied top tokens; where the eager top-1 leads by more
        # than 0.05 in log-probability, the compiled one is the same token
        lead = a[1, :, :, 0] - a[1, :, :, 1] > 0.05
        assert torch.equal(a[0, :, :, 0][lead], b[0, :, :, 0][lead])
        sure += int(lead.sum())
        ids_equal = (a[0] == b[0]).all(-1)   # positions whose top-k ids agree
        if ids_equal.any():
            worst = max(worst, float((a[1] - b[1]).abs()[ids_equal].max()))
    assert sure > 20, sure
    assert worst < 0.1, worst


def test_the_batched_drafter_through_the_split_kv_kernel_drafts_what_sdpa_drafts():
    """Option attention_kernel "triton" (the default) reaches the batched block drafter:
    its attention reads each row's keys in place through kernels/attention (no gather of
    K/V rows). Against SDPA over the gathered rows, both compiled in graphs: the same
    served tokens, the same top-1 draft wherever it leads by more than 0.05."""
    model, net, prompts = _tiny_block(8)
    runs = {}
    for attention in ("sdpa", "triton"):
        bd = BatchBlockDrafter(net, model, 256, rows=5, compiled=True, attention=attention)
        assert bd.kernel == (attention == "triton")
        seen, lattices = [], bd._lattices
        bd._lattices = lambda rows, pend, top1=False, f=lattices, seen=seen: \
            seen.append(f(rows, pend, top1).clone()) or seen[-1]
        be = BatchEngine(model, Options({"draft_len": 7, "block_size": 8,
                                         "batch_chain_device": False}),
                         max_batch=4, max_context=256, batch_drafter=bd)
        reqs = [be.submit(p, 32) for p in prompts]
        be.run()
        runs[attention] = ([r.tokens for r in reqs], seen)
    assert runs["sdpa"][0] == runs["triton"][0]
    sure = 0
    for a, b in zip(runs["sdpa"][1], runs["triton"][1]):
        if a.shape != b.shape:   # the drafts parted
            break
        lead = a[1, :, :, 0] - a[1, :, :, 1] > 0.05
        assert torch.equal(a[0, :, :, 0][lead], b[0, :, :, 0][lead])
        sure += int(lead.sum())
    assert sure > 20, sure


def test_the_context_update_queued_before_the_read_serves_what_the_late_one_serves():
    """Option batch_overlap on CUDA graphs: the batched drafter's context update queued
    behind the verify step (counts read on the device, the step's results through a pinned
    buffer and an event) serves the tokens and acceptance of the update queued after the
    host's read, and leaves the same drafter K/V in the requests' rows (the drafter's last
    row is the graphs' padding row, which padded slots write and nothing reads: it
    differs, H100, session 34)."""
    model, net, prompts = _tiny_block(4, lengths=(5, 17, 9, 30))
    outs = []
    for overlap in (True, False):
        bd = BatchBlockDrafter(net, model, 256, rows=5)
        be = BatchEngine(model, Options({"draft_len": 3, "block_size": 4,
                                         "batch_overlap": overlap}),
                         max_batch=4, max_context=256, batch_drafter=bd)
        reqs = [be.submit(p, 40) for p in prompts]
        be.run()
        outs.append(([(r.tokens, r.accepted) for r in reqs],
                     [x[:bd.spare].clone() for x in bd.k + bd.v]))
    assert outs[0][0] == outs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))


def test_drafts_queued_ahead_serve_the_tokens_of_drafts_made_at_the_step():
    """Option batch_draft_ahead on CUDA graphs: the next step's drafts queued once the host
    has read a step's acceptance serve the tokens served without it (more requests than
    rows: rows freed and taken again), and are taken by most steps."""
    model, net, prompts = _tiny_block(4, lengths=(5, 17, 9, 30, 3, 12))
    outs, taken = [], []
    for ahead in (True, False):
        be = BatchEngine(model, Options({"draft_len": 3, "block_size": 4,
                                         "batch_draft_ahead": ahead}),
                         max_batch=3, max_context=256,
                         batch_drafter=BatchBlockDrafter(net, model, 256, rows=4))
        real, hits = be._drafted_ahead, []
        be._drafted_ahead = lambda live, f=real, hits=hits: hits.append(f(live)) or hits[-1]
        reqs = [be.submit(p, 24 + 4 * i) for i, p in enumerate(prompts)]
        be.run()
        outs.append([r.tokens for r in reqs])
        taken.append(sum(h is not None for h in hits))
    assert outs[0] == outs[1]
    assert taken[0] > 10 and taken[1] == 0, taken
