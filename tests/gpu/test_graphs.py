"""CUDA graphs: replayed steps equal the eager static forward bit for bit; generation with
graphs gives the tokens of generation without them."""

from __future__ import annotations

import torch
from torch import nn

from stock.config import PRESETS
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.graphs import GraphRunner
from stock.model import Transformer
from stock.options import Options

CTX = 192


def _pair(model, prompt):
    """A capturing and an eager runner over two caches holding the same prefilled prompt."""
    runners = []
    for capture in (True, False):
        cache = model.new_cache(CTX + 64)
        model(torch.tensor([prompt], device="cuda"), cache, 0, logits="none")
        runners.append(GraphRunner(model, cache, CTX, capture=capture))
    return runners


def test_graph_replay_equals_eager_static_forward_bitwise():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=21, std=0.08)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (40,), generator=gen).tolist()
    graph, eager = _pair(model, prompt)
    start = len(prompt)
    for t in (1, 4, 9, 16, 33):
        ids = torch.randint(0, cfg.vocab_size, (t,), generator=gen).tolist()
        for _ in range(2):  # the second replay of a slot too
            got = graph.step(ids, start, hidden_layers=(0,))
            want = eager.step(ids, start, hidden_layers=(0,))
            assert torch.equal(got.logits[:t], want.logits[:t]), t
            assert torch.equal(got.packed[: t + 1], want.packed[: t + 1]), t
            assert torch.equal(got.hidden[0][:, :t], want.hidden[0][:, :t]), t
        start += 1
    assert all(s.graph is not None for s in graph.slots.values())
    for layer in range(cfg.num_layers):  # the real tokens' K/V are the same in both caches
        assert torch.equal(graph.cache.k[layer][:, :, :start + 32],
                           eager.cache.k[layer][:, :, :start + 32])


def test_reset_recaptures_after_a_module_swap():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=22, std=0.08)
    prompt = list(range(1, 30))
    graph, eager = _pair(model, prompt)
    ids = [5, 6, 7, 8]
    before = graph.step(ids, len(prompt)).logits[:4].clone()
    head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="cuda",
                     dtype=torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight * 2)
    model.lm_head = head  # a swapped module: the old graph still reads the old weights
    want = eager.step(ids, len(prompt)).logits[:4]
    assert torch.equal(graph.step(ids, len(prompt)).logits[:4], before)
    assert not torch.equal(before, want)
    graph.reset()
    assert torch.equal(graph.step(ids, len(prompt)).logits[:4], want)


def test_generation_with_graphs_equals_without():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=23, std=0.08)
    prompt = torch.randint(0, cfg.vocab_size, (40,),
                           generator=torch.Generator().manual_seed(4)).tolist() * 2
    graphs = Engine(model, max_context=512)
    eager = Engine(model, max_context=512, static=True, capture=False)
    dynamic = Engine(model, Options({"cuda_graphs": False}), max_context=512)
    assert graphs.uses_graphs and not eager.uses_graphs and dynamic.runner is None
    ar = eager.generate(prompt, 96).tokens
    assert graphs.generate(prompt, 96).tokens == ar
    spec = graphs.generate(prompt, 96, NGramDrafter())
    assert spec.tokens == eager.generate(prompt, 96, NGramDrafter()).tokens
    assert spec.tau > 1.0
    # against the dynamic forward (other kernels, bf16): equal up to near-ties
    dyn = dynamic.generate(prompt, 96).tokens
    first = next((i for i, (a, b) in enumerate(zip(ar, dyn)) if a != b), None)
    if first is not None:
        margin = dynamic.force(prompt, dyn, chunk=1).margin[first]
        assert margin <= 0.25, f"divergence at {first} with reference margin {margin}"


def test_chunked_graph_prefill_equals_the_eager_static_prefill():
    """A prompt prefilled in four graph steps on one slot, back to back without a host read
    between them (each step's inputs staged through the slot's one pinned buffer): the K/V
    and hidden states of the same steps run eagerly, bit for bit, on every repeat. A staging
    buffer rewritten before its last copy ran would hand a step another chunk's tokens."""
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=23, std=0.08)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, cfg.vocab_size, (240,), generator=gen).tolist()
    graph = Engine(model, max_context=512)
    eager = Engine(model, max_context=512, capture=False)  # the same static steps, eagerly
    assert graph.uses_graphs and eager.runner is not None and not eager.uses_graphs
    want_next, want_hidden = eager._prefill(prompt, (0,))
    for _ in range(3):
        got_next, got_hidden = graph._prefill(prompt, (0,))
        assert got_next == want_next and torch.equal(got_hidden[0], want_hidden[0])
        for layer in range(cfg.num_layers):
            assert torch.equal(graph.cache.k[layer][:, :, :240], eager.cache.k[layer][:, :, :240])
            assert torch.equal(graph.cache.v[layer][:, :, :240], eager.cache.v[layer][:, :, :240])


def test_prepare_captures_what_a_request_below_its_end_replays():
    """Engine.prepare before serving: a request whose context stays below `end` replays only
    graphs captured before it (none is captured inside it) and gives the same tokens."""
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=24, std=0.08)
    prompt = torch.randint(0, cfg.vocab_size, (150,),
                           generator=torch.Generator().manual_seed(6)).tolist()
    cold = Engine(model, max_context=1024)
    want = cold.generate(prompt, 200, NGramDrafter()).tokens
    warm = Engine(model, max_context=1024)
    assert warm.prepare(NGramDrafter(), 150 + 200 + 64) == len(warm.runner.slots)
    graphs = {key: s.graph for key, s in warm.runner.slots.items()}
    assert all(g is not None for g in graphs.values())
    assert warm.generate(prompt, 200, NGramDrafter()).tokens == want
    assert {key: s.graph for key, s in warm.runner.slots.items()} == graphs
