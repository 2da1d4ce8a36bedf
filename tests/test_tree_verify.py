"""Memory entry tree-verify (option tree_budget): speculative greedy output over best-first
draft trees equals AR output token for token (fp32, CPU), through the dynamic forward and
through the static step the CUDA graphs replay.

Runs where the entry is applied; on stock, tests/test_entry_tests.py replays the entry onto
the current stock in a worktree and runs this file there.
"""

import json
from pathlib import Path

import pytest
import torch

from stock.options import REGISTRY, Options

if "tree_budget" not in REGISTRY:
    pytest.skip("option tree_budget comes with the memory entry tree-verify",
                allow_module_level=True)

from stock.config import PRESETS  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.model import Transformer  # noqa: E402
from stock.system import make_drafter  # noqa: E402

from block_fixtures import toy, toy_trained  # noqa: E402,F401  (module fixtures)

# AR outputs of the 8 dev prompts, recorded (tests/test_greedy_recorded.py): no AR run here
RECORDED = json.loads((Path(__file__).parent / "data" / "greedy_64.json").read_text())
NEW = 32


def _engine(smol, **opts) -> Engine:
    return Engine(smol.engine.model, Options(opts), smol.engine.max_context,
                  smol.engine.stop_ids)


def _ar(i: int) -> list[int]:
    return RECORDED["tokens"]["ar"][i][:NEW]


@pytest.mark.slow
# The n-gram drafter at budget 32 only: its lattice depends on the context alone, so on these
# prompts (whose outputs are AR's) it drafts the same lattice at every step whatever the
# budget, and a best-first tree of 8 nodes is the first 8 nodes of the tree of 32; the
# budget-8 run repeated the same steps through the same build, verify, walk and compaction.
@pytest.mark.parametrize("drafter,budget", [("block", 8), ("block", 32), ("ngram", 32)])
def test_tree_output_equals_ar(smol, dev_prompts, drafter, budget):
    draft_len = 15 if drafter == "block" else 8   # block 16: 16 tokens a chain step
    eng = _engine(smol, tree_budget=budget, draft_len=draft_len)
    trees = []
    verify = eng._verify_tree
    eng._verify_tree = lambda tree, *a: (trees.append(len(tree)), verify(tree, *a))[1]
    d = make_drafter(drafter, eng)
    # the flagship (block, 32) on all eight prompts; the others on one prompt of each of the
    # four categories (CI time: 26 and 32 s of this CPU on all eight)
    which = range(8) if (drafter, budget) == ("block", 32) else range(0, 8, 2)
    runs = [eng.generate(dev_prompts[i], NEW, d) for i in which]
    assert trees and max(trees) > (8 if budget > 8 else 1)   # trees verified, >8 nodes at 32
    for i, r in zip(which, runs):
        assert r.tokens == _ar(i), f"{drafter} budget {budget}, prompt {i}: first " \
            f"difference at {next(j for j, (a, b) in enumerate(zip(r.tokens, _ar(i))) if a != b)}"
    if drafter == "block" and budget == 32:   # the chain on half the prompts (CI time)
        chain = _engine(smol, draft_len=15)
        cd = make_drafter("block", chain)
        tau_chain = sum(chain.generate(p, NEW, cd).tau for p in dev_prompts[:4])
        assert sum(r.tau for r in runs[:4]) > tau_chain   # the tree accepted more per step


