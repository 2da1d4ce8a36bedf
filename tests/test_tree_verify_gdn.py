"""Memory entry tree-verify-gdn: best-first draft trees on hybrid GDN targets. The tree
forms of the delta rule and the short conv against per-path oracles, each node's logits in
a tree step against its root path run alone as a chain, and speculative greedy output over
trees equal to AR output (fp32, CPU).

Runs where the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

import pytest
import torch

from stock.options import REGISTRY, Options

if "tree_budget" not in REGISTRY:
    pytest.skip("option tree_budget comes with the memory entries tree-verify and "
                "tree-verify-gdn", allow_module_level=True)

from kernels.gdn import chunk_reference, causal_conv_reference  # noqa: E402
from kernels.gdn.tree import (root_paths, tree_conv_reference, tree_recurrent_reference,  # noqa: E402
                              tree_wy_reference)
from stock.config import PRESETS  # noqa: E402
from stock.drafters.draft_model import DraftModelDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.tree import ancestors, visibility  # noqa: E402

TINY = PRESETS["tiny-hybrid"]
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 0, 10]


def _rule_inputs(n, seed=0, b=2, hk=2, hv=4, d=8):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, n, hk, d, generator=gen) for _ in range(2))
    return (q, k, torch.randn(b, n, hv, d, generator=gen), -torch.rand(b, n, hv, generator=gen),
            torch.rand(b, n, hv, generator=gen), 0.1 * torch.randn(b, hv, d, d, generator=gen))


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def test_ancestor_masked_wy_form_equals_each_nodes_root_path_recurrence():
    q, k, v, g, beta, s0 = _rule_inputs(len(PARENTS))
    want = tree_recurrent_reference(q, k, v, g, beta, PARENTS, s0)
    assert _rel(tree_wy_reference(q, k, v, g, beta, PARENTS, s0), want) <= 1e-5
    chain = list(range(-1, len(PARENTS) - 1))   # a chain: the chunked delta rule
    got = tree_wy_reference(q, k, v, g, beta, chain, s0)
    assert _rel(got, chunk_reference(q, k, v, g, beta, s0)[0]) <= 1e-5
    # cross-branch terms vanish: changing a node leaves every node off its subtree alone
    v2 = v.clone()
    v2[:, 2] += 1.0
    moved = (tree_wy_reference(q, k, v2, g, beta, PARENTS, s0)
             - tree_wy_reference(q, k, v, g, beta, PARENTS, s0)).abs().amax(dim=(0, 2, 3))
    subtree = {i for i, p in enumerate(root_paths(PARENTS)) if 2 in p}
    assert all((moved[i] > 0) == (i in subtree) for i in range(len(PARENTS)))


def test_tree_conv_reads_each_nodes_ancestors_then_the_committed_window():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, len(PARENTS), 6, generator=gen), torch.randn(6, 4, generator=gen)
    window = torch.randn(2, 6, 3, generator=gen)
    out = tree_conv_reference(x, window, w, PARENTS)
    for i, path in enumerate(root_paths(PARENTS)):
        want = causal_conv_reference(x[:, path], window, w)[:, -1]
        assert torch.allclose(out[:, i], want, atol=1e-6), i


def test_each_nodes_logits_in_a_tree_step_are_its_root_paths_as_a_chain():
    model = Transformer.random(TINY, seed=3, std=0.08)
    gen = torch.Generator().manual_seed(4)
    context = torch.randint(1, 512, (1, 9), generator=gen)
    tokens = torch.randint(1, 512, (len(PARENTS),), generator=gen).tolist()
    cache = model.new_cache(64)
    model(context, cache, 0)
    cache.commit(9)
    parents = torch.tensor(PARENTS)
    depths = torch.tensor([len(p) - 1 for p in root_paths(PARENTS)])
    t = len(PARENTS)
    seen = visibility(ancestors(torch.tensor([0] + PARENTS[1:])), 9, 9 + t)
    out = model(torch.tensor([tokens]), cache, 9, positions=9 + torch.arange(t), kv_len=9 + t,
                mask=seen, rope=9 + depths, tree_parents=parents).logits[0]
    cache.rollback(9)
    for i, path in enumerate(root_paths(PARENTS)):
        fresh = model.new_cache(64)
        model(context, fresh, 0)
        fresh.commit(9)
        chain = model(torch.tensor([[tokens[j] for j in path]]), fresh, 9).logits[0, -1]
        assert torch.allclose(out[i], chain, atol=1e-5, rtol=0), i


def _prompts():
    gen = torch.Generator().manual_seed(7)
    motif = torch.randint(1, 512, (5,), generator=gen).tolist()
    return [motif * 4 + [9], torch.randint(1, 512, (16,), generator=gen).tolist()]


@pytest.mark.parametrize("budget", [8, 32])
def test_tree_output_equals_ar_on_the_tiny_hybrid(budget):
    model = Transformer.random(TINY, seed=4, std=0.08)
    ar = Engine(model, Options({"draft_len": 6}), 256)
    want = [ar.generate(p, 24).tokens for p in _prompts()]
    eng = Engine(model, Options({"draft_len": 6, "tree_budget": budget}), 256)
    paths = []
    select = eng.cache.select_path
    eng.cache.select_path = lambda path: (paths.append(list(path)), select(path))[1]
    other = Transformer.random(TINY, seed=4, std=0.08)   # the target itself: trees branch
    gen = torch.Generator().manual_seed(5)               # off a slightly different draft
    with torch.no_grad():                                # (seeded: the same trees each run)
        for p in other.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    for drafter in (NGramDrafter(4, 1, 4), DraftModelDrafter(other, 256)):
        for prompt, ref in zip(_prompts(), want):
            assert eng.generate(prompt, 24, drafter).tokens == ref
    assert paths and any(p != list(range(len(p))) for p in paths)   # off-chain paths taken


def _perturbed(seed=4):
    """The target with small noise: a draft model that is mostly right, so trees branch."""
    other = Transformer.random(TINY, seed=seed, std=0.08)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return other


@pytest.mark.parametrize("budget", [8, 32])
def test_static_tree_steps_give_the_dynamic_tree_steps_tokens(budget):
    """The static path's tree slot on a hybrid target (GraphRunner, eager as on the CPU; on
    CUDA the same step is captured): its GDN layers read the padded tree's plan made on the
    device (kernels/gdn's device_plan) and its staging is put in the accepted path's order
    inside the step. Same tokens and accepted counts as the dynamic tree step, AR's tokens."""
    model = Transformer.random(TINY, seed=4, std=0.08)
    ar = Engine(model, Options({"draft_len": 6}), 256)
    want = [ar.generate(p, 24).tokens for p in _prompts()]
    opts = {"draft_len": 6, "tree_budget": budget}
    dynamic = Engine(model, Options(opts), 256, static=False)
    static = Engine(model, Options(opts), 256, static=True, capture=False)
    assert static.runner is not None and dynamic.runner is None
    other = _perturbed()
    for drafter in (NGramDrafter(4, 1, 4), DraftModelDrafter(other, 256)):
        for prompt, ref in zip(_prompts(), want):
            a = dynamic.generate(prompt, 24, drafter)
            b = static.generate(prompt, 24, drafter)
            assert b.tokens == a.tokens == ref
            assert b.accepted == a.accepted
    assert any(s.tree for s in static.runner.slots.values())   # the tree slots ran


def test_a_static_tree_step_stages_the_accepted_path_in_order():
    """One tree step through the runner's tree slot, then the commit of its accepted path:
    the GDN states and conv windows equal those of the dynamic step's path (select_path)
    committed, and of the path run alone as a chain; logits at every real node as the
    dynamic step's (a tree of 12 nodes in a slot of 16: padding nodes hang off the root)."""
    from stock.graphs import GraphRunner
    from stock.tree import DraftTree

    model = Transformer.random(TINY, seed=3, std=0.08)
    gen = torch.Generator().manual_seed(4)
    context = torch.randint(1, 512, (1, 9), generator=gen)
    tokens = torch.randint(1, 512, (len(PARENTS),), generator=gen).tolist()
    depths = [len(p) - 1 for p in root_paths(PARENTS)]

    def fresh():
        cache = model.new_cache(128)
        model(context, cache, 0)
        cache.commit(9)
        return cache

    # the branch 0 -> 2 -> 5 -> 8 spells the target's greedy continuation of the root, so
    # the accepted path leaves the chain's order (nodes 1, 3, 4 sit between)
    greedy, ar = [tokens[0]], fresh()
    for _ in range(3):
        greedy.append(int(model(torch.tensor([greedy[-1:]]), ar, ar.length).logits[0, -1]
                          .argmax()))
        ar.commit(ar.length + 1)
    for node, token in zip((2, 5, 8), greedy[1:]):
        tokens[node] = token
    tree = DraftTree(tokens, PARENTS, depths, [0.0] * len(PARENTS))

    cache = fresh()
    runner = GraphRunner(model, cache, 64, capture=False)
    out = runner.tree_step(tree, 9)
    n = int(out.packed[0])
    t = len(PARENTS)
    dyn = fresh()
    seen = visibility(ancestors(torch.tensor([0] + PARENTS[1:])), 9, 9 + t)
    ref = model(torch.tensor([tokens]), dyn, 9, positions=9 + torch.arange(t), kv_len=9 + t,
                mask=seen, rope=9 + torch.tensor(depths),
                tree_parents=torch.tensor(PARENTS)).logits[0]
    assert torch.allclose(out.logits[:t], ref, atol=1e-5, rtol=0)
    path = [0]   # the greedy walk: the child whose token is the target's choice, in order
    target = ref.argmax(-1).tolist()
    while True:
        nxt = [i for i in range(t) if PARENTS[i] == path[-1] and tokens[i] == target[path[-1]]]
        if not nxt:
            break
        path.append(nxt[0])
    assert n == len(path) - 1 and path == [0, 2, 5, 8]
    dyn.select_path(path)
    dyn.commit(9 + len(path))
    cache.commit(9 + len(path))
    chain = fresh()
    model(torch.tensor([[tokens[j] for j in path]]), chain, 9)
    chain.commit(9 + len(path))
    for layer in cache.gdn_layers:
        for other in (dyn, chain):
            assert torch.allclose(cache.state[layer], other.state[layer], atol=1e-5, rtol=0)
            assert torch.allclose(cache.window[layer], other.window[layer], atol=1e-5, rtol=0)


def test_compiled_hybrid_tree_step_equals_the_eager_one(monkeypatch):
    """The tree slot through stock/compiled.py's hybrid layers (dynamo's eager backend on
    the CPU; inductor on the GPU): the GDN layers between the regions read the tree's plan;
    the same logits and packed result as the uncompiled static step."""
    from stock import compiled as C
    from stock.graphs import GraphRunner
    from stock.tree import DraftTree

    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    try:
        model = Transformer.random(TINY, seed=3, std=0.08)
        gen = torch.Generator().manual_seed(6)
        context = torch.randint(1, 512, (1, 9), generator=gen)
        tokens = torch.randint(1, 512, (len(PARENTS),), generator=gen).tolist()
        tree = DraftTree(tokens, PARENTS, [len(p) - 1 for p in root_paths(PARENTS)],
                         [0.0] * len(PARENTS))
        outs = []
        for compile in (True, False):
            cache = model.new_cache(128)
            model(context, cache, 0)
            cache.commit(9)
            out = GraphRunner(model, cache, 64, capture=False, compile=compile).tree_step(tree, 9)
            outs.append((out.logits[:len(PARENTS)].clone(), out.packed.clone()))
        (a, pa), (b, pb) = outs
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert torch.equal(pa, pb)
        assert not C.fallbacks()
    finally:
        C.reset()
