"""Memory entry tree-verify on CUDA: the tree slot replayed from a CUDA graph (compiled
layers, fused projections) gives each node the logits of its root path run as a chain
through the same runner, the device walk's path, compacted K/V, and generation with trees
gives AR's tokens (fp32: exact paths; bf16 is judged by the bench and the controller)."""

from __future__ import annotations

import pytest
import torch

from stock.config import PRESETS
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.graphs import GraphRunner
from stock.model import Transformer
from stock.options import REGISTRY, Options
from stock.tree import build, walk

if "tree_budget" not in REGISTRY:
    pytest.skip("option tree_budget comes with the memory entry tree-verify",
                allow_module_level=True)

CTX = 192


def _tree_and_runners(dtype, seed: int, gen_seed: int, prompt_len: int, depths: int,
                      compile: bool, attention: str):
    """A random tiny model on CUDA, a 16-node best-first tree over a random lattice of
    `depths` x top-3 after a random prompt, and two runners over two caches holding the
    same prefilled prompt: one for the tree step, one for the root paths as chains."""
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", dtype, seed=seed, std=0.08)
    gen = torch.Generator().manual_seed(gen_seed)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist()
    ids = torch.stack([torch.randperm(cfg.vocab_size, generator=gen)[:3]
                       for _ in range(depths)])
    lp = torch.log_softmax(torch.randn(depths, 3, generator=gen), -1)
    tree = build(ids, lp.sort(-1, descending=True).values, prompt[-1], 16)
    caches = []
    for _ in range(2):
        c = model.new_cache(CTX + 64)
        model(torch.tensor([prompt[:-1]], device="cuda"), c, 0, logits="none")
        caches.append(c)
    kw = dict(capture=True, compile=compile, attention=attention)
    runners = GraphRunner(model, caches[0], CTX, **kw), GraphRunner(model, caches[1], CTX, **kw)
    return cfg, tree, caches, runners, len(prompt) - 1


@pytest.mark.parametrize("compile,attention", [(False, "sdpa"), (True, "sdpa"),
                                               (True, "triton")])
def test_tree_slot_nodes_equal_their_root_paths(compile, attention):
    # tree and chains through the same attention: the split-KV kernel's fp32 dots run in
    # TF32 (Triton's default), 1e-3 away from SDPA's (compiled + triton: the kernel's tree mask)
    cfg, tree, caches, (tr, ch), start = _tree_and_runners(torch.float32, 5, 2, 50, 6,
                                                           compile, attention)
    out = tr.tree_step(tree, start, hidden_layers=(0,))
    logits = out.logits[: len(tree)].clone()
    target = logits.argmax(-1).tolist()
    path = walk(tree, target)
    n = int(out.packed[0])
    assert n == len(path) - 1
    assert out.packed[1:n + 2].tolist() == [target[j] for j in path]
    for node in range(len(tree)):
        nodes = tree.path_to(node)
        got = ch.step([tree.tokens[j] for j in nodes], start).logits[len(nodes) - 1]
        # fp32: the split-KV kernel's dots run in TF32 and the chains' GEMMs at other row
        # counts (bf16 is checked bit for bit below)
        tol = 1e-3 if attention == "triton" else 1e-4
        torch.testing.assert_close(logits[node], got, atol=tol, rtol=tol)
    # K/V of the accepted path, compacted, equal the chain's K/V of that path
    ch.step([tree.tokens[j] for j in path], start)
    for layer in range(cfg.num_layers):
        for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
            torch.testing.assert_close(a[layer][:, :, start:start + len(path)],
                                       b[layer][:, :, start:start + len(path)],
                                       atol=1e-4, rtol=1e-4)


def test_tree_nodes_are_their_root_paths_bit_for_bit_in_bf16():
    """bf16, compiled layers, the split-KV kernel (stock's defaults on CUDA): every node's
    logits in a tree step equal, bit for bit, its root path's last logits verified as a chain
    (the kernel reads each ancestor's K/V into the chain's columns, kernels/attention)."""
    _, tree, _, (tr, ch), start = _tree_and_runners(torch.bfloat16, 9, 4, 70, 8, True,
                                                    "triton")
    logits = tr.tree_step(tree, start).logits[: len(tree)].clone()
    worst = []
    for node in range(len(tree)):
        nodes = tree.path_to(node)
        got = ch.step([tree.tokens[j] for j in nodes], start).logits[len(nodes) - 1]
        worst.append(float((logits[node] - got).abs().max()))
    assert max(worst) == 0.0, f"per node max |diff|: {worst}"


def test_generation_with_tree_graphs_equals_ar():
    model = Transformer.random(PRESETS["tiny-qwen3"], "cuda", torch.float32, seed=7, std=0.08)
    prompt = [5, 9, 3, 5, 9, 3, 5, 9, 2, 7, 5, 9, 3, 8, 5, 9, 3, 5, 1] * 2
    ar = Engine(model, Options(), 256).generate(prompt, 40).tokens
    eng = Engine(model, Options({"tree_budget": 16, "draft_len": 8}), 256)
    assert eng.uses_graphs
    res = eng.generate(prompt, 40, NGramDrafter(3, 1, 4))
    assert res.tokens == ar
    assert any(key[-1] == "tree" for key in eng.runner.slots)   # trees were verified


@pytest.mark.parametrize("compile", [False, True])
def test_device_built_tree_slot_equals_the_host_built_one(compile):
    """tree_build=device on CUDA: the lattice slot, replayed from its graph (the Triton tree
    build inside), gives the host-built tree's step the same bits: packed (accepted count and
    tokens), hidden states and compacted K/V, on a tie-free lattice."""
    from kernels.tree_build.reference import reference_tree_build

    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.float32, seed=5, std=0.08)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    top = torch.log_softmax(torch.randn(8, cfg.vocab_size, generator=gen) * 3, -1).topk(4, -1)
    lattice = torch.stack([top.indices.double(), top.values.double()])
    ctl = torch.tensor([prompt[-1], 8, 16, 0])
    tokens, parents, depths = (x.tolist() for x in reference_tree_build(lattice, ctl, 16))
    real = 1 + sum(d > 0 for d in depths)
    tree = build(lattice[0].long(), lattice[1].float(), prompt[-1], 16, 8)
    assert tree.tokens == tokens[:real] and tree.depths == depths[:real]
    outs = []
    for device_built in (True, False):
        cache = model.new_cache(CTX + 64)
        model(torch.tensor([prompt[:-1]], device="cuda"), cache, 0, logits="none")
        runner = GraphRunner(model, cache, CTX, capture=True, compile=compile,
                             attention="triton" if compile else "sdpa")
        start = len(prompt) - 1
        if device_built:
            out = runner.lattice_step(lattice.cuda(), prompt[-1], start, 8, 16, (0,))
            out = runner.lattice_step(lattice.cuda(), prompt[-1], start, 8, 16, (0,))  # replay
        else:
            out = runner.tree_step(tree, start, (0,))
        n = int(out.packed[0])
        outs.append((out.packed[: n + 2].clone(), out.hidden[0][:, : n + 1].clone(),
                     cache.k_all[:, :, :, : start + n + 1].clone()))
    for got, want in zip(*outs):
        assert torch.equal(got, want)
