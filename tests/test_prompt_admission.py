"""Memory entry prompt-admission (issue "batch mechanisms"): waiting prompts take free rows
and ride, a chunk a step, in the decode batch's verification steps instead of prefilling in
forwards of their own; every output stays its single-request greedy one (fp32, CPU).
Runs where the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import pytest
import torch

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if "admit_chunk" not in REGISTRY:
    pytest.skip("option admit_chunk comes with the memory entry prompt-admission",
                allow_module_level=True)

from block_fixtures import one_thread, random_net, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.drafters.block import BlockDrafter  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    with one_thread():
        model = Transformer.random(PRESETS["tiny-qwen3"], seed=1, std=0.08)
        gen = torch.Generator().manual_seed(0)
        lengths = [5, 17, 9, 30, 3, 12, 44, 8, 21, 6, 14, 27]
        prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in lengths]
        want = [Engine(model, Options({"draft_len": 4}), 256).generate(p, 20).tokens
                for p in prompts]
    return model, prompts, want


def _serve(be, prompts, max_new):
    """Arrivals spread (two a step); counts the forwards that carried both a decoding row
    and a riding prompt, and those that prefilled alone."""
    mixed, alone = [], []
    real = be._run

    def run(seqs, starts, rows):
        riding = sum(1 for r in rows if be.rows[r].filled >= 0)
        (mixed if 0 < riding < len(rows) else alone if riding else []).append(len(rows))
        return real(seqs, starts, rows)

    be._run = run
    reqs = []
    for i, p in enumerate(prompts):
        reqs.append(be.submit(p, max_new))
        if i % 2:
            be.step()
    be.run()
    return reqs, mixed, alone


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("drafter", ["ar", "ngram"])
def test_riding_prompts_keep_every_single_request_output(tiny, drafter, static):
    model, prompts, want = tiny
    factory = {"ar": None, "ngram": lambda: NGramDrafter(4, 1, 4)}[drafter]
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4, "admit_chunk": 8}), max_batch=4,
                         max_context=256, drafter_factory=factory, static=static,
                         capture=False)
        reqs, mixed, _ = _serve(be, prompts, 20)
    assert [r.tokens for r in reqs] == want
    assert len(mixed) > 5 and be.idle           # prompts rode in decode steps


@pytest.mark.parametrize("static", [False, True])
def test_riding_prompts_feed_the_batched_block_drafter(toy, toy_trained, static):
    """Also on the static path (the CUDA graphs', eagerly here), where stock hands the
    decoding rows' drafts to the step on the device and riders follow them, and the
    riders' chunks reach the drafter's context through its fixed-shape update (one graph
    replay on CUDA), never through the eager per-position one."""
    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4, "admit_chunk": 6})
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)) for p in prompts]
    with one_thread():
        bd = BatchBlockDrafter(net, target, 256, rows=4, static=static, capture=False)
        eager, extend = [], bd.extend
        bd.extend = lambda spans: eager.append(len(spans)) or extend(spans)
        be = BatchEngine(target, opts, max_batch=3, max_context=256, static=static,
                         capture=False, batch_drafter=bd)
        reqs, mixed, _ = _serve(be, prompts, 20)
    assert [r.tokens for r in reqs] == [w.tokens for w in want]
    assert [r.accepted for r in reqs] == [w.accepted for w in want]   # the same drafts
    assert mixed and max(max(r.accepted) for r in reqs) > 1
    assert bool(eager) != static   # the dynamic path's update is the eager one


@pytest.mark.parametrize("spare", [False, True])
def test_with_admit_spare_riders_never_widen_the_decoding_rows_step(toy, toy_trained, spare):
    """Static path, block drafts of 3 (decoding rows of 4 tokens: bucket 4), chunks of up to
    6: with admit_spare every mixed step stays in the decoding rows' bucket (riders take 4
    tokens a step), without it riders widen some steps to bucket 8; outputs are the
    single-request ones either way."""
    from stock.graphs import BUCKETS

    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4, "admit_chunk": 6, "admit_spare": spare})
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)).tokens for p in prompts]
    with one_thread():
        be = BatchEngine(target, opts, max_batch=3, max_context=256, static=True,
                         capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=4,
                                                         static=True, capture=False))
        widened, real = [], be._run

        def run(seqs, starts, rows):
            riding = [len(s) for s, r in zip(seqs, rows) if be.rows[r].filled >= 0]
            decoding = [len(s) for s, r in zip(seqs, rows) if be.rows[r].filled < 0]
            if riding and decoding:
                def bucket(n):
                    return next(b for b in BUCKETS if b >= n)
                widened.append(bucket(max(riding)) > bucket(max(decoding)))
            return real(seqs, starts, rows)

        be._run = run
        reqs = []
        for i, p in enumerate(prompts):
            reqs.append(be.submit(p, 20))
            if i % 2:
                be.step()
        be.run()
    assert [r.tokens for r in reqs] == want
    assert len(widened) > 3 and any(widened) != spare


def test_the_default_prefills_apart_as_stock_does(tiny):
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256)
        reqs, mixed, alone = _serve(be, prompts[:6], 20)
    assert [r.tokens for r in reqs] == [w for w in want[:6]]
    assert not mixed and not alone and all(r.filled == -1 for r in reqs)
