"""The static-shape forward (the CUDA-graph path) against the dynamic forward, on CPU fp32."""

from __future__ import annotations

import pytest
import torch

from stock.config import PRESETS
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.graphs import GraphError, GraphRunner, kv_buckets
from stock.model import Transformer
from stock.options import Options
from stock.profile import Profiler
from stock.static_step import static_forward


@pytest.fixture(scope="module")
def tiny():
    return Transformer.random(PRESETS["tiny-qwen3"], seed=7, std=0.08)


def _compare(model, ids, start, t, padded, kv_len, junk_seed=0):
    """Dynamic forward of ids[start:start+t] against the static forward of the same tokens
    padded to `padded`, both over a cache prefilled with ids[:start] by the dynamic forward.
    The static cache also holds junk past `start`, which the mask must hide."""
    cache_d, cache_s = model.new_cache(160), model.new_cache(160)
    if start:
        model(ids[:, :start], cache_d, 0, logits="none")
        model(ids[:, :start], cache_s, 0, logits="none")
    gen = torch.Generator().manual_seed(junk_seed)
    for buf in cache_s.k + cache_s.v:
        buf[:, :, start:] = torch.randn(buf[:, :, start:].shape, generator=gen)
    layers = (0, model.cfg.num_layers - 1)
    want = model(ids[:, start:start + t], cache_d, start, hidden_layers=layers)
    step = torch.cat([ids[:, start:start + t], ids[:, :padded - t]], dim=1)  # any padding ids
    positions = torch.arange(start, start + padded)
    got = static_forward(model, step, positions, cache_s, kv_len, hidden_layers=layers)
    assert got.logits.shape == (1, padded, model.cfg.vocab_size)
    torch.testing.assert_close(got.logits[:, :t], want.logits, atol=1e-4, rtol=1e-5)
    assert torch.equal(got.logits[0, :t].argmax(-1), want.logits[0].argmax(-1))
    for layer in layers:
        assert _rel(got.hidden[layer][:, :t], want.hidden[layer]) < 1e-5
    # the real tokens' K/V landed where the dynamic forward put them
    for layer in range(model.cfg.num_layers):
        assert _rel(cache_s.k[layer][:, :, :start + t], cache_d.k[layer][:, :, :start + t]) < 1e-5
        assert _rel(cache_s.v[layer][:, :, :start + t], cache_d.v[layer][:, :, :start + t]) < 1e-5


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


CASES = [(1, 1), (4, 4), (4, 8), (9, 9), (9, 16)]  # (real tokens, padded length)


@pytest.mark.parametrize("t,padded", CASES)
@pytest.mark.parametrize("start", [0, 5, 37])
def test_static_forward_matches_dynamic_tiny_qwen3(tiny, t, padded, start):
    ids = torch.randint(0, tiny.cfg.vocab_size, (1, 80), generator=torch.Generator().manual_seed(1))
    _compare(tiny, ids, start, t, padded, kv_len=start + t, junk_seed=start)
    _compare(tiny, ids, start, t, padded, kv_len=160, junk_seed=start + 1)  # whole cache


@pytest.mark.parametrize("t,padded,start", [(1, 1, 29), (4, 8, 3), (9, 16, 17)])
def test_static_forward_matches_dynamic_embedded(smol, dev_prompts, t, padded, start):
    model = smol.engine.model
    ids = torch.tensor([dev_prompts[0][:64]])
    _compare(model, ids, start, t, padded, kv_len=64)


def test_buckets():
    assert kv_buckets(1088) == (256, 512, 1024, 1088)
    assert kv_buckets(200) == (200,)
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=1)
    runner = GraphRunner(model, model.new_cache(128 + 64), 128)
    assert not runner.capture  # CPU: the static forward runs eagerly
    assert [runner.bucket(t) for t in (1, 2, 3, 9, 17, 64)] == [1, 2, 4, 16, 32, 64]
    with pytest.raises(GraphError, match="largest bucket"):
        runner.bucket(65)
    with pytest.raises(GraphError, match="slack"):
        GraphRunner(model, model.new_cache(128), 128)
    with pytest.raises(GraphError, match="CUDA"):
        GraphRunner(model, model.new_cache(192), 128, capture=True)
    # a slot's input: ids padded with the last id to its T, then start and k
    slot = runner.slot(runner.bucket(3), runner.kv_bucket(13))
    runner.load(slot, [7, 8, 9], 10)
    assert slot.inp.tolist() == [7, 8, 9, 9, 10, 2]
    runner.load(slot, [5], 11, k=0)
    assert slot.inp.tolist() == [5, 5, 5, 5, 11, 0]
    with pytest.raises(GraphError):
        runner.load(slot, [1, 2, 3, 4, 5], 0)


