"""Memory entry batch-tree-verify (issue "batched serving": a batched step verifies every
request's chain or tree): with option tree_budget the batched engine verifies each request's
best-first draft tree, all rows in one forward, each row's accepted path compacted in its own
cache row; every output stays the request's single-request greedy one (fp32, CPU). Runs
where the entry is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import os
import random

import torch

if not torch.cuda.is_available():   # the tree-build kernel through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import stock.tree as tree  # noqa: E402

batch_tree = pytest.importorskip(
    "stock.batch_tree", reason="batched trees come with the memory entry batch-tree-verify")

from block_fixtures import one_thread, toy, toy_trained  # noqa: E402,F401
from stock import batch_graphs  # noqa: E402
from stock.batch import BatchEngine, BatchError  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402


def _random_trees(rng: random.Random, b: int, t: int):
    parents, depths = [], []
    for _ in range(b):
        n = rng.randint(1, t)
        par, dep = [0], [0]
        for i in range(1, n):
            p = rng.randint(0, i - 1)
            par.append(p)
            dep.append(dep[p] + 1)
        parents.append(par + [0] * (t - n))
        depths.append(dep + [0] * (t - n))
    return torch.tensor(parents), torch.tensor(depths)


def test_the_batched_tree_tensors_are_the_single_request_ones_row_by_row():
    """ancestors, visibility, the greedy walk and the compaction of a batch of random trees
    (distinct sibling tokens, as `build` makes them), rows at different starts and cache
    rows: each row's equals stock/tree.py's single-request function on that row."""
    rng = random.Random(0)
    torch.manual_seed(0)
    accepted = 0
    for _ in range(100):
        b, t, kv = 3, 8, 20
        parents, depths = _random_trees(rng, b, t)
        starts, rows = torch.tensor([5, 0, 3]), torch.tensor([2, 0, 3])
        anc = tree.ancestors_rows(parents)
        seen = tree.rows_visibility(anc, starts, kv)
        ids = torch.stack([torch.randperm(t) for _ in range(b)])
        logits = torch.randn(b, t, t)
        path, packed = tree.rows_accept(ids, parents, depths, anc, logits)
        accepted += int(packed[:, 0].sum())
        buf = torch.randn(2, 4, 1, 24, 2)
        before = buf.clone()
        tree.compact_rows([buf], rows, starts, path)
        for r in range(b):
            a1 = tree.ancestors(parents[r])
            assert torch.equal(a1, anc[r])
            assert torch.equal(tree.visibility(a1, int(starts[r]), kv), seen[r])
            _, _, p1, pk1 = tree.tree_accept(ids[r], parents[r], depths[r], a1, logits[r])
            assert torch.equal(p1, path[r]) and torch.equal(pk1, packed[r])
            one = before[:, int(rows[r])].clone()
            tree.compact([one], int(starts[r]), path[r])
            assert torch.equal(one, buf[:, int(rows[r])])
        assert torch.equal(before[:, 1], buf[:, 1])   # a row no request holds: untouched
    assert accepted > 20   # the walks went past the roots


def _lattice(seed: int, depth: int = 6, width: int = 4, vocab: int = 300):
    gen = torch.Generator().manual_seed(seed)
    top = torch.log_softmax(torch.randn(depth, vocab, generator=gen) * 2, -1).topk(width, -1)
    return torch.stack([top.indices.double(), top.values.double()])


def test_the_rows_tree_build_is_each_rows_own_build():
    """kernels/tree_build's one launch for a batch (a program a lattice; Triton's
    interpreter on this CPU) and its reference build each row's tree as the single build
    does with that row's root, depth limit and budget, a root-only row (budget 1, k 0)
    included."""
    from kernels.tree_build import (reference_tree_build, reference_tree_build_rows,
                                    tree_build_rows)

    lattices = torch.stack([_lattice(s) for s in range(4)])
    ctl = torch.tensor([[7, 6, 8, 0], [9, 2, 8, 0], [11, 0, 1, 0], [13, 6, 5, 0]])
    want = torch.stack([torch.stack(reference_tree_build(lat, c, 8))
                        for lat, c in zip(lattices, ctl)])
    assert torch.equal(reference_tree_build_rows(lattices, ctl, 8), want)
    assert torch.equal(tree.device_tree_rows(lattices, ctl, 8), want)   # stock's door
    assert torch.equal(tree_build_rows(lattices, ctl[:, :3], 8), want)
    assert want[2, 2].sum() == 0 and want[0, 2].max() > 1   # a lone root; a deep tree
    with pytest.raises(ValueError, match=r"ctl \[B, >= 3\]"):
        tree_build_rows(lattices, ctl[:3], 8)


def _spy_paths(monkeypatch):
    """Every accepted path of the step's walks (both the dynamic and the static step's)."""
    paths = []
    real = tree.rows_accept

    def spy(*args):
        out = real(*args)
        paths.append(out[0].clone())
        return out
    monkeypatch.setattr(batch_tree, "rows_accept", spy)
    monkeypatch.setattr(batch_graphs, "rows_accept", spy)
    return paths


@pytest.mark.parametrize("static,build", [(False, "host"), (True, "host"), (True, "device")])
def test_batched_trees_keep_every_single_request_output(toy, toy_trained, static, build,
                                                        monkeypatch):
    """The dynamic forward, the static step given host trees, and the static step building
    them from the batch drafter's lattices on the device (its reference here): 8 requests
    of different lengths through 3 rows, so rows are freed and retaken mid-run; every
    output is the single-request AR one, some accepted path leaves the chain (the
    compaction moves K/V), and the trees accept more tokens a step than the chains."""
    target, prompts, _ = toy
    net = toy_trained[0]
    base = {"draft_len": 3, "block_size": 4}
    lengths = [20, 9, 16, 20, 5, 12, 20, 14]
    single = Engine(target, Options(base), 256)
    want = [single.generate(p, n).tokens for p, n in zip(prompts, lengths)]
    tau = {}
    for budget in (0, 6):
        paths = _spy_paths(monkeypatch)
        be = BatchEngine(target, Options({**base, "tree_budget": budget, "tree_build": build}),
                         max_batch=3, max_context=256, static=static, capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=4,
                                                         static=static, capture=False))
        reqs = [be.submit(p, n) for p, n in zip(prompts, lengths)]
        be.run()
        assert [r.tokens for r in reqs] == want
        steps = [a for r in reqs for a in r.accepted]
        tau[budget] = sum(steps) / len(steps)
        if budget:
            off_chain = [p for p in paths if (p != torch.arange(p.shape[1])).any()]
            assert paths and off_chain
        else:
            assert not paths   # chains: no tree step
    assert tau[6] > tau[0]


def test_per_request_drafters_verify_trees_too(toy):
    """The n-gram drafter per request: its lattices (flat log-probs) grow host trees."""
    target, prompts, _ = toy
    want = [Engine(target, Options({"draft_len": 4}), 256).generate(p, 16).tokens
            for p in prompts]
    be = BatchEngine(target, Options({"draft_len": 4, "tree_budget": 8}), max_batch=4,
                     max_context=256, drafter_factory=lambda: NGramDrafter(4, 1, 4))
    reqs = [be.submit(p, 16) for p in prompts]
    be.run()
    assert [r.tokens for r in reqs] == want


def test_the_compiled_tree_step_serves_the_same_tokens(toy, toy_trained, monkeypatch):
    """The static step's layers and tree regions through stock/compiled.py (dynamo's
    "eager" backend on this CPU; on CUDA inductor): the same outputs, no fallback, and the
    batched tree regions compiled (their rope and tree mask go to SDPA over the rows)."""
    from stock import compiled as C

    target, prompts, _ = toy
    net = toy_trained[0]
    base = {"draft_len": 3, "block_size": 4}
    want = [Engine(target, Options(base), 256).generate(p, 20).tokens for p in prompts]
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    try:
        be = BatchEngine(target, Options({**base, "tree_budget": 6}), max_batch=3,
                         max_context=256, static=True, capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=4, static=True,
                                                         capture=False))
        be.runner.compile = True   # CUDA only in the engine (compile_enabled): forced here
        reqs = [be.submit(p, 20) for p in prompts]
        be.run()
        assert [r.tokens for r in reqs] == want
        assert not C.fallbacks()
        assert {n for n, _ in C._compiled} >= {"batch_tree_prep", "batch_tree_accept",
                                               "attn_in", "attn_out_mlp"}
    finally:
        C.reset()


def test_a_hybrid_target_refuses_batched_trees_in_one_line():
    from stock.config import PRESETS
    from stock.model import Transformer

    model = Transformer.random(PRESETS["tiny-hybrid"], seed=4, std=0.08)
    with pytest.raises(BatchError, match="no trees on a hybrid target") as err:
        BatchEngine(model, Options({"tree_budget": 8}), max_batch=2, max_context=64)
    assert "\n" not in str(err.value)
    BatchEngine(model, Options({"tree_budget": 0}), max_batch=2, max_context=64)  # chains


def test_the_kernel_runs_each_requests_tree_over_its_own_row():
    """kernels/attention's split-KV kernel with a tree table a request (Triton's
    interpreter on this CPU): each request's rows equal the reference over its own cache
    row and, bit for bit, the same request's single tree step over that row alone (its
    own start and tree; the plan's chunks the same for both); rows no request reads are
    never read (NaN there changes nothing); each row's table is the single-request one."""
    from kernels.attention import decode_attention, reference_attention
    from kernels.attention.decode import plan

    gen = torch.Generator().manual_seed(7)
    hkv, g, t, d, slots, kv_len = 2, 2, 8, 16, 200, 192
    cache_k = torch.randn(5, hkv, slots, d, generator=gen)
    cache_v = torch.randn(5, hkv, slots, d, generator=gen)
    rows_of, starts = torch.tensor([3, 0, 4]), torch.tensor([150, 7, 62])
    assert plan(3 * hkv, g * t, kv_len, 8) == plan(hkv, g * t, kv_len, 8)   # same chunks
    parents, depths = _random_trees(random.Random(3), 3, t)
    anc, table = tree.tree_prep_rows(parents, depths, starts)
    for r in range(3):
        assert torch.equal(table[r], tree.tree_table(anc[r], depths[r], starts[r]))
    positions = starts[:, None] + torch.arange(t)
    q = torch.randn(3, hkv, g * t, d, generator=gen)
    got = decode_attention(q, cache_k, cache_v, positions, kv_len, tree=table, rows_of=rows_of)
    want = reference_attention(q, cache_k, cache_v, positions, kv_len, tree=table,
                               rows_of=rows_of)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    for i, r in enumerate(rows_of.tolist()):
        one = decode_attention(q[i:i + 1], cache_k[r:r + 1], cache_v[r:r + 1], positions[i],
                               kv_len, tree=table[i])
        torch.testing.assert_close(got[i:i + 1], one, atol=0, rtol=0)
    for other in (1, 2):
        cache_k[other], cache_v[other] = float("nan"), float("nan")
    again = decode_attention(q, cache_k, cache_v, positions, kv_len, tree=table,
                             rows_of=rows_of)
    torch.testing.assert_close(again, got, atol=0, rtol=0)
    with pytest.raises(ValueError, match="tree holds"):
        decode_attention(q, cache_k, cache_v, positions, kv_len, tree=table[0],
                         rows_of=rows_of)


