"""Hybrid Gated-DeltaNet targets (Qwen3.5 / Qwen3-Next style): parity with transformers, the
delta rule against transformers' torch fallback, the recurrent state's commit and rollback,
speculative ≡ autoregressive, and bad configurations."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from block_fixtures import one_thread, random_net
from stock.config import PRESETS, ModelConfig
from stock.drafters.block import BlockDrafter
from stock.drafters.draft_model import DraftModelDrafter
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.hybrid_cache import HybridCache, StateError
from stock.model import Transformer
from stock.options import Options
from stock.weights import ModelFileError, load_config

TINY = PRESETS["tiny-hybrid"]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def _rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
def test_logits_match_transformers_on_512_teacher_forced_tokens(tmp_path, arch):
    import transformers

    cfg = dataclasses.replace(TINY, arch=arch)
    hf_cfg = cfg.to_hf()
    cls = "Qwen3_5" if arch == "qwen3_5" else "Qwen3Next"
    conf = getattr(transformers, cls + ("TextConfig" if arch == "qwen3_5" else "Config"))(**hf_cfg)
    torch.manual_seed(0)
    ref = getattr(transformers, cls + "ForCausalLM")(conf).float().eval()
    with torch.no_grad():   # off the init: norms' offsets, decays and conv all non-trivial
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(tmp_path)
    ours = Transformer.from_folder(tmp_path)
    ids = torch.randint(0, cfg.vocab_size, (1, 512), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits.float()
    got = ours(ids, ours.new_cache(512), 0).logits
    assert _rel_err(got, want) <= 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_output_equals_transformers_generate_with_its_cache(tmp_path):
    """Beyond one teacher-forced forward: transformers' cached decode (its recurrent path
    and conv state update) against the engine's AR and speculative steps."""
    import transformers

    torch.manual_seed(0)
    ref = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TINY.to_hf()))
    with torch.no_grad():
        for p in ref.float().eval().parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(tmp_path)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    want = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                        min_new_tokens=16)[0, len(prompt):].tolist()
    model = Transformer.from_folder(tmp_path)
    engine = Engine(model, Options({"draft_len": 4}), 128)
    assert engine.generate(prompt, 16).tokens == want
    assert engine.generate(prompt, 16, DraftModelDrafter(model, 128)).tokens == want
    assert engine.generate(prompt, 16, NGramDrafter(4, 1, 4)).tokens == want


def test_delta_rule_matches_transformers_torch_fallback():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    from kernels.gdn import chunk_reference, recurrent_reference

    gen = torch.Generator().manual_seed(0)
    b, t, hk, hv, d = 2, 100, 2, 4, 16   # 100: one full chunk of 64 and a partial one
    q, k = (torch.randn(b, t, hk, d, generator=gen) for _ in range(2))
    v = torch.randn(b, t, hv, d, generator=gen)
    g = -torch.rand(b, t, hv, generator=gen)
    beta = torch.rand(b, t, hv, generator=gen)
    s0 = 0.1 * torch.randn(b, hv, d, d, generator=gen)
    kw = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want_o, want_s = hf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    chunk_o, chunk_s = hf.torch_chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    for fn in (recurrent_reference, chunk_reference):
        o, s = fn(q, k, v, g, beta, s0)
        assert _rel_err(o, want_o) <= 1e-5 and _rel_err(s, want_s) <= 1e-5
        assert _rel_err(o, chunk_o) <= 1e-5 and _rel_err(s, chunk_s) <= 1e-5


def _ar_state(model, tokens):
    """The cache after feeding `tokens` one at a time (the AR path)."""
    cache = model.new_cache(64)
    for i, tok in enumerate(tokens):
        model(torch.tensor([[tok]]), cache, i)
        cache.commit(i + 1)
    return cache


