"""Memory entry batch-serving-stack: batched trees (batch-tree-verify) with coalesced
admission (coalesced-admission's change, hand-merged): with both options on, every batched
output is still the request's single-request greedy one (fp32, CPU). Runs where the entry
is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import importlib.util

import pytest

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if not {"admit_min", "tree_budget"} <= set(REGISTRY) or \
        importlib.util.find_spec("stock.batch_tree") is None:
    pytest.skip("batched trees with coalesced admission come with the memory entry "
                "batch-serving-stack", allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402

LENGTHS = [20, 9, 16, 20, 5, 12, 20, 14]


@pytest.mark.parametrize("static,build", [(False, "host"), (True, "device")])
def test_trees_with_coalesced_admission_keep_every_single_request_output(toy, toy_trained,
                                                                         static, build):
    target, prompts, _ = toy
    net = toy_trained[0]
    base = {"draft_len": 3, "block_size": 4}
    want = [Engine(target, Options(base), 256).generate(p, n).tokens
            for p, n in zip(prompts, LENGTHS)]
    be = BatchEngine(target, Options({**base, "tree_budget": 6, "tree_build": build,
                                      "admit_min": 3, "admit_wait": 4}),
                     max_batch=4, max_context=256, static=static, capture=False,
                     batch_drafter=BatchBlockDrafter(net, target, 256, rows=5, static=static,
                                                     capture=False))
    groups, real = [], be._prefill
    be._prefill = lambda reqs: groups.append(len(reqs)) or real(reqs)
    reqs = [be.submit(p, n) for p, n in zip(prompts, LENGTHS)]
    be.run()
    assert [r.tokens for r in reqs] == want
    assert max(groups[1:]) >= 2                       # admissions coalesced
    assert max(a for r in reqs for a in r.accepted) > 1   # drafts accepted through trees
