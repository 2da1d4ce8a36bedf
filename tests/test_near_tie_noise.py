"""The near-tie's width from stock's own noise, and what a request is charged past one.

In bf16 stock's own kernels move logit margins by units in the last place when only a
step's shape changes; the reference's noise pass measures it and widens the near-tie
(outputs.tolerance). Past a tolerated near-tie a request is charged only the share of each
run that the check kept, so steering a near-tie towards text served faster buys nothing.
"""

import torch

from specpilot.judges.outputs import Expected, OutputCheck, check_request, tolerance
from specpilot.judges.worker_main import reference_pass, speculative_engine
from stock.config import PRESETS
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options


def _exp(tokens, margins, noise=(), flips=()):
    return Expected(request_id="r", prompt_ids=[1, 2], max_new=len(tokens), tokens=tokens,
                    margins=margins, stop_reason="length", noise=list(noise),
                    noise_flips=list(flips))


def test_the_near_tie_widens_to_stocks_own_noise_and_only_then():
    quiet = _exp([1, 2, 3, 4], [1.0] * 4)
    t = tolerance([quiet], 0.05, 0.01, 2.0)
    assert (t.epsilon, t.rate, t.widened) == (0.05, 0.01, False)   # fp32: no noise pass
    noisy = _exp([1, 2, 3, 4], [1.0] * 4, noise=[0.0, 0.125, 0.25, 0.0625], flips=[2])
    t = tolerance([quiet, noisy], 0.05, 0.01, 2.0)
    assert t.widened and t.epsilon == 0.5 and t.rate == 0.5       # 2 x 0.25; 2 x 1 flip / 4
    assert "0.250" in t.describe() and "25.0%" in t.describe()
    assert tolerance([noisy], 0.05, 0.01, 0.0).epsilon == 0.05     # noise_factor 0: as set
    assert tolerance([noisy], 0.9, 0.9, 2.0).epsilon == 0.9        # never narrower than set


def test_a_divergence_beyond_the_widened_near_tie_is_still_a_fault():
    exp = _exp([5, 6, 7, 8], [1.0, 0.3, 0.6, 1.0], noise=[0.0, 0.1, 0.15, 0.0])
    tol = tolerance([exp], 0.05, 0.5, 2.0)                          # epsilon 0.3
    inside, outside = OutputCheck(side="B"), OutputCheck(side="B")
    check_request(inside, exp, [5, 9, 9, 9], lambda ids, n: ([7, 8], 0.1), tol.epsilon, 4)
    check_request(outside, exp, [5, 6, 9, 9], lambda ids, n: ([8], 0.1), tol.epsilon, 4)
    assert inside.ok and len(inside.near_ties) == 1
    assert outside.faults and "margin 0.600 > near-tie 0.3" in outside.faults[0]


def test_past_a_near_tie_the_request_is_charged_the_kept_share_of_each_run():
    """A candidate steers the near-tie at token 1 into text it serves in no time: the timed
    run is charged 2 of its 8 tokens' share, and stock's text from token 2 on is timed by
    the continuation (which itself diverges at a near-tie at token 5: 4 of its 6 tokens)."""
    exp = _exp([5, 6, 7, 8, 9, 10, 11, 12], [1.0, 0.01, 1.0, 1.0, 1.0, 0.02, 1.0, 1.0])
    runs = {4: ([7, 8, 9, 0, 0, 0], 6.0), 8: ([11, 12], 1.0)}

    def rerun(ids, n):
        return runs[len(ids)]
    check = OutputCheck(side="B")
    share, extra = check_request(check, exp, [5, 0, 0, 0, 0, 0, 0, 0], rerun, 0.05, 4)
    assert check.ok and check.restarts == 2
    assert share == 2 / 8 and extra == 6.0 * 4 / 6 + 1.0
    assert check.continuation_s == {"r": extra}
    clean = OutputCheck(side="B")
    assert check_request(clean, exp, exp.tokens, rerun, 0.05, 4) == (1.0, 0.0)


def _engine(dtype):
    torch.manual_seed(0)
    net = Transformer.random(PRESETS["tiny-qwen3"], torch.device("cpu"), dtype)
    return Engine(net, Options({}), 256, set())


def test_the_reference_measures_stocks_noise_in_bf16_and_skips_it_in_fp32():
    ids = list(range(3, 11))
    fp32 = reference_pass(_engine(torch.float32), ids, 12, 4, 5)
    assert fp32["noise"] == [] and fp32["noise_flips"] == []
    bf16 = reference_pass(_engine(torch.bfloat16), ids, 12, 4, 5)
    n = len(bf16["tokens"])
    assert n == 12 and len(bf16["noise"]) == n and all(x >= 0 for x in bf16["noise"])
    assert all(0 <= i < n for i in bf16["noise_flips"])
    forced = reference_pass(_engine(torch.float32), ids, 12, 4, 5, noise=True)
    assert len(forced["noise"]) == 12 and max(forced["noise"]) < 1e-3   # fp32: ~1e-6


def test_the_reference_engine_is_made_once_and_serves_every_request_as_a_fresh_one_would():
    """The speculative engine behind a worker's references is kept across requests (its
    CUDA graphs captured once, not once a request), shares the worker's cache buffer, and
    leaves nothing of one request in the next: each reference equals a fresh worker's."""
    first, second = list(range(3, 11)), list(range(20, 31))
    worker = _engine(torch.float32)
    a = reference_pass(worker, first, 12, 4, 5)
    spec = speculative_engine(worker, 4)
    b = reference_pass(worker, second, 12, 4, 5)
    assert speculative_engine(worker, 4) is spec and spec.cache is worker.cache
    assert speculative_engine(worker, 6) is not spec                   # one per draft length
    assert speculative_engine(_engine(torch.float32), 4) is not spec   # one per engine
    for ids, got in ((first, a), (second, b)):
        fresh = reference_pass(_engine(torch.float32), ids, 12, 4, 5)
        assert (got["tokens"], got["argmax"], got["digests"]) == \
            (fresh["tokens"], fresh["argmax"], fresh["digests"])
    assert set(b["seconds"]) == {"generate", "forced"}                 # fp32: no noise pass
