"""Memory entry dynamic-draft-length (issue "batch mechanisms"): each batched step drafts the
length that maximises expected tokens per second, from each request's acceptance and the
engine's own step timings; outputs stay every request's single-request greedy ones (fp32,
CPU). Runs where the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import pytest
import torch

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if "dynamic_draft" not in REGISTRY:
    pytest.skip("option dynamic_draft comes with the memory entry dynamic-draft-length",
                allow_module_level=True)

from block_fixtures import one_thread  # noqa: E402
from stock.batch import BatchEngine, Request  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    with one_thread():
        model = Transformer.random(PRESETS["tiny-qwen3"], seed=1, std=0.08)
        gen = torch.Generator().manual_seed(0)
        motif = torch.randint(1, 512, (4,), generator=gen).tolist()
        prompts = [(motif * 12)[:n] if i % 2 == 0 else
                   torch.randint(1, 512, (n,), generator=gen).tolist()
                   for i, n in enumerate([5, 17, 9, 30, 3, 12, 44, 8])]
        want = [Engine(model, Options({"draft_len": 8}), 256).generate(p, 24).tokens
                for p in prompts]
    return model, prompts, want


@pytest.mark.parametrize("static", [False, True])
def test_dynamic_lengths_keep_every_single_request_output(tiny, static):
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 8, "dynamic_draft": True}), max_batch=4,
                         max_context=256, drafter_factory=lambda: NGramDrafter(4, 1, 4),
                         static=static, capture=False)
        reqs = [be.submit(p, 24) for p in prompts]
        be.run()
    assert [r.tokens for r in reqs] == want
    assert set(be.chosen) >= {4, 6, 8}      # every length was tried, then chosen by rate
    assert be.step_s and all(s > 0 for s in be.step_s.values())


def _req(hits, misses):
    r = Request([1], 8)
    r.hits, r.misses = hits, misses
    return r


def test_the_length_follows_acceptance_and_measured_step_cost(tiny):
    model, _, _ = tiny
    be = BatchEngine(model, Options({"draft_len": 8, "dynamic_draft": True}), max_batch=2,
                     max_context=64)
    assert be._best_length([_req(0, 0)] * 2, 8) == 4          # unmeasured: shortest first
    be.step_s = {(2, 5): 1.0, (2, 7): 1.0, (2, 9): 1.0}        # flat cost (weight-bound)
    assert be._best_length([_req(20, 0)] * 2, 8) == 8          # accepted: draft long
    be.step_s = {(2, 5): 1.0, (2, 7): 1.6, (2, 9): 2.2}        # cost grows with tokens
    assert be._best_length([_req(0, 10)] * 2, 8) == 4          # rejected: draft short
    assert be._best_length([_req(40, 0)] * 2, 8) == 4          # 9 tokens / 2.2 < 5 / 1.0


def test_off_by_default_every_step_drafts_draft_len(tiny):
    model, prompts, want = tiny
    with one_thread():
        be = BatchEngine(model, Options({"draft_len": 8}), max_batch=4, max_context=256,
                         drafter_factory=lambda: NGramDrafter(4, 1, 4))
        reqs = [be.submit(p, 24) for p in prompts[:4]]
        be.run()
    assert [r.tokens for r in reqs] == want[:4] and not be.chosen and not be.step_s
