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
