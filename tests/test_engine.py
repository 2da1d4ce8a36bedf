"""The engine: speculative ≡ autoregressive, cache rollback, forcing, lattices, stops."""

from __future__ import annotations

import pytest
import torch

from stock.config import PRESETS
from stock.drafters.draft_model import DraftModelDrafter
from stock.drafters.ngram import NGramDrafter
from stock.drafters.base import DraftContext
from stock.engine import Engine, EngineError
from stock.lattice_log import LatticeRecorder
from stock.model import Transformer
from stock.options import Options
from stock.profile import Profiler
from stock.system import make_drafter

NEW = 32   # new tokens per dev prompt: 8 prompts x 32 keeps CI short


@pytest.fixture(scope="module")
def ar_outputs(ar_32):
    return [t[:NEW] for t in ar_32]   # greedy: the first NEW tokens


# ngram and block against AR on these prompts at 64 tokens: tests/test_greedy_recorded.py
@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["draft"])
def test_speculative_equals_autoregressive(smol, dev_prompts, ar_outputs, drafter):
    # The truncated draft model costs a forward per drafted token and rarely hits on this
    # target: a short draft from 2 layers keeps CI short and still exercises rollback.
    # It gets one prompt of each of four categories.
    opts = Options({"draft_len": 2, "draft_layers": 2} if drafter == "draft" else {})
    engine = Engine(smol.engine.model, opts, 2048, smol.engine.stop_ids)
    pairs = list(zip(dev_prompts, ar_outputs))
    if drafter == "draft":
        pairs = pairs[::2]
    taus = []
    for prompt, want in pairs:
        res = engine.generate(prompt, NEW, make_drafter(drafter, engine))
        assert res.tokens == want
        assert sum(res.accepted) + 1 >= len(res.tokens)  # +1: prefill's token
        taus.append(res.tau)
    assert len(dev_prompts) == 8
    assert max(taus) > 1.0  # the drafter's tokens were accepted somewhere


