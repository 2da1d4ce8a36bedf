"""Draft trees (stock/tree.py) and the target's forward over one: the builder is best-first
under its budget, the device walk and masks equal their host references, and each node's
logits in a tree step equal those of its root path run alone as a chain."""

import itertools

import pytest
import torch

from stock.config import PRESETS
from stock.model import Transformer
from stock.static_step import static_forward
from stock.tree import (DraftTree, accept, ancestors, build, compact, tree_accept, tree_prep,
                        tree_table, visibility, walk)

NEG = float("-inf")


def _lattice(seed: int, n: int = 5, k: int = 3, vocab: int = 50):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(n)])
    lp = torch.log_softmax(torch.randn(n, vocab, generator=gen), -1).topk(k, -1).values
    return ids, lp


def _all_prefixes(ids, lp, depth):
    """Every path through the lattice (rank choices) of length 1..depth, with its score."""
    out = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(ids.shape[1]), repeat=d):
            out.append((sum(float(lp[i, r]) for i, r in enumerate(ranks)),
                        tuple(int(ids[i, r]) for i, r in enumerate(ranks))))
    return out


@pytest.mark.parametrize("seed,budget", [(0, 1), (1, 4), (2, 9), (3, 20)])
def test_build_keeps_the_most_probable_paths(seed, budget):
    ids, lp = _lattice(seed, n=4, k=3)
    tree = build(ids, lp, root=7, budget=budget)
    assert len(tree) == budget and tree.tokens[0] == 7 and tree.parents[0] == -1
    paths = {tuple(tree.tokens[j] for j in tree.path_to(i)[1:]) for i in range(1, len(tree))}
    ranked = sorted(_all_prefixes(ids, lp, 4), key=lambda s: -s[0])
    # the emitted nodes are the budget-1 best prefixes (ties broken towards shallower ones)
    assert min(s for s, p in ranked if p in paths) >= ranked[budget - 2][0] - 1e-6 \
        if budget > 1 else paths == set()
    for i in range(1, len(tree)):
        p = tree.parents[i]
        assert p < i and tree.depths[i] == tree.depths[p] + 1
        assert tree.scores[i] <= tree.scores[p]
    for kids in tree.children():
        toks = [tree.tokens[c] for c in kids]
        assert len(toks) == len(set(toks))   # no duplicate token under one parent


def test_build_skips_padding_and_stops_at_an_empty_depth():
    ids = torch.tensor([[4, 4, -1], [-1, -1, -1], [9, 8, 7]])
    lp = torch.tensor([[-0.1, -0.2, NEG], [NEG, NEG, NEG], [-0.1, -0.2, -0.3]])
    tree = build(ids, lp, root=1, budget=16)
    assert tree.tokens == [1, 4] and tree.depths == [0, 1]
    chain = DraftTree([1, 4, 5], [-1, 0, 1], [0, 1, 2], [0.0, 0.0, 0.0])
    assert chain.is_chain and not build(*_lattice(0), 1, 8).is_chain


def test_greedy_chain_lattice_gives_the_chain():
    ids = torch.tensor([[3], [4], [5]])
    lp = torch.zeros(3, 1)
    tree = build(ids, lp, root=2, budget=8)
    assert tree.is_chain and tree.tokens == [2, 3, 4, 5]


@pytest.mark.parametrize("seed", range(6))
def test_device_walk_and_masks_equal_the_host_references(seed):
    ids, lp = _lattice(seed, n=6, k=3, vocab=6)   # small vocab: random targets often match
    tree = build(ids, lp, root=1, budget=14)
    t = 16
    toks, par, dep = (torch.tensor(x) for x in tree.padded(t))
    anc = ancestors(par)
    for i in range(t):
        want = set(tree.path_to(i)) if i < len(tree) else {0, i}
        assert {j for j in range(t) if anc[i, j]} == want
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(20):
        target = torch.randint(0, 6, (t,), generator=gen)
        host = walk(tree, target.tolist())
        n, path = accept(toks, par, dep, anc, target)
        assert int(n) == len(host) - 1
        assert path[: len(host)].tolist() == host
        assert path[len(host):].tolist() == list(range(len(host), t))
    seen = visibility(anc, 5, 40)
    for i in range(t):
        assert seen[i, :5].all() and not seen[i, 5 + t:].any()
        assert [j for j in range(t) if seen[i, 5 + j]] == sorted(
            j for j in range(t) if anc[i, j])


@pytest.mark.parametrize("t", [8, 16])
def test_tree_regions_trace_to_one_graph_each_and_equal_their_parts(t):
    """tree_prep and tree_accept, the compiled step's two tree regions, trace with dynamo
    into one graph each (fullgraph: no host value, no break, so inductor can fuse each into
    a few kernels) and give what ancestors, tree_table, argmax and accept give eagerly."""
    ids, lp = _lattice(t, n=6, k=3, vocab=6)
    tree = build(ids, lp, root=1, budget=t - 2)
    toks, par, dep = (torch.tensor(x) for x in tree.padded(t))
    start = torch.tensor(30)
    logits = torch.randn(t, 6, generator=torch.Generator().manual_seed(t))
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    prep = torch.compile(tree_prep, backend=backend, fullgraph=True, dynamic=False)
    after = torch.compile(tree_accept, backend=backend, fullgraph=True, dynamic=False)
    anc, table = prep(par, dep, start)
    got = after(toks, par, dep, anc, logits)
    assert len(graphs) == 2
    assert torch.equal(anc, ancestors(par))
    assert torch.equal(table, tree_table(ancestors(par), dep, start))
    target = logits.argmax(-1)
    n, path = accept(toks, par, dep, anc, target)
    assert torch.equal(got[0], target) and torch.equal(got[1], n) and torch.equal(got[2], path)
    assert got[3].tolist() == [int(n)] + target[path].tolist()


