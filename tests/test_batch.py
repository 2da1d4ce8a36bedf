"""Continuous batching (stock/batch.py): every request's output under batching equals its
single-request greedy output (fp32, CPU), rows reused as requests leave, streaming from
many threads, bad requests refused."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from block_fixtures import one_thread
from stock.batch import BackgroundBatch, BatchEngine, BatchError
from stock.config import PRESETS
from stock.drafters.draft_model import DraftModelDrafter
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options

RECORDED = json.loads((Path(__file__).parent / "data" / "greedy_64.json").read_text())


@pytest.fixture(scope="module")
def tiny():
    with one_thread():
        model = Transformer.random(PRESETS["tiny-qwen3"], seed=1, std=0.08)
        gen = torch.Generator().manual_seed(0)
        lengths = [5, 17, 9, 30, 3, 12, 44, 8, 21, 6, 14, 27, 2, 11, 19, 36]   # 16, mixed
        motif = torch.randint(1, 512, (4,), generator=gen).tolist()
        prompts = [(motif * 12)[:n] if i % 3 == 0 else
                   torch.randint(1, 512, (n,), generator=gen).tolist()
                   for i, n in enumerate(lengths)]
        single = Engine(model, Options({"draft_len": 4}), 256)
        want = [single.generate(p, 24).tokens for p in prompts]
    return model, prompts, want


@pytest.mark.parametrize("drafter", ["ar", "ngram", "draft"])
def test_sixteen_requests_arriving_spread_equal_their_single_request_outputs(tiny, drafter):
    model, prompts, want = tiny
    factory = {"ar": lambda: None, "ngram": lambda: NGramDrafter(4, 1, 4),
               "draft": lambda: DraftModelDrafter(model, 256, num_layers=1)}[drafter]
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256,
                         drafter_factory=factory)
        reqs, steps, most = [], 0, 0
        for i, p in enumerate(prompts):        # arrivals spread: two requests every step
            reqs.append(be.submit(p, 24 - (i % 5)))
            if i % 2:
                be.step()
                steps += 1
                most = max(most, len(be.active))
        be.run()
    for i, (req, ref) in enumerate(zip(reqs, want)):
        assert req.tokens == ref[:24 - (i % 5)], i
        assert req.stop_reason == "length"
    assert most == 4 and be.idle   # the batch was full, rows were reused, all left
    if drafter != "ar":
        assert max(max(r.accepted) for r in reqs) > 1   # drafts were accepted somewhere


def test_the_static_step_the_graphs_replay_gives_the_same_outputs(tiny):
    """stock/batch_graphs.py run eagerly (CPU): bucketed requests and tokens, padding
    requests in the spare row, acceptance on the device; outputs as without it."""
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=3, max_context=256,
                         drafter_factory=lambda: NGramDrafter(4, 1, 4), static=True,
                         capture=False)
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
    assert [r.tokens for r in reqs] == want
    shapes = set(be.runner.slots)
    assert {b for b, _, _ in shapes} >= {2, 3} and {t for _, t, _ in shapes} >= {1, 4, 8}
    spare = be.cache.k[0].shape[0] - 1
    assert spare == 3 and be.runner.spare == spare   # padding requests' scratch row


@pytest.mark.parametrize("graph_prefill", [True, False])
def test_admitted_prompts_prefill_through_the_static_steps(tiny, graph_prefill):
    """Option graph_prefill on the static path: the admitted prompts go through the
    runner's steps in chunks of its largest bucket (64; a prompt of 150 tokens in three),
    all admitted rows of a chunk in one step, as a single request's prefill does; a prompt
    past graph_prefill_max (here 200) and every prompt with the option off through the
    dynamic forward. Outputs are the single-request ones either way."""
    model, prompts, want = tiny
    gen = torch.Generator().manual_seed(5)
    long, longer = (torch.randint(1, 512, (n,), generator=gen).tolist() for n in (150, 220))
    opts = {"draft_len": 4, "graph_prefill": graph_prefill, "graph_prefill_max": 200}
    with one_thread():
        single = Engine(model, Options({"draft_len": 4}), 256)
        refs = [single.generate(x, 12).tokens for x in (long, longer)]
        be = BatchEngine(model, Options(opts), max_batch=3, max_context=256, static=True,
                         capture=False, drafter_factory=lambda: NGramDrafter(4, 1, 4))
        steps, dynamic = [], []
        step, forward = be.runner.step, be._forward
        be.runner.step = lambda seqs, *a: (steps.append([len(x) for x in seqs]),
                                           step(seqs, *a))[1]
        be._forward = lambda seqs, *a, **k: (dynamic.append([len(x) for x in seqs]),
                                             forward(seqs, *a, **k))[1]
        reqs = [be.submit(p, 24) for p in prompts[:6]]
        be.step()                               # three admitted together, one decode step
        first = [n for n in steps if max(n) > 5]   # longer than a verify step (draft_len 4)
        be.run()
        steps.clear()
        big = [be.submit(x, 12) for x in (long, longer)]
        be.run()
        chunks = [n for n in steps if max(n) > 5]
    assert [r.tokens for r in reqs] == want[:6] and [r.tokens for r in big] == refs
    if graph_prefill:
        assert first == [[5, 17, 9]]            # the three prompts' one chunk, one step
        assert chunks == [[64], [64], [22]]     # the 150 tokens, in three steps
        assert dynamic == [[220]]               # past graph_prefill_max: one dynamic chunk
    else:
        assert first == [] and chunks == []     # every admission the dynamic forward's:
        assert dynamic[0] == [5, 17, 9] and dynamic[-1] == [150, 220]   # rows together


def test_the_compiled_static_step_compiles_once_for_every_requests_bucket(tiny, monkeypatch):
    """The batched step's regions take the requests and tokens buckets as dynamic sizes
    (stock/compiled.py, requests_dynamic): computing every slot of 16 requests compiles no
    more graphs than computing every slot of 2, at equal outputs from equal inputs. Static,
    each (requests, tokens) bucket pair compiled every region again: 140 graphs against 24
    for up to 16 requests and 64 tokens, and on the H100 90-200 s of a throughput
    verdict's preparation."""
    import stock.batch as batch_mod
    from stock import compiled as C

    model, _, _ = tiny
    monkeypatch.setattr(C, "BACKEND", "eager")
    monkeypatch.setattr(batch_mod, "compile_enabled", lambda options, device: True)
    counts, packed = [], []
    try:
        for max_batch in (2, 16):
            C.reset()
            with one_thread():
                be = BatchEngine(model, Options({"draft_len": 7}), max_batch=max_batch,
                                 max_context=128, static=True, capture=False)
                be.prepare(40)
                runner = be.runner
                assert {b for b, _t, _kv in runner.slots} == set(runner.b_buckets)
                for s in runner.slots.values():
                    runner._scratch(s)
                    runner._compute(s)
                two = runner.slot(2, 8, runner.kv_buckets[0])
                runner._scratch(two)
                packed.append(runner._compute(two)[0].clone())
            counts.append(C.graphs_compiled())
            assert not C.fallbacks()
    finally:
        C.reset()
    assert 0 < counts[1] == counts[0], counts
    assert torch.equal(packed[0], packed[1])