def test_cache_rollback_then_reforward_gives_fresh_logits():
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(64)
    model(ids[:, :16], cache, 0)
    cache.commit(16)
    junk = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(5))
    model(junk, cache, 16)  # speculative tokens that get rejected
    cache.commit(24)
    cache.rollback(16)
    after = model(ids[:, 16:], cache, 16).logits
    fresh_cache = model.new_cache(64)
    fresh = model(ids, fresh_cache, 0).logits[:, 16:]
    assert torch.allclose(after, fresh, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        cache.rollback(17)


def test_context_overflow_is_an_error():
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    engine = Engine(model, max_context=32)
    with pytest.raises(EngineError, match="does not fit"):
        engine.generate(list(range(1, 40)), 4)
    with pytest.raises(EngineError, match="empty prompt"):
        engine.generate([], 4)
    res = engine.generate(list(range(1, 28)), 50)
    # The cache holds 32 tokens; the last generated token needs no cache slot.
    assert res.stop_reason == "context" and len(res.tokens) == 32 - 27 + 1


def test_stop_token_ends_generation_in_both_modes(smol, dev_prompts, ar_outputs):
    prompt, ref = dev_prompts[0], ar_outputs[0]
    stop = ref[5]
    engine = Engine(smol.engine.model, max_context=1024, stop_ids={stop})
    for drafter in (None, NGramDrafter()):
        res = engine.generate(prompt, NEW, drafter)
        assert res.tokens == ref[: ref.index(stop) + 1]
        assert res.stop_reason == "stop"


def test_forcing_own_output_has_no_mismatch_and_positive_margins(smol, dev_prompts, ar_outputs):
    forced = smol.engine.force(dev_prompts[1], ar_outputs[1])
    assert forced.argmax == ar_outputs[1]
    assert forced.mismatches == []
    assert min(forced.margin) >= 0
    assert len(forced.margin) == len(ar_outputs[1])


def test_forcing_reports_a_changed_token(smol, dev_prompts, ar_outputs):
    ref = list(ar_outputs[1][:40])
    bad = list(ref)
    bad[20] = (bad[20] + 1) % smol.engine.model.cfg.vocab_size
    forced = smol.engine.force(dev_prompts[1], bad)
    assert 20 in forced.mismatches
    assert forced.argmax[:20] == ref[:20]
    assert forced.margin[20] > 0


def test_forcing_chunk_size_does_not_change_choices(smol, dev_prompts, ar_outputs):
    a = smol.engine.force(dev_prompts[2], ar_outputs[2][:48], chunk=1)
    b = smol.engine.force(dev_prompts[2], ar_outputs[2][:48], chunk=16)
    assert a.argmax == b.argmax
    assert max(abs(x - y) for x, y in zip(a.margin, b.margin)) < 1e-3


def test_lattice_log_round_trip(smol, dev_prompts, tmp_path):
    rec = LatticeRecorder(topk=4, meta={"request": "x"})
    res = smol.engine.generate(dev_prompts[0], 48, NGramDrafter(topk=4), recorder=rec)
    smol.engine.generate(dev_prompts[3], 16, NGramDrafter(topk=4), recorder=rec)
    path = tmp_path / "lat.npz"
    rec.save(path)
    back = LatticeRecorder.load(path)
    assert back.meta == {"request": "x"} and back.request_bounds == rec.request_bounds
    assert len(back.steps) == len(rec.steps) > 0
    for a, b in zip(rec.steps, back.steps):
        assert torch.equal(a.lattice.ids, b.lattice.ids)
        assert torch.equal(a.lattice.logprobs, b.lattice.logprobs)
        assert (a.accepted, a.target) == (b.accepted, b.target)
    first = rec.steps[: rec.request_bounds[1]]
    assert [s.accepted + 1 for s in first] == res.accepted


def test_profile_splits_step_time_by_category(smol, dev_prompts):
    prof = Profiler("cpu")
    res = smol.engine.generate(dev_prompts[0], 12, NGramDrafter(), profiler=prof)
    rep = prof.report()
    assert rep["steps"] == res.steps > 0
    assert rep["total_s"]["gemm"] > rep["total_s"]["attention"] > 0
    assert rep["total_s"]["prefill"] > 0
    # The categories partition each step exactly; the report rounds each to 1 µs.
    cats = sum(v for k, v in prof.totals.items() if k != "prefill")
    assert cats == pytest.approx(sum(prof.step_times), rel=1e-9)
    shown = sum(v for k, v in rep["total_s"].items() if k != "prefill")
    assert shown == pytest.approx(cats, abs=1e-6 * len(rep["total_s"]))


def test_ngram_drafter_proposes_what_followed_the_last_match():
    d = NGramDrafter(ngram_max=3, ngram_min=1, topk=2)
    toks = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    lat = d.draft(DraftContext(toks), 4)
    assert lat.chain == [8, 9, 1, 2]
    assert lat.logprobs[0, 0] == 0.0  # one occurrence: certain
    assert d.draft(DraftContext([1, 2, 3]), 4).chain == []


def test_ngram_lattice_ranks_alternatives_by_frequency():
    d = NGramDrafter(ngram_max=1, ngram_min=1, topk=3)
    toks = [4, 1, 4, 2, 4, 2, 4, 3, 4]
    lat = d.draft(DraftContext(toks), 1)
    assert lat.ids[0].tolist() == [3, 2, 1]  # the most recent first, then by count
    assert lat.logprobs[0, 1] > lat.logprobs[0, 2]


def test_draft_model_rollback_matches_a_fresh_drafter():
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7)
    ctx1 = list(range(10, 30))
    ctx2 = ctx1[:12] + [99, 98, 97]
    used = DraftModelDrafter(model, 128, num_layers=1, topk=3)
    used.draft(DraftContext(ctx1), 5)
    again = used.draft(DraftContext(ctx2), 5)
    fresh = DraftModelDrafter(model, 128, num_layers=1, topk=3).draft(DraftContext(ctx2), 5)
    assert torch.equal(again.ids, fresh.ids)
    assert torch.allclose(again.logprobs, fresh.logprobs, atol=1e-5)


def test_a_steps_gain_counts_only_the_tokens_kept():
    """τ is tokens kept per verification step: a last step whose accepted drafts pass
    max_new or a stop token counts only what is kept, in the single-request engine and in
    the batched one. A drafter with every target layer drafts the target's own tokens, so
    every step accepts all of its drafts and the last one passes max_new (it counted a
    token past the end before)."""
    from stock.system import batch_engine

    net = Transformer.random(PRESETS["tiny-qwen3"], seed=3, std=0.1)
    n_layers = net.cfg.num_layers
    opts = Options({"draft_len": 4, "draft_layers": n_layers})
    engine = Engine(net, opts, 128, set())
    prompt = list(range(5, 17))
    full = engine.generate(prompt, 40).tokens
    for max_new in (6, 9, 10, 11):
        res = engine.generate(prompt, max_new, make_drafter("draft", engine))
        assert res.tokens == full[:max_new]
        assert sum(res.accepted) == len(res.tokens) - 1, (max_new, res.accepted)
        assert max(res.accepted) == 5                      # every draft accepted
    stop = full[7]                                         # a stop token inside a step
    stopping = Engine(net, opts, 128, {stop})
    res = stopping.generate(prompt, 40, make_drafter("draft", stopping))
    assert res.tokens == full[:full.index(stop) + 1] and res.stop_reason == "stop"
    assert sum(res.accepted) == len(res.tokens) - 1, res.accepted
    batch = batch_engine(engine, "draft", 2)
    reqs = [batch.submit(prompt, m) for m in (9, 11)]
    batch.run()
    for req, m in zip(reqs, (9, 11)):
        assert req.tokens == full[:m]
        assert sum(req.accepted) == len(req.tokens) - 1, (m, req.accepted)