def test_tree_through_the_static_step_equals_ar_and_the_dynamic_path():
    """The GraphRunner's tree slot run eagerly (CPU): the device walk, the in-step K/V
    compaction and the hidden-state gather give AR's tokens, and the dynamic path's τ."""
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    prompt = [5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 2
    ar = Engine(model, Options(), 256, static=True).generate(prompt, 40).tokens
    taus = {}
    for static in (True, False):
        eng = Engine(model, Options({"tree_budget": 16, "draft_len": 8}), 256, static=static)
        res = eng.generate(prompt, 40, NGramDrafter(3, 1, 4))
        assert res.tokens == ar
        taus[static] = res.accepted
    assert taus[True] == taus[False]


def test_prepare_makes_the_tree_slots_too():
    """Engine.prepare with tree_budget set also makes the tree steps' slots (their own keys):
    a tree-verified request below `end` then meets no slot it did not make."""
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    prompt = [5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 12
    eng = Engine(model, Options({"tree_budget": 16, "draft_len": 8}), 1024, static=True)
    eng.prepare(NGramDrafter(3, 1, 4), len(prompt) + 120 + 64)
    keys = set(eng.runner.slots)
    assert any(k[-1] == "tree" for k in keys) and {k[1] for k in keys} == {256, 512}
    res = eng.generate(prompt, 120, NGramDrafter(3, 1, 4))
    assert set(eng.runner.slots) == keys and len(prompt) + len(res.tokens) > 256
    assert res.tokens == Engine(model, Options(), 1024).generate(prompt, 120).tokens


def test_compiled_tree_step_runs_its_tree_regions_and_equals_the_eager_step(monkeypatch):
    """A compiled runner's tree step (CPU: dynamo's eager backend, SDPA, so the mask is
    built) runs stock/tree.py's two tree regions without falling back, and gives the eager
    runner's packed result, K/V compaction and hidden states."""
    from stock import compiled as C
    from stock.graphs import GraphRunner
    from stock.tree import build

    monkeypatch.setattr(C, "BACKEND", "eager")
    C.reset()
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=5, std=0.08)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, 200, (1, 30), generator=gen)
    ids = torch.stack([torch.randperm(200, generator=gen)[:3] for _ in range(6)])
    lp = torch.log_softmax(torch.randn(6, 200, generator=gen), -1).topk(3, -1).values
    tree = build(ids, lp, root=7, budget=12)
    outs = []
    for compiled in (False, True):
        cache = model.new_cache(256 + 64)
        with torch.inference_mode():
            model(prompt, cache, 0)
        cache.commit(30)
        runner = GraphRunner(model, cache, 256, capture=False, compile=compiled)
        out = runner.tree_step(tree, 30, (1,))
        outs.append((out.packed.clone(), out.hidden[1].clone(), cache.k_all[:, :, :, :42].clone()))
    assert not C.fallbacks()
    assert {"tree_prep", "tree_accept"} <= set(C.REGIONS)
    for want, got in zip(*outs):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[0][0], outs[1][0])   # the accepted tokens themselves


def test_trees_that_do_not_fit_fall_back_to_the_chain():
    """A tree whose slots would pass the context is verified as the chain: near the end of
    the context output still equals AR, up to the context's end."""
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=3, std=0.08)
    prompt = list(range(3, 23))
    ar = Engine(model, Options(), 64).generate(prompt, 60)
    eng = Engine(model, Options({"tree_budget": 32, "draft_len": 8}), 64)
    res = eng.generate(prompt, 60, NGramDrafter(3, 1, 4))
    assert ar.stop_reason == "context"   # trees first, then chains as the end nears
    assert res.tokens == ar.tokens and res.stop_reason == ar.stop_reason


@pytest.mark.parametrize("budget", [8, 32])
def test_device_built_trees_equal_ar_and_the_host_built_trees(toy, toy_trained, budget):
    """tree_build=device (the tree built inside the step from the block drafter's packed
    lattice, no lattice on the host) through the static step: AR's tokens, and the host
    build's steps (its lattices have no tied paths, so both build the same trees)."""
    from stock.drafters.block import BlockDrafter

    target, prompts, _ = toy
    runs = {}
    for where in ("device", "host"):
        eng = Engine(target, Options({"tree_budget": budget, "draft_len": 4,
                                      "tree_build": where}), 256, static=True)
        used = []
        step = eng.runner.lattice_step
        eng.runner.lattice_step = lambda *a, **kw: (used.append(a[3]), step(*a, **kw))[1]
        drafter = BlockDrafter(toy_trained[0], target, 256, static=True)
        runs[where] = [eng.generate(p, 40, drafter) for p in prompts[:3]]
        assert bool(used) == (where == "device")
    ar = Engine(target, Options(), 256)
    for i, p in enumerate(prompts[:3]):
        assert runs["device"][i].tokens == ar.generate(p, 40).tokens
        assert runs["device"][i].accepted == runs["host"][i].accepted
    assert max(r.tau for r in runs["device"]) > 1.5   # trees were accepted, not only roots