@pytest.mark.parametrize("accepted", [1, 3, 6])
def test_commit_keeps_exactly_the_state_after_the_accepted_tokens(accepted):
    model = Transformer.random(TINY, seed=2)
    toks = torch.randint(1, 512, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    cache = model.new_cache(64)
    model(torch.tensor([toks[:6]]), cache, 0)
    cache.commit(6)
    model(torch.tensor([toks[6:12]]), cache, 6)   # a verify step of 6, `accepted` kept
    cache.commit(6 + accepted)
    ref = _ar_state(model, toks[:6 + accepted])
    for layer in cache.gdn_layers:
        assert torch.allclose(cache.state[layer], ref.state[layer], atol=1e-5, rtol=0)
        assert torch.allclose(cache.window[layer], ref.window[layer], atol=1e-6, rtol=0)
    nxt = torch.tensor([[7]])
    got = model(nxt, cache, 6 + accepted).logits
    want = model(nxt, ref, 6 + accepted).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_state_rollback_rules():
    model = Transformer.random(TINY, seed=2)
    cache = model.new_cache(64)
    assert isinstance(cache, HybridCache)
    model(torch.tensor([[5, 6, 7, 8]]), cache, 0)
    cache.commit(4)
    cache.mark()
    before = {i: s.clone() for i, s in cache.state.items()}
    model(torch.tensor([[9, 10]]), cache, 4)
    cache.commit(6)
    with pytest.raises(StateError, match="cannot roll back to 5"):
        cache.rollback(5)
    with pytest.raises(StateError, match="must start at the committed length 6"):
        model(torch.tensor([[1]]), cache, 5)
    with pytest.raises(StateError, match="covers 6..8"):
        model(torch.tensor([[1, 2]]), cache, 6)
        cache.commit(9)
    cache.rollback(4)   # the mark
    assert all(torch.equal(cache.state[i], before[i]) for i in before)
    cache.rollback(0)
    assert cache.length == 0 and all(not s.any() for s in cache.state.values())
    with pytest.raises(StateError, match="cannot roll back to 4"):
        cache.rollback(4)   # the mark went with the request


def _prompts():
    gen = torch.Generator().manual_seed(7)
    motif = torch.randint(1, 512, (6,), generator=gen).tolist()
    return [motif * 3 + torch.randint(1, 512, (4,), generator=gen).tolist(),
            torch.randint(1, 512, (20,), generator=gen).tolist()]


def _check(engine, drafter, want, new):
    steps = []
    for prompt, ref in zip(_prompts(), want):
        res = engine.generate(prompt, new, drafter)
        assert res.tokens == ref
        steps += res.accepted
    return steps


def test_speculative_equals_autoregressive_on_the_tiny_hybrid():
    model = Transformer.random(TINY, seed=4, std=0.08)
    new, k = 24, 4
    engine = Engine(model, Options({"draft_len": k}), 256)
    want = [engine.generate(p, new).tokens for p in _prompts()]
    assert all(len(w) == new for w in want)
    # the target drafting for itself: every draft accepted (steps of k + 1)
    steps = _check(engine, DraftModelDrafter(model, 256), want, new)
    assert max(steps) == k + 1
    # another model's drafts: steps that accept nothing (1: the target's own token)
    other = Transformer.random(TINY, seed=9, std=0.08)
    steps = _check(engine, DraftModelDrafter(other, 256), want, new)
    assert min(steps) == 1
    _check(engine, NGramDrafter(4, 1, 4), want, new)
    # the block drafter reads the hybrid target's hidden states as on a dense one
    net = random_net(model)
    _check(engine, BlockDrafter(net, model, 256, 4), want, new)


def test_a_truncated_hybrid_draft_model_re_feeds_from_its_mark():
    model = Transformer.random(TINY, seed=4, std=0.08)
    engine = Engine(model, Options({"draft_len": 3}), 256)
    want = [engine.generate(p, 20).tokens for p in _prompts()]
    _check(engine, DraftModelDrafter(model, 256, num_layers=2), want, 20)


def _hf(**change):
    return {**TINY.to_hf(), **change}


def test_bad_hybrid_configs_are_one_line_errors(tmp_path):
    cases = {
        "moe": ({**_hf(model_type="qwen3_next", num_experts=8), "mlp_only_layers": []},
                r"sparse-MoE MLPs are not supported \(layers \[0, 1, 2, 3\] of 4\)"),
        "kind": (_hf(layer_types=["linear_attention", "mamba", "linear_attention",
                                  "full_attention"]),
                 r"unsupported layer type 'mamba' at layer 1; supported: full_attention"),
        "count": (_hf(layer_types=["full_attention"]), "layer_types lists 1 layers; the model has 4"),
        "heads": (_hf(linear_num_value_heads=3), "multiple of linear_num_key_heads"),
    }
    for name, (hf, pattern) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf))
        with pytest.raises(ModelFileError, match=pattern) as err:
            load_config(folder)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="need a hybrid architecture"):
        dataclasses.replace(PRESETS["tiny-qwen3"], layer_types=["linear_attention"] * 2)


def test_the_vision_language_checkpoint_layout_loads_its_language_model():
    hf = {"model_type": "qwen3_5", "text_config": TINY.to_hf()}
    assert ModelConfig.from_hf(hf) == TINY
    model = Transformer.random(TINY, seed=1)
    state = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
             for k, v in model.state_dict().items()}
    state["model.visual.patch.weight"] = torch.zeros(2)
    state["mtp.fc.weight"] = torch.zeros(2)
    again = Transformer.from_state_dict(TINY, state)
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(again(ids, again.new_cache(8), 0).logits,
                       model(ids, model.new_cache(8), 0).logits)


def test_trees_are_refused_on_gdn_layers():
    model = Transformer.random(TINY, seed=1)
    with pytest.raises(Exception, match="not supported on it"):
        model(torch.tensor([[1, 2]]), model.new_cache(8), 0, positions=torch.tensor([0, 1]),
              mask=torch.ones(2, 2, dtype=torch.bool))


def test_static_steps_equal_the_dynamic_forward_on_the_tiny_hybrid():
    """The graph path's logic on CPU (static=True runs the static forward eagerly): padded
    buckets, prefill in chunks of 64 with a commit per chunk, the slot handing its GDN
    staging back to the cache; outputs equal the dynamic engine's."""
    model = Transformer.random(TINY, seed=4, std=0.08)
    dynamic = Engine(model, Options({"draft_len": 4}), 256)
    static = Engine(model, Options({"draft_len": 4}), 256, static=True, capture=False)
    assert static.runner is not None and dynamic.runner is None
    long_prompt = torch.randint(1, 512, (150,), generator=torch.Generator().manual_seed(2))
    for prompt in [*_prompts(), long_prompt.tolist()]:   # 150: chunks 64 + 64 + 22 (padded)
        want = dynamic.generate(prompt, 20).tokens
        assert static.generate(prompt, 20).tokens == want
        for drafter in (DraftModelDrafter(model, 256), NGramDrafter(4, 1, 4)):
            assert static.generate(prompt, 20, drafter).tokens == want