def test_the_static_step_through_compiled_regions_gives_the_same_outputs(tiny, monkeypatch):
    """With option compile (CUDA only: forced here) the batched step runs stock/compiled.py's
    regions (region A writing each request's K/V into its own row, fused projections) around
    SDPA over the rows; dynamo traces them with its "eager" backend on the CPU."""
    import stock.batch as batch_mod
    from stock import compiled as C

    model, prompts, want = tiny
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    monkeypatch.setattr(batch_mod, "compile_enabled", lambda options, device: True)
    try:
        with one_thread():
            be = BatchEngine(model, Options({"draft_len": 4}), max_batch=3, max_context=256,
                             drafter_factory=lambda: NGramDrafter(4, 1, 4), static=True,
                             capture=False)
            assert be.runner.compile and be.runner.fused
            reqs = [be.submit(p, 24) for p in prompts[:6]]
            be.run()
        assert [r.tokens for r in reqs] == want[:6]
        assert C.graphs_compiled() > 0 and not C.fallbacks()
    finally:
        C.reset()


def test_admitted_prompts_are_prefilled_together_chunk_by_chunk(tiny):
    """Prompts of mixed lengths admitted in one step share each chunk's forward (rows
    padded to the longest chunk, token_budget // prefill_chunk rows a forward) and still
    give their single-request outputs."""
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256,
                         prefill_chunk=8, token_budget=24)
        calls = []
        real = be._forward
        be._forward = lambda seqs, rows, starts, **kw: calls.append(len(rows)) or real(
            seqs, rows, starts, **kw)
        reqs = [be.submit(p, 24) for p in prompts]
        be.step()                                  # admits four: their prefill, then a step
    prefill = calls[:-1]
    assert max(prefill) == 3                       # 24 // 8 rows at once, never more
    alone = sum(-(-len(p) // 8) for p in prompts[:4])   # forwards a row at a time would take
    assert len(prefill) < alone
    with one_thread():
        be.run()
    assert [r.tokens for r in reqs] == want


def test_a_prefill_chunk_computes_the_head_only_at_each_rows_last_token(tiny):
    """The prefill's forward (`last`): logits [R, vocab] equal the full head's at each row's
    last real token (rows of 3, 8 and 5 tokens padded to 8), and the cache is written alike."""
    model, prompts, _ = tiny
    seqs = [prompts[0][:3], prompts[1][:8], prompts[2][:5]]
    outs = []
    for last in (False, True):
        be = BatchEngine(model, Options(), max_batch=3, max_context=64)
        outs.append((be._forward(seqs, [0, 1, 2], [0, 0, 0], last=last)[0], be.cache))
    (full, c0), (head, c1) = outs
    assert full.shape[:2] == (3, 8) and head.shape == (3, full.shape[-1])
    for i, seq in enumerate(seqs):
        assert torch.allclose(head[i], full[i, len(seq) - 1], atol=1e-5), i
        assert not torch.allclose(head[i], full[i, 0], atol=1e-3), i
    assert all(torch.equal(a[:3, :, :8], b[:3, :, :8]) for a, b in zip(c0.k, c1.k))


@pytest.mark.slow
def test_the_embedded_defaults_dev_prompts_served_together_equal_their_ar_outputs(smol, dev_prompts):
    be = BatchEngine(smol.engine.model, Options({"draft_len": 4}), max_batch=8,
                     max_context=2048, stop_ids=smol.engine.stop_ids,
                     drafter_factory=lambda: NGramDrafter(4, 1, 4))
    reqs = [be.submit(p, 16) for p in dev_prompts]   # 16 tokens each: CI time
    be.run()
    for i, req in enumerate(reqs):
        assert req.tokens == RECORDED["tokens"]["ar"][i][:16], i


def test_many_threads_stream_at_once_and_get_their_own_tokens(tiny):
    model, prompts, want = tiny
    bg = BackgroundBatch(BatchEngine(model, Options({"draft_len": 4}), max_batch=3,
                                     max_context=256,
                                     drafter_factory=lambda: NGramDrafter(4, 1, 4)))
    got: dict[int, list[list[int]]] = {}

    def client(i):
        got[i] = list(bg.stream(prompts[i], 24))

    with one_thread():
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert sorted(got) == list(range(8))
    for i, chunks in got.items():
        assert [t for c in chunks for t in c] == want[i]
        assert len(chunks) > 1   # streamed a step at a time, not in one piece


def test_bad_requests_are_refused_in_one_line(tiny):
    model, prompts, _ = tiny
    be = BatchEngine(model, max_batch=2, max_context=64)
    for args, pattern in ((([], 4), "empty prompt"), (([1] * 64, 4), "does not fit the context"),
                          (([1, 2], 0), "at least 1")):
        with pytest.raises(BatchError, match=pattern):
            be.submit(*args)
    with pytest.raises(BatchError, match="max_batch"):
        BatchEngine(model, max_batch=0)
