"""Memory entry admission-stack: coalesced admission (coalesced-admission, its dependency)
with larger graph steps for prefill (prefill-buckets' change, applied onto it): with both
options on, admissions are grouped, each group's prompts prefilled in one graph step a
prompt, and every batched output is still the request's single-request greedy one (fp32,
CPU, the static path run eagerly). Runs where the entry is applied
(tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import pytest
import torch

import stock.batch  # noqa: F401 (registers the batched engine's options)
from stock.options import REGISTRY, Options

if not {"admit_min", "prefill_tokens"} <= set(REGISTRY):
    pytest.skip("coalesced admission with larger prefill steps comes with the memory entry "
                "admission-stack", allow_module_level=True)

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock.batch import BatchEngine  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402

PROMPT_LENS = [200, 9, 130, 70, 5, 250, 64, 65]
NEW = [12, 9, 16, 12, 5, 10, 12, 14]
BASE = {"draft_len": 3, "block_size": 4}


def test_grouped_admissions_in_larger_prefill_steps_keep_every_single_request_output(
        toy, toy_trained):
    target, net = toy[0], toy_trained[0]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]
    with one_thread():
        single = Engine(target, Options(BASE), 512)
        want = [single.generate(p, n).tokens for p, n in zip(prompts, NEW)]
        be = BatchEngine(target, Options({**BASE, "admit_min": 2, "admit_wait": 4,
                                          "prefill_tokens": 256}),
                         max_batch=4, max_context=512, static=True, capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 512, rows=5, static=True,
                                                         capture=False))
        groups, chunks, prefilling = [], [], []
        real_prefill, step = be._prefill, be.runner.step

        def prefill(reqs):
            groups.append(len(reqs))
            prefilling.append(True)
            try:
                return real_prefill(reqs)
            finally:
                prefilling.pop()

        def spy(seqs, starts, rows, chains=None):
            if prefilling:   # a prefill chunk step: its longest chunk
                chunks.append(max(len(s) for s in seqs))
            return step(seqs, starts, rows, chains)

        be._prefill, be.runner.step = prefill, spy
        reqs = [be.submit(p, n) for p, n in zip(prompts, NEW)]
        be.run()
    assert [r.tokens for r in reqs] == want
    assert max(groups[1:]) >= 2                      # admissions coalesced
    assert max(chunks) == 250                        # the 250-token prompt in one graph step
    assert len(chunks) == len(groups)                # every group: one step (prompts <= 256)