def test_device_acceptance_counts_the_matching_prefix(tiny):
    prompt = list(range(10, 30))
    ar = Engine(tiny, max_context=128).generate(prompt, 12).tokens  # the greedy continuation
    cache = tiny.new_cache(128 + 64)
    runner = GraphRunner(tiny, cache, 128)
    tiny(torch.tensor([prompt]), cache, 0, logits="none")
    start = len(prompt)
    for good in range(0, 6):
        wrong = (ar[good + 1] + 1) % tiny.cfg.vocab_size
        chain = ar[1:good + 1] + [wrong] + ar[good + 2:8]
        out = runner.step([ar[0]] + chain, start)
        got = out.packed[: len(chain) + 2].tolist()
        assert got[0] == good
        assert got[1:good + 2] == ar[1:good + 2]  # the target's tokens, bonus included
        assert got[1:] == out.logits[: len(chain) + 1].argmax(-1).tolist()
    out = runner.step(ar[:8], start, k=3)  # a fully correct chain, acceptance capped at k
    assert out.packed[0].item() == 3
    out = runner.step(ar[:8], start)
    assert out.packed[0].item() == 7


def test_engine_static_path_equals_dynamic_path(tiny):
    gen = torch.Generator().manual_seed(2)
    prompt = [int(t) for t in torch.randint(0, tiny.cfg.vocab_size, (30,), generator=gen)] * 2
    dynamic = Engine(tiny, max_context=256)
    static = Engine(tiny, max_context=256, static=True)
    assert static.runner is not None and not static.uses_graphs and dynamic.runner is None
    ar = dynamic.generate(prompt, 60).tokens
    assert static.generate(prompt, 60).tokens == ar
    spec = static.generate(prompt, 60, NGramDrafter())
    assert spec.tokens == ar and spec.tau > 1.0
    ref = dynamic.force(prompt, ar, chunk=9)
    got = static.force(prompt, ar, chunk=9)
    assert got.argmax == ref.argmax
    assert max(abs(a - b) for a, b in zip(got.margin, ref.margin)) < 1e-4
    # the test-only fault still reaches the static path's logits
    faulty = Engine(tiny, Options({"fault_logit_bias_after": 5}), 256, static=True)
    assert faulty.generate(prompt, 20).tokens[5:] != ar[5:20]
    # the static forward reports its kernels to the profiler
    prof = Profiler("cpu")
    assert static.generate(prompt, 8, profiler=prof).tokens == ar[:8]
    per_step = prof.report()["per_step_ms"]
    assert per_step["gemm"] > 0 and per_step["attention"] > 0
    # a shared cache without padding slack drops to the dynamic path
    static.cache = dynamic.cache
    assert static.runner is None and static.generate(prompt, 20).tokens == ar[:20]


@pytest.mark.slow
def test_engine_static_path_speculative_equals_ar_embedded(smol, dev_prompts, ar_32):
    model = smol.engine.model
    engine = Engine(model, max_context=1024, stop_ids=smol.engine.stop_ids, static=True)
    prompt = dev_prompts[0]
    # the dynamic path's greedy output (conftest.ar_32: recorded, and checked against the
    # engine by tests/test_greedy_recorded.py), whose first 24 are a greedy prefix
    ar = ar_32[0][:24]
    assert len(ar) == 24
    assert engine.generate(prompt, 24).tokens == ar
    spec = engine.generate(prompt, 24, NGramDrafter())
    assert spec.tokens == ar