def test_device_built_trees_need_a_drafter_that_keeps_its_lattice():
    """tree_build=device with a drafter that has no packed lattice (n-gram) builds on the
    host: the same tokens, and no device-built step."""
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    prompt = [5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 2
    eng = Engine(model, Options({"tree_budget": 16, "draft_len": 8}), 256, static=True)
    eng.runner.lattice_step = None   # would fail if called
    res = eng.generate(prompt, 40, NGramDrafter(3, 1, 4))
    assert res.tokens == Engine(model, Options(), 256).generate(prompt, 40).tokens


def test_prepare_makes_the_device_built_trees_slots():
    """With the block drafter, prepare also makes the device-built trees' slots (keyed by
    the lattice's shape), and a request below `end` then meets no new slot."""
    from block_fixtures import random_net
    from stock.drafters.block import BlockDrafter

    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    drafter = BlockDrafter(random_net(model), model, 512, static=True)
    prompt = list(range(3, 40))
    eng = Engine(model, Options({"tree_budget": 16, "draft_len": 3}), 512, static=True)
    eng.prepare(drafter, len(prompt) + 30 + 64)
    keys = set(eng.runner.slots)
    assert any("lattice" in k for k in keys)
    eng.generate(prompt, 30, drafter)
    assert set(eng.runner.slots) == keys


def test_budget_zero_is_stock():
    assert REGISTRY["tree_budget"].default == 0
    assert REGISTRY["tree_build"].default == "device"   # changes nothing at budget 0
    eng = Engine(Transformer.random(PRESETS["tiny-qwen3"], seed=1), Options(), 128)
    assert eng._tree(make_lattice(), 1, 4, 0) is None


def make_lattice():
    from stock.drafters.base import DraftLattice

    return DraftLattice(torch.tensor([[3, 4], [5, 6]]), torch.tensor([[-0.1, -1.0],
                                                                      [-0.2, -2.0]]))


def test_the_cost_model_measures_a_tree_verifying_system():
    """The cost model on a system that verifies trees (the explore's tune-kernels phase
    analyses the integrated system; on the H200 it had adopted tree_budget 16 and the
    analysis then failed: lattice logs record chain steps). The measurement goes on without
    lattices: the timed steps' tokens gained are the engine's, the tokens verified per step
    and the kernels' bounds are unknown (not the chain's guessed), and the τ factor is the
    best simulated mode's τ over the τ this system measured, not over the chain's."""
    from specpilot.judges.analyze import report
    from specpilot.judges.hardware import TABLE
    from specpilot.judges.worker_main import measure

    model = Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)
    prompts = [[5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 2,
               [4, 8, 6, 4, 8, 6, 2, 4, 8, 6, 4, 8, 1] * 2]
    reps = {}
    for budget in (0, 16):
        eng = Engine(model, Options({"tree_budget": budget, "draft_len": 8}), 256)
        m = measure(eng, NGramDrafter(3, 1, 4), prompts, 40)
        assert m["recorded"] is (budget == 0)
        for run, ids in zip(m["runs"], prompts):
            again = eng.generate(ids, 40, NGramDrafter(3, 1, 4))
            assert run["accepted"] == again.accepted and run["steps"] == again.steps
            assert bool(run["lattices"]) is (budget == 0)
        reps[budget] = rep = report(m, "random", TABLE["H200"], ["a", "b"])
        assert rep.tau_measured == pytest.approx(
            sum(sum(r["accepted"]) for r in m["runs"]) / rep.steps)
        assert rep.factors["tau"] == pytest.approx(rep.tau_curve[rep.tau_best_budget]
                                                   / rep.tau_measured)
    chain, tree = reps[0], reps[16]
    assert 1 < chain.tokens_per_step <= 9 and chain.factors["kernel"] is not None
    assert tree.tokens_per_step is None and tree.factors["kernel"] is None
    assert all(c.bound_ms is None for c in tree.categories)
    assert tree.tau_measured > chain.tau_measured           # the tree accepted more a step
    assert chain.tau_curve == tree.tau_curve                # the same simulated modes
    assert tree.factors["tau"] < chain.factors["tau"]       # less left to gain over a tree
