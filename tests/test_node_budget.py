"""Memory entry shared-node-budget (issue "batch mechanisms"): one budget of draft tokens per
batched step, given to the drafted positions with the highest path probability across
requests; outputs stay every request's single-request greedy ones (fp32, CPU). Runs where
the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import math

import pytest
import torch

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if "node_budget" not in REGISTRY:
    pytest.skip("option node_budget comes with the memory entry shared-node-budget",
                allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine, shared_budget  # noqa: E402
from stock.drafters.base import DraftLattice  # noqa: E402
from stock.drafters.block import BlockDrafter  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402


def _lat(*probs):
    lp = torch.tensor([[math.log(p)] for p in probs])
    return DraftLattice(torch.arange(len(probs))[:, None], lp)


def test_the_budget_goes_to_the_most_probable_paths_across_requests():
    sure, unsure = _lat(0.9, 0.9, 0.9, 0.9), _lat(0.5, 0.9, 0.9, 0.9)
    # paths: sure 0.9, 0.81, 0.73, 0.66; unsure 0.5, 0.45, ...
    assert shared_budget([sure, unsure], [4, 4], 5) == [4, 1]
    assert shared_budget([sure, unsure], [2, 4], 5) == [2, 3]      # capped: the rest moves
    assert shared_budget([sure, unsure], [4, 4], 0) == [0, 0]
    flat = _lat(1.0, 1.0, 1.0)                                     # ties: shallow first
    assert shared_budget([flat, flat, flat], [3, 3, 3], 4) == [2, 1, 1]


def _per_position(lattices, ks, budget):
    """The allocation by its definition, one candidate position at a time (the entry's
    first code): sort (-cumulative log-prob, depth, request), take the first `budget`."""
    cands = []
    for i, (lat, k) in enumerate(zip(lattices, ks)):
        cum = 0.0
        for j in range(k):
            cum += float(lat.logprobs[j, 0])
            cands.append((-cum, j, i))
    take = [0] * len(ks)
    for _, _, i in sorted(cands)[:budget]:
        take[i] += 1
    return take


@pytest.mark.parametrize("seed", range(6))
def test_the_array_allocation_equals_the_per_position_one(seed):
    """Random lattices of 32 requests, log-probs on a coarse grid (many exact ties across
    requests and depths), capped lengths including 0, budgets from 0 past the total."""
    gen = torch.Generator().manual_seed(seed)
    lattices, ks = [], []
    for _ in range(32):
        n = int(torch.randint(1, 16, (1,), generator=gen))
        lp = -torch.randint(0, 4, (n, 4), generator=gen).float() / 8
        lattices.append(DraftLattice(torch.zeros(n, 4, dtype=torch.long), lp))
        ks.append(int(torch.randint(0, n + 1, (1,), generator=gen)))
    for budget in (0, 1, 7, 96, 200, 1000):
        assert shared_budget(lattices, ks, budget) == _per_position(lattices, ks, budget)


@pytest.mark.parametrize("static", [False, True])
def test_a_shared_budget_keeps_every_single_request_output(toy, toy_trained, static):
    """The dynamic path, and the static one (the CUDA graphs', eagerly here), where stock
    hands the block drafter's chains to the verify step on the device: with a budget the
    lattices come to the host and the budget holds there too."""
    target, prompts, _ = toy
    net = toy_trained[0]
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)).tokens for p in prompts]
    with one_thread():
        be = BatchEngine(target, Options({"draft_len": 3, "block_size": 4, "node_budget": 4}),
                         max_batch=3, max_context=256, static=static, capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=4,
                                                         static=static, capture=False))
        drafted, real = [], be._run
        be._run = lambda seqs, starts, rows: drafted.append(sum(len(s) - 1 for s in seqs)) \
            or real(seqs, starts, rows)
        reqs = [be.submit(p, 20) for p in prompts]
        be.run()
    assert [r.tokens for r in reqs] == want
    assert max(drafted) == 4 and max(max(r.accepted) for r in reqs) > 1


def test_per_request_drafters_share_it_too(toy):
    target, prompts, _ = toy
    want = [Engine(target, Options({"draft_len": 4}), 256).generate(p, 16).tokens
            for p in prompts]
    with one_thread():
        be = BatchEngine(target, Options({"draft_len": 4, "node_budget": 3}), max_batch=4,
                         max_context=256, drafter_factory=lambda: NGramDrafter(4, 1, 4))
        reqs = [be.submit(p, 16) for p in prompts]
        be.run()
    assert [r.tokens for r in reqs] == want
