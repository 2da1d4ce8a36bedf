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


def test_riding_prompts_feed_the_batched_block_drafter(toy, toy_trained):
    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4, "admit_chunk": 6})
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)) for p in prompts]
    with one_thread():
        be = BatchEngine(target, opts, max_batch=3, max_context=256,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=4))
        reqs, mixed, _ = _serve(be, prompts, 20)
    assert [r.tokens for r in reqs] == [w.tokens for w in want]
    assert [r.accepted for r in reqs] == [w.accepted for w in want]   # the same drafts
    assert mixed and max(max(r.accepted) for r in reqs) > 1


def test_the_default_prefills_apart_as_stock_does(tiny):
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 4}), max_batch=4, max_context=256)
        reqs, mixed, alone = _serve(be, prompts[:6], 20)
    assert [r.tokens for r in reqs] == [w for w in want[:6]]
    assert not mixed and not alone and all(r.filled == -1 for r in reqs)
