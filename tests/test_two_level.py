"""Two-level verification (entry `two-level`, option two_level with weights=w12): outputs
equal the exact target's greedy ones whatever the 8-bit first pass proposes (fp32 on the
CPU, the 8-bit view decoded exactly in PyTorch), exact steps accept past the drafter's
length, and what it cannot run is a one-line error."""

from __future__ import annotations

import pytest
import torch

from stock.options import REGISTRY, Options

if "two_level" not in REGISTRY:
    pytest.skip("option two_level comes with the memory entry two-level", allow_module_level=True)

from stock import two_level  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.drafters.block import BlockConfig, BlockDrafter, BlockNet  # noqa: E402
from stock.drafters.draft_model import DraftModelDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.errors import StockError  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.w12_linear import w12_modules  # noqa: E402

K = 4


def target():
    return Transformer.random(PRESETS["tiny-qwen3"], seed=1, std=0.08)


def init_net(model) -> BlockNet:
    """A block drafter initialised from the target's own layers (a random one is never
    right), taken from a copy built before the W12 conversion: drafts sometimes accepted."""
    cfg = BlockConfig.for_target(model.cfg, num_layers=1, block_size=K)
    return BlockNet(cfg).init_from_target(target())


def _engine(model, two: bool, **extra):
    return Engine(model, Options({"weights": "w12", "draft_len": K, "two_level": two, **extra}),
                  256)


@pytest.fixture(scope="module")
def tiny():
    """A tiny random target as W12 (its fp32 weights rounded to bf16), its AR outputs, and
    prompts with repeats (so the n-gram drafter has something to propose)."""
    model = target()
    engine = _engine(model, False)
    gen = torch.Generator().manual_seed(0)
    motif = torch.randint(1, 512, (4,), generator=gen).tolist()
    prompts = [(motif * 8)[:n] if i % 2 == 0 else torch.randint(1, 512, (n,), generator=gen).tolist()
               for i, n in enumerate([9, 14, 23, 6, 31, 12])]
    want = [engine.generate(p, 24).tokens for p in prompts]
    return model, prompts, want


@pytest.mark.parametrize("drafter", ["ngram", "self", "truncated", "block"])
def test_two_level_outputs_equal_ar_and_exact_steps_reach_past_the_draft(tiny, drafter):
    model, prompts, want = tiny
    engine = _engine(model, True)
    make = {"ngram": lambda: NGramDrafter(4, 1, K),
            # reads target hidden states: fed the first pass's for the second draft
            "block": lambda: BlockDrafter(init_net(model), model, 256, 4),
            "self": lambda: DraftModelDrafter(model, 256),   # the target drafting itself
            "truncated": lambda: DraftModelDrafter(model, 256, num_layers=1)}[drafter]
    steps = []
    for p, ref in zip(prompts, want):
        res = engine.generate(p, 24, make())
        assert res.tokens == ref
        steps += res.accepted
    # an exact step accepts at most K + 1 tokens with one draft of K; more came only from
    # the first pass's candidate chain and the second draft after it. The truncated draft
    # model (1 of its layers) is mostly wrong at once: there the 8-bit pass's own next
    # token, right most of the time, makes most exact steps accept at least 2
    if drafter in ("truncated", "block"):
        assert sum(a >= 2 for a in steps) > len(steps) // 2, steps
    else:
        assert max(steps) > K + 1, steps


def test_a_first_pass_that_proposes_garbage_changes_no_output(tiny, monkeypatch):
    """The exact pass alone accepts: a first pass whose candidate chain is wrong from its
    first token (every id shifted by one) leaves every output as it was."""
    model, prompts, want = tiny
    real = two_level.first_pass

    def garbage(*args):
        chain, hidden = real(*args)
        return [(t + 1) % 512 for t in chain], hidden

    monkeypatch.setattr(two_level, "first_pass", garbage)
    engine = _engine(model, True)
    for p, ref in zip(prompts, want):
        assert engine.generate(p, 24, NGramDrafter(4, 1, K)).tokens == ref


def test_the_first_pass_multiplies_by_the_8_bit_view_and_commits_nothing(tiny):
    model, prompts, _ = tiny
    engine = _engine(model, True)
    prompt, chain = prompts[1], [5, 6, 7]
    pending = engine.generate(prompt, 1).tokens[0]   # the prompt committed, its next token
    length = engine.cache.length
    got, hidden = two_level.first_pass(model, engine.cache, pending, chain, length, (1,))
    assert engine.cache.length == length and w12_modules(model)[0].view == "w12"
    # the reference: the committed context through the exact planes, the step through the
    # 8-bit view (which changes the logits: it is not the exact pass)
    cache = model.new_cache(256)
    model(torch.tensor([prompt]), cache, 0, logits="none")
    cache.commit(len(prompt))
    ids = torch.tensor([[pending] + chain])
    exact = model(ids, cache, len(prompt)).logits[0]
    two_level.set_view(model, "w8")
    try:
        out8 = model(ids, cache, len(prompt), hidden_layers=(1,))
        view8 = out8.logits[0]
    finally:
        two_level.set_view(model, "w12")
    assert not torch.equal(view8, exact)
    walk = view8.argmax(-1).tolist()
    m = next((i for i, t in enumerate(chain) if t != walk[i]), len(chain))
    assert got == chain[:m] + [walk[m]]
    # the hidden states a block drafter is fed: [pending] + the agreed drafts, 8-bit view's
    assert torch.equal(hidden[1], out8.hidden[1][:, :m + 1])


def test_what_two_level_cannot_run_is_a_one_line_error(tiny):
    model, _, _ = tiny
    with pytest.raises(StockError, match="two_level needs weights=w12") as err:
        Engine(model, Options({"two_level": True}), 64)
    assert "\n" not in str(err.value)