def test_a_tree_step_without_its_mask_is_refused_where_the_kernel_does_not_run(tiny):
    """Only the split-KV kernel reads a tree step's visibility from its table: elsewhere
    (CPU, eager, SDPA) a tree step without `seen` would attend causally, so it is an error."""
    cache = tiny.new_cache(64)
    ids, par = torch.tensor([[3, 4, 5, 6]]), torch.tensor([0, 0, 0, 1])
    dep = torch.tensor([0, 1, 1, 2])
    anc = ancestors(par)
    table = tree_table(anc, dep, torch.tensor(8))
    with pytest.raises(ValueError, match="rope comes with seen"):
        static_forward(tiny, ids, 8 + torch.arange(4), cache, 16, (), rope=8 + dep, tree=table)
    out = static_forward(tiny, ids, 8 + torch.arange(4), cache, 16, (), rope=8 + dep,
                         seen=visibility(anc, 8, 16), tree=table)
    assert out.logits.shape[:2] == (1, 4)


def test_compact_moves_accepted_rows_and_nothing_else():
    buf = torch.arange(2 * 1 * 12 * 1, dtype=torch.float32).view(1, 2, 12, 1)
    before = buf.clone()
    path = torch.tensor([0, 2, 5, 3, 4, 5])   # accepted depth 2: nodes 2 then 5
    path[3:] = torch.arange(3, 6)
    other = buf.clone()
    compact([buf], 4, path)
    assert torch.equal(other, before)
    assert torch.equal(buf[:, :, 5], before[:, :, 6]) and torch.equal(buf[:, :, 6],
                                                                       before[:, :, 9])
    keep = [i for i in range(12) if i not in (5, 6)]
    assert torch.equal(buf[:, :, keep], before[:, :, keep])


@pytest.fixture(scope="module")
def tiny():
    return Transformer.random(PRESETS["tiny-qwen3"], seed=11, std=0.08)


@pytest.mark.parametrize("static", [False, True])
def test_each_node_sees_only_its_root_path(tiny, static):
    """One tree step over a committed context: every node's logits equal those of its root
    path run alone as a chain from the same context (eager forward, and the static forward
    the CUDA graphs run), and K/V of the accepted path compacted into place equal the
    chain's."""
    gen = torch.Generator().manual_seed(3)
    vocab = tiny.cfg.vocab_size
    ctx = torch.randint(0, vocab, (1, 9), generator=gen)
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:3] for _ in range(4)])
    lp = torch.log_softmax(torch.randn(4, 3, generator=gen), -1)
    tree = build(ids, lp, root=int(ctx[0, -1]), budget=12)
    start, kv_len = ctx.shape[1] - 1, 64
    cache = tiny.new_cache(kv_len)
    tiny(ctx[:, :-1], cache, 0, logits="none")
    toks, par, dep = (torch.tensor(x) for x in tree.padded(16))
    anc = ancestors(par)
    seen = visibility(anc, start, kv_len)
    slots = start + torch.arange(16)
    if static:
        out = static_forward(tiny, toks.view(1, -1), slots, cache, kv_len, rope=start + dep,
                             seen=seen)
    else:
        out = tiny(toks.view(1, -1), cache, start, positions=slots, kv_len=kv_len, mask=seen,
                   rope=start + dep)
    tree_logits = out.logits[0]
    for node in range(len(tree)):
        path = tree.path_to(node)
        ref_cache = tiny.new_cache(kv_len)
        tiny(ctx[:, :-1], ref_cache, 0, logits="none")
        ref = tiny(torch.tensor([[tree.tokens[j] for j in path]]), ref_cache, start)
        torch.testing.assert_close(tree_logits[node], ref.logits[0, -1], atol=1e-5, rtol=1e-5)
    deepest = max(range(len(tree)), key=lambda i: tree.depths[i])
    path = torch.arange(16)
    chosen = tree.path_to(deepest)
    path[: len(chosen)] = torch.tensor(chosen)
    compact([cache.k_all, cache.v_all], start, path)
    rows = slice(start, start + len(chosen))
    want = chain_cache(tiny, ctx, [tree.tokens[j] for j in chosen], kv_len, start)
    for layer in range(tiny.cfg.num_layers):
        torch.testing.assert_close(cache.k[layer][:, :, rows], want.k[layer][:, :, rows],
                                   atol=1e-5, rtol=1e-5)


def chain_cache(model, ctx, tokens, kv_len, start):
    """The cache after the context and `tokens` verified as a chain from `start`."""
    cache = model.new_cache(kv_len)
    model(ctx[:, :-1], cache, 0, logits="none")
    model(torch.tensor([tokens]), cache, start, logits="none")
    return cache
