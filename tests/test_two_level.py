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


def make_drafter(name: str, model):
    """A fresh drafter of `name` over the tiny target."""
    if name == "ngram":
        return NGramDrafter(4, 1, K)
    if name == "block":   # reads target hidden states: fed the first pass's for the second draft
        return BlockDrafter(init_net(model), model, 256, 4)
    if name == "self":    # the target drafting itself
        return DraftModelDrafter(model, 256)
    return DraftModelDrafter(model, 256, num_layers=1)   # "truncated"


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
    steps = []
    for p, ref in zip(prompts, want):
        res = engine.generate(p, 24, make_drafter(drafter, model))
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
    if "tree_budget" in REGISTRY:   # and over a draft tree (tree-verify)
        real_tree, seen = two_level.first_pass_tree, []

        def garbage_tree(*args):
            chain, hidden = real_tree(*args)
            seen.append(len(chain))
            return [(t + 1) % 512 for t in chain], hidden

        monkeypatch.setattr(two_level, "first_pass_tree", garbage_tree)
        engine = _tree_engine(model, True)
        for p, ref in zip(prompts, want):
            assert engine.generate(p, 24, DraftModelDrafter(model, 256)).tokens == ref
        assert seen


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


# -- over a draft tree (tree-verify, option tree_budget) -------------------------------------

def _tree_engine(model, two: bool):
    return _engine(model, two, tree_budget=12)


@pytest.mark.skipif("tree_budget" not in REGISTRY, reason="tree_budget comes with tree-verify")
@pytest.mark.parametrize("drafter", ["self", "truncated", "block"])
def test_over_a_tree_outputs_equal_ar_and_both_passes_see_trees(tiny, drafter, monkeypatch):
    """With tree_budget the first pass walks the draft tree and the exact pass verifies a
    tree whose trunk is the candidate chain: outputs stay AR's."""
    model, prompts, want = tiny
    first, exact = [], []
    real = two_level.first_pass_tree
    monkeypatch.setattr(two_level, "first_pass_tree",
                        lambda m, c, tree, *a: (first.append(len(tree)), real(m, c, tree, *a))[1])
    engine = _tree_engine(model, True)
    verify = engine._verify_tree
    engine._verify_tree = lambda tree, *a: (exact.append(tree), verify(tree, *a))[1]
    steps = []
    for p, ref in zip(prompts, want):
        res = engine.generate(p, 24, make_drafter(drafter, model))
        assert res.tokens == ref
        steps += res.accepted
    assert first and max(first) > K + 1            # first passes over trees wider than a chain
    assert exact and any(not t.is_chain for t in exact)   # and exact passes over trees
    assert max(steps) > 1, steps


def test_the_first_pass_over_a_tree_walks_it_as_each_root_path_alone(tiny):
    """first_pass_tree's candidate chain is the greedy walk through the tree in which each
    node's next token is the 8-bit view's over its root path run alone as a chain."""
    from stock.tree import build

    model, prompts, _ = tiny
    engine = _engine(model, True)
    prompt = prompts[1]
    pending = engine.generate(prompt, 1).tokens[0]
    start = engine.cache.length
    gen = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randperm(512, generator=gen)[:3] for _ in range(5)])
    lp = torch.log_softmax(torch.randn(5, 3, generator=gen), -1).sort(-1, descending=True)[0]
    # make the first pass agree somewhere: the 8-bit view's own next tokens on top
    chain, _ = two_level.first_pass(model, engine.cache, pending, [], start)
    for d in range(5):
        ids[d, 0] = chain[-1]
        chain, _ = two_level.first_pass(model, engine.cache, pending, ids[:d + 1, 0].tolist(),
                                        start)
    ids[2, 0] = (ids[2, 0] + 1) % 512          # the top chain breaks at depth 3
    tree = build(ids, lp, pending, 12, 5)
    assert not tree.is_chain
    got, hidden = two_level.first_pass_tree(model, engine.cache, tree, start, (1,))
    assert engine.cache.length == start and w12_modules(model)[0].view == "w12"
    path = [0]
    while True:   # the reference walk: each step one chain forward over the root path
        toks = [tree.tokens[j] for j in path[1:]]
        nxt = two_level.first_pass(model, engine.cache, pending, toks, start)[0][-1]
        child = [c for c in tree.children()[path[-1]] if tree.tokens[c] == nxt]
        if not child:
            break
        path.append(child[0])
    assert got == [tree.tokens[j] for j in path[1:]] + [nxt]
    assert len(path) >= 3            # the walk left the top chain or went deep
    assert hidden[1].shape[1] == len(path)