def test_the_compiled_tree_step_with_the_kernel_serves_the_same_tokens(toy, toy_trained,
                                                                       monkeypatch):
    """The static tree step through the compiled layers with the split-KV kernel reading
    each row's tree table (forced here: CUDA only; the interpreter's fp32): the same outputs
    as the single-request engine, and the kernel was called with the trees."""
    from kernels import attention as A
    from stock import compiled as C
    from stock import static_step

    target, prompts, _ = toy
    net = toy_trained[0]
    base = {"draft_len": 3, "block_size": 4}
    # two requests in the two rows: each row's own tree through the kernel (CI time: the
    # interpreter ran four, two after two, in 44 s of this CPU)
    want = [Engine(target, Options(base), 256).generate(p, 12).tokens for p in prompts[:2]]
    calls = []
    real = A.decode_attention

    def spy(*args, **kw):
        calls.append(kw.get("tree") is not None and kw.get("rows_of") is not None)
        return real(*args, **kw)
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    monkeypatch.setattr(C, "uses_kernel", lambda *a: True)
    monkeypatch.setattr(static_step, "tree_kernel_runs", lambda *a: True)
    monkeypatch.setattr(batch_graphs, "tree_kernel_runs", lambda *a: True)
    monkeypatch.setattr(A, "decode_attention", spy)
    try:
        be = BatchEngine(target, Options({**base, "tree_budget": 6}), max_batch=2,
                         max_context=256, static=True, capture=False,
                         batch_drafter=BatchBlockDrafter(net, target, 256, rows=3, static=True,
                                                         capture=False))
        be.runner.compile, be.runner.attention = True, "triton"
        reqs = [be.submit(p, 12) for p in prompts[:2]]
        be.run()
        assert [r.tokens for r in reqs] == want
        assert any(calls) and not C.fallbacks()
    finally:
        C.reset()