def _prefill_on_and_off(tiny, n: int, seed: int):
    """A random prompt of n tokens prefilled with graph_prefill on and off (static engines):
    the same next token, and hidden states equal in fp32. Returns (prompt, on, off)."""
    gen = torch.Generator().manual_seed(seed)
    prompt = [int(t) for t in torch.randint(0, tiny.cfg.vocab_size, (n,), generator=gen)]
    on = Engine(tiny, max_context=256, static=True)
    off = Engine(tiny, Options({"graph_prefill": False}), 256, static=True)
    layers = (0, tiny.cfg.num_layers - 1)
    p_on, h_on = on._prefill(prompt, layers)
    p_off, h_off = off._prefill(prompt, layers)
    assert p_on == p_off and set(h_on) == set(h_off) == set(layers)
    assert on.cache.length == off.cache.length == n
    for layer in layers:
        assert h_on[layer].shape == h_off[layer].shape == (1, n, tiny.cfg.hidden_size)
        torch.testing.assert_close(h_on[layer], h_off[layer], atol=1e-5, rtol=1e-5)
    assert not off.runner.slots
    return prompt, on, off


def test_graph_prefill_runs_short_prompts_through_the_runner(tiny):
    """Option graph_prefill (on): a prompt that fits a step bucket is prefilled by one of the
    runner's static steps, with the dynamic prefill's next token and hidden states (fp32) and
    the same generated tokens; with the option off, the dynamic forward."""
    prompt, on, off = _prefill_on_and_off(tiny, 37, seed=4)
    assert [s.t for s in on.runner.slots.values()] == [64]  # the prefill's one step
    want = off.generate(prompt, 20, NGramDrafter()).tokens
    assert on.generate(prompt, 20, NGramDrafter()).tokens == want


def test_graph_prefill_chunks_a_long_prompt_through_the_runner(tiny):
    """A prompt longer than the largest step bucket is prefilled in steps of 64 tokens, each
    attending to the ones before through the cache: the dynamic prefill's next token, hidden
    states (fp32) and cache contents, and the same generated tokens; past graph_prefill_max,
    the dynamic forward."""
    prompt, on, off = _prefill_on_and_off(tiny, 150, seed=5)
    for a, b in zip(on.cache.k + on.cache.v, off.cache.k + off.cache.v):
        torch.testing.assert_close(a[:, :, :150], b[:, :, :150], atol=1e-5, rtol=1e-5)
    # steps of 64, 64 and 22 tokens (bucket 32) at starts 0, 64, 128
    assert sorted((s.t, s.kv_len, s.replays) for s in on.runner.slots.values()) == [
        (32, 256, 1), (64, 256, 2)]
    want = off.generate(prompt, 20, NGramDrafter()).tokens
    assert on.generate(prompt, 20, NGramDrafter()).tokens == want
    bounded = Engine(tiny, Options({"graph_prefill_max": 149}), 256, static=True)
    bounded._prefill(prompt, ())  # one token past the bound: the dynamic forward
    assert not bounded.runner.slots


def test_prepare_makes_every_slot_a_request_below_its_end_meets(tiny):
    """Engine.prepare(drafter, end), the judges' untimed step before timing: afterwards a
    request whose context stays below `end` (prefill chunks, every step length, every KV
    bucket) meets no slot it did not make; a request reaching past a smaller `end` does.
    On CUDA the same keys are captured graphs (tests/gpu/test_graphs.py)."""
    gen = torch.Generator().manual_seed(3)
    prompt = [int(t) for t in torch.randint(0, tiny.cfg.vocab_size, (150,), generator=gen)]
    engine = Engine(tiny, max_context=1024, static=True)
    made = engine.prepare(NGramDrafter(), 150 + 200 + 64)
    keys = set(engine.runner.slots)
    assert made == len(keys) > 0
    assert {k[1] for k in keys} == {256, 512}    # the KV buckets below 414
    ar = Engine(tiny, max_context=1024).generate(prompt, 200).tokens
    assert engine.generate(prompt, 200, NGramDrafter()).tokens == ar   # crosses 256 -> 512
    assert engine.generate(prompt, 200).tokens == ar
    assert set(engine.runner.slots) == keys
    short = Engine(tiny, max_context=1024, static=True)
    short.prepare(NGramDrafter(), 200)
    before = set(short.runner.slots)
    short.generate(prompt, 200, NGramDrafter())
    assert set(short.runner.slots) - before   # past its end: new (512) slots
    assert Engine(tiny, max_context=1024).prepare(NGramDrafter(), 400) == 0  # dynamic path