@pytest.mark.skipif("tree_budget" not in REGISTRY, reason="tree_budget comes with tree-verify")
def test_the_exact_tree_takes_the_candidate_chain_whole_as_its_trunk():
    from stock.drafters.base import DraftLattice
    from stock.tree import build

    gen = torch.Generator().manual_seed(4)
    more = DraftLattice(torch.randint(0, 512, (4, 3), generator=gen),
                        torch.log_softmax(torch.randn(4, 3, generator=gen), -1)
                        .sort(-1, descending=True)[0])
    candidate = [7, 8, 9, 10, 11]
    lat = two_level.joined(candidate, more)
    tree = build(lat.ids, lat.logprobs, 3, 12, len(lat))
    assert tree.tokens[:1 + len(candidate)] == [3] + candidate
    assert tree.parents[1:1 + len(candidate)] == list(range(len(candidate)))
    assert not tree.is_chain and len(tree) == 12    # the rest branches off the trunk's end
    assert min(tree.depths[1 + len(candidate):]) > len(candidate)


# -- the static path: the first pass in graph slots of its own ------------------------------

@pytest.mark.parametrize("trees", [False, True])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
def test_the_static_path_runs_the_first_pass_in_its_own_slots(tiny, drafter, trees):
    """On the static path (eager here; on CUDA its slots are captured with the 8-bit view
    on and replayed) the first pass runs in a graph runner of its own over the same cache:
    the same tokens and accepted counts as the dynamic first pass, AR's tokens."""
    if trees and "tree_budget" not in REGISTRY:
        pytest.skip("tree_budget comes with tree-verify")
    model, prompts, want = tiny
    extra = {"tree_budget": 12} if trees else {}
    dynamic = _engine(model, True, **extra)
    static = Engine(model, Options({"weights": "w12", "draft_len": K, "two_level": True,
                                    **extra}), 256, static=True, capture=False)
    assert static.runner is not None and dynamic.runner is None
    for p, ref in zip(prompts, want):
        a = dynamic.generate(p, 24, make_drafter(drafter, model))
        b = static.generate(p, 24, make_drafter(drafter, model))
        assert b.tokens == a.tokens == ref
        assert b.accepted == a.accepted
    first = static._first_runner
    assert first is not None and any(s.tree == trees for s in first.slots.values())
    assert w12_modules(model)[0].view == "w12"


def test_the_first_pass_slot_multiplies_by_the_8_bit_view(tiny):
    """first_pass through a runner's chain slot gives the dynamic first pass's candidate and
    hidden states; the same slot run without the 8-bit view gives other hidden states (the
    view is what the slot multiplies by, not the exact planes)."""
    from stock.graphs import GraphRunner

    model, prompts, _ = tiny
    prompt, chain = prompts[1], [5, 6, 7]
    cache = model.new_cache(256 + 64)
    out = model(torch.tensor([prompt]), cache, 0)
    cache.commit(len(prompt))
    pending = int(out.logits[0, -1].argmax())
    runner = GraphRunner(model, cache, 256, capture=False)
    got, hid = two_level.first_pass(model, cache, pending, chain, len(prompt), (1,), runner)
    want, want_hid = two_level.first_pass(model, cache, pending, chain, len(prompt), (1,))
    assert got == want and cache.length == len(prompt)
    torch.testing.assert_close(hid[1], want_hid[1], atol=1e-5, rtol=1e-5)
    exact = runner.step([pending] + chain, len(prompt), (1,)).hidden[1][:, :hid[1].shape[1]]
    assert not torch.allclose(exact, hid[1], atol=1e-4)
