"""Memory entry batch-mechanisms (issue "batch mechanisms"): the three batched-engine
entries stacked (prompt-admission, dynamic-draft-length, shared-node-budget, merged by
hand where all three patch stock/batch.py). With every option on at once, in one batch,
each request's output is still its single-request greedy one (fp32, CPU), and the
mechanisms still act: prompts ride in verification steps and the draft length changes
(the budget's own allocation: tests/test_node_budget.py). Runs where the stack is applied
(tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import pytest

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if not {"admit_chunk", "dynamic_draft", "node_budget"} <= set(REGISTRY):
    pytest.skip("the stacked options come with the memory entry batch-mechanisms",
                allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.drafters.block import BlockDrafter  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402

STACK = {"admit_chunk": 8, "dynamic_draft": True, "node_budget": 5}


@pytest.mark.parametrize("drafter,static", [("block", False), ("ngram", False),
                                            ("block", True)])
def test_the_three_mechanisms_at_once_keep_every_single_request_output(toy, toy_trained,
                                                                       drafter, static):
    """Also on the static path (the CUDA graphs', eagerly here), where stock hands the block
    drafter's chains to the verify step on the device and the budget needs them on the
    host."""
    target, prompts, _ = toy
    net = toy_trained[0]
    base = {"draft_len": 3, "block_size": 4}
    single = Engine(target, Options(base), 256)
    make = (lambda: BlockDrafter(net, target, 256)) if drafter == "block" else \
        (lambda: NGramDrafter(4, 1, 4))
    want = [single.generate(p, 20, make()).tokens for p in prompts]
    kw = ({"batch_drafter": BatchBlockDrafter(net, target, 256, rows=4, static=static,
                                              capture=False)} if drafter == "block"
          else {"drafter_factory": make})
    with one_thread():
        be = BatchEngine(target, Options({**base, **STACK}), max_batch=3, max_context=256,
                         static=static, capture=False, **kw)
        drafted, rode, real = [], [], be._run
        riding = be._verify_riding

        def run(seqs, starts, rows):
            drafted.append(sum(len(s) - 1 for s in seqs))
            return real(seqs, starts, rows)

        be._run = run
        be._verify_riding = lambda live, riders: (rode.append(len(riders)),
                                                  riding(live, riders))[1]
        reqs = []
        for i, p in enumerate(prompts):          # arrivals spread: one request a step
            reqs.append(be.submit(p, 20))
            be.step()
        be.run()
    assert [r.tokens for r in reqs] == want
    assert rode                                   # prompts rode in verification steps
    assert len(set(be.chosen)) > 1                # the draft length changed
    assert max(max(r.accepted) for r in reqs) > 1


def test_the_three_mechanisms_on_a_hybrid_target_keep_every_single_request_output():
    """A hybrid GDN target with every option on: riding prompts and decode rows keep their
    recurrent states (HybridCache.commit_rows) as in steps of their own."""
    import torch

    from stock.config import PRESETS
    from stock.model import Transformer

    with one_thread():
        model = Transformer.random(PRESETS["tiny-hybrid"], seed=4, std=0.08)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(1, 512, (n,), generator=gen).tolist()
                   for n in (5, 17, 9, 30, 3, 12, 21, 6)]
        want = [Engine(model, Options({"draft_len": 4}), 256).generate(p, 16).tokens
                for p in prompts]
        be = BatchEngine(model, Options({"draft_len": 4, **STACK}), max_batch=3,
                         max_context=256, drafter_factory=lambda: NGramDrafter(4, 1, 4))
        rode, riding = [], be._verify_riding
        be._verify_riding = lambda live, riders: (rode.append(len(riders)),
                                                  riding(live, riders))[1]
        reqs = []
        for p in prompts:
            reqs.append(be.submit(p, 16))
            be.step()
        be.run()
    assert [r.tokens for r in reqs] == want
    assert rode
