"""Memory entry coalesced-admission (issue "batch mechanisms": admission that stops the
decode batch less often): with admit_min the batched engine admits waiting requests once
that many rows are free, at most admit_wait steps late, so their prompts are prefilled
together; every output stays the request's single-request greedy one (fp32, CPU). Runs
where the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import pytest

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if "admit_min" not in REGISTRY:
    pytest.skip("option admit_min comes with the memory entry coalesced-admission",
                allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402

LENGTHS = [20, 9, 16, 20, 5, 12, 20, 14]


def _serve(target, prompts, net, opts: dict, static: bool):
    """The 8 prompts through 4 rows; (outputs, [admitted per prefill], [steps held per
    admission after a row freed], the engine)."""
    base = {"draft_len": 3, "block_size": 4}
    be = BatchEngine(target, Options({**base, **opts}), max_batch=4, max_context=256,
                     static=static, capture=False,
                     batch_drafter=BatchBlockDrafter(net, target, 256, rows=5, static=static,
                                                     capture=False))
    groups, real = [], be._prefill
    be._prefill = lambda reqs: groups.append(len(reqs)) or real(reqs)
    reqs = [be.submit(p, n) for p, n in zip(prompts, LENGTHS)]
    waited, free_since, step = [], None, 0
    while not be.idle:
        if free_since is None and None in be.rows and be.waiting:
            free_since = step   # a row is free and a request waits, from this step on
        before = len(be.waiting)
        be.step()
        if len(be.waiting) < before:   # admitted at this step
            if free_since is not None:
                waited.append(step - free_since)
            free_since = None
        step += 1
    return [r.tokens for r in reqs], groups, waited, be


@pytest.mark.parametrize("static", [False, True])
def test_coalesced_admission_keeps_every_single_request_output(toy, toy_trained, static):
    """admit_min 3: the same outputs as the single-request engine, prompts prefilled in
    larger groups than stock's (which admits one at a time as rows free), and no request
    held more than admit_wait steps after a row freed for it."""
    target, prompts, _ = toy
    net = toy_trained[0]
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, n).tokens for p, n in zip(prompts, LENGTHS)]
    stock_out, stock_groups, _, _ = _serve(target, prompts, net, {}, static)
    out, groups, waited, _ = _serve(target, prompts, net, {"admit_min": 3, "admit_wait": 4},
                                    static)
    assert stock_out == want and out == want
    assert sum(groups) == sum(stock_groups) == len(prompts)
    later = groups[1:]   # after the first fill of all rows
    assert max(later) >= 2 and len(groups) < len(stock_groups)
    assert waited and max(waited) <= 4


def test_admit_wait_zero_and_admit_min_one_are_stock(toy, toy_trained):
    target, prompts, _ = toy
    net = toy_trained[0]
    _, stock_groups, _, _ = _serve(target, prompts, net, {}, False)
    for opts in ({"admit_min": 1}, {"admit_min": 4, "admit_wait": 0}):
        _, groups, _, _ = _serve(target, prompts, net, opts, False)
        assert groups == stock_groups


def test_per_request_drafters_and_ar_rows_too(toy):
    target, prompts, _ = toy
    want = [Engine(target, Options({"draft_len": 4}), 256).generate(p, 16).tokens
            for p in prompts]
    for factory in (lambda: NGramDrafter(4, 1, 4), None):
        be = BatchEngine(target, Options({"draft_len": 4, "admit_min": 2, "admit_wait": 3}),
                         max_batch=3, max_context=256, drafter_factory=factory)
        reqs = [be.submit(p, 16) for p in prompts]
        be.run()
        assert [r.tokens for r in reqs] == want
