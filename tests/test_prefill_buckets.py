"""Memory entry prefill-buckets (issue "batched serving": the decode batch stops for every
admission's prefill): with prefill_tokens = n the batched engine's graph steps take tokens
buckets past 64 up to n, so a prompt of up to n tokens is prefilled in one graph step
instead of one per 64 tokens; every output stays the request's single-request greedy one
(fp32, CPU, the static path run eagerly). Runs where the entry is applied
(tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import math

import pytest
import torch

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, OptionError, Options

if "prefill_tokens" not in REGISTRY:
    pytest.skip("option prefill_tokens comes with the memory entry prefill-buckets",
                allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402

# past one, two and four chunks of 64, and exactly one
PROMPT_LENS = [200, 9, 130, 70, 5, 250, 64, 65]
NEW = [12, 9, 16, 12, 5, 10, 12, 14]
BASE = {"draft_len": 3, "block_size": 4}


@pytest.fixture(scope="module")
def long_prompts(toy):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _serve(target, prompts, opts: dict, drafter: str, net=None):
    """The prompts through 4 rows on the static path (eager): (outputs, the tokens of each
    prefill chunk step, the engine)."""
    kw = {}
    if drafter == "block":
        kw["batch_drafter"] = BatchBlockDrafter(net, target, 512, rows=5, static=True,
                                                capture=False)
    elif drafter == "ngram":
        kw["drafter_factory"] = lambda: NGramDrafter(3, 1, 4)
    with one_thread():
        be = BatchEngine(target, Options({**BASE, **opts}), max_batch=4, max_context=512,
                         static=True, capture=False, **kw)
        chunks, real = [], be._prefill_rows
        step = be.runner.step

        def spy(seqs, starts, rows, chains=None):
            if prefilling:
                chunks.append(max(len(s) for s in seqs))
            return step(seqs, starts, rows, chains)

        def prefill(reqs, graphed):
            nonlocal prefilling
            prefilling = True
            try:
                return real(reqs, graphed)
            finally:
                prefilling = False

        prefilling = False
        be.runner.step, be._prefill_rows = spy, prefill
        reqs = [be.submit(p, n) for p, n in zip(prompts, NEW)]
        be.run()
    return [r.tokens for r in reqs], chunks, be


@pytest.mark.parametrize("drafter", ["ar", "ngram", "block"])
def test_larger_prefill_steps_keep_every_single_request_output(toy, toy_trained,
                                                               long_prompts, drafter):
    """prefill_tokens 256: the same outputs as the single-request engine and as stock's
    64-token chunks, every prompt in one graph step (stock: one per 64 tokens)."""
    target, net = toy[0], toy_trained[0]
    with one_thread():
        single = Engine(target, Options(BASE), 512)
        want = [single.generate(p, n).tokens for p, n in zip(long_prompts, NEW)]
    stock_out, stock_chunks, _ = _serve(target, long_prompts, {}, drafter, net)
    out, chunks, be = _serve(target, long_prompts, {"prefill_tokens": 256}, drafter, net)
    assert stock_out == want and out == want
    assert max(stock_chunks) == 64 and max(chunks) == 250
    # stock's chunk steps: one per 64 tokens of the longest prompt admitted together
    assert len(chunks) < len(stock_chunks)
    assert be.runner.buckets[-1] == 256 and be.cache.max_len >= 512 + 256


def test_prepare_makes_the_larger_steps_and_128_stops_there(toy):
    target = toy[0]
    with one_thread():
        for opts, top in (({}, 64), ({"prefill_tokens": 128}, 128),
                          ({"prefill_tokens": 256}, 256)):
            be = BatchEngine(target, Options({**BASE, **opts}), max_batch=2, max_context=300,
                             static=True, capture=False)
            be.prepare(300)
            ts = {t for _b, t, _kv in be.runner.slots}
            assert max(ts) == top and ts >= {1, 2, 4, 64}, (opts, sorted(ts))
            assert all(t & (t - 1) == 0 for t in ts)   # powers of two only
            assert math.log2(top) - 6 == sum(t > 64 for t in ts)


def test_prefill_tokens_takes_only_its_buckets():
    with pytest.raises(OptionError, match="prefill_tokens"):
        Options({"prefill_tokens": 100})
    assert Options({})["prefill_tokens"] == 64   # stock
