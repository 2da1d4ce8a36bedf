"""W12Linear and convert_model on the CPU: decode at load, logits identical to the bf16 model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stock.w12_linear import W12Linear, convert_model
from stock.config import PRESETS
from stock.model import Transformer


def test_from_linear_is_bit_exact_with_bias():
    torch.manual_seed(0)
    lin = nn.Linear(33, 20, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.view(-1)[::7] = 0  # exceptions
    w12 = W12Linear.from_linear(lin)
    assert torch.equal(w12.decode().view(torch.int16), lin.weight.view(torch.int16))
    x = torch.randn(5, 33).to(torch.bfloat16)
    # the CPU forward is stock's linear (stock/linear.py: W @ x^T for 2-16 rows, as stock's
    # own layers), on the decoded weight: bit for bit what stock's Linear computes
    from stock.linear import linear

    with torch.no_grad():
        assert torch.equal(w12(x), linear(x, lin.weight, lin.bias))
        assert torch.equal(w12(x[:1]), lin(x[:1]))  # one row: F.linear in both
    w12.view = "w8"
    assert not torch.equal(w12(x), linear(x, lin.weight.detach(), lin.bias.detach()))


@pytest.mark.parametrize("include_lm_head", [True, False])
def test_converted_tiny_transformer_gives_identical_logits(include_lm_head):
    cfg = PRESETS["tiny-qwen3"]
    ref = Transformer.random(cfg, "cpu", torch.bfloat16, seed=3)
    net = Transformer.random(cfg, "cpu", torch.bfloat16, seed=3)
    stats = convert_model(net, include_lm_head=include_lm_head)
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    converted = [m for m in net.modules() if isinstance(m, W12Linear)]
    assert len(linears) == (0 if include_lm_head else 1)
    assert stats["linears"] == len(converted) == 7 * cfg.num_layers + int(include_lm_head)
    assert stats["params"] == sum(m.in_features * m.out_features for m in converted)
    assert stats["bytes_before"] == 2 * stats["params"]
    assert stats["bytes_after"] < 0.8 * stats["bytes_before"]
    assert 12.0 <= stats["bits_per_param"] <= 12.2 and stats["cast_to_bf16"] == 0
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    want = ref(ids, ref.new_cache(16, 2), 0).logits
    got = net(ids, net.new_cache(16, 2), 0).logits
    assert torch.equal(got, want)
    # tied embeddings stay intact
    assert torch.equal(net.model.embed_tokens.weight, ref.model.embed_tokens.weight)


def test_engine_option_weights_w12_when_the_entry_is_applied():
    """Memory entry w12-weights: option weights=w12 converts the target at engine build."""
    from stock.engine import Engine
    from stock.options import REGISTRY, Options

    if "weights" not in REGISTRY:
        pytest.skip("option weights comes with the memory entry w12-weights")
    cfg = PRESETS["tiny-qwen3"]
    stock_engine = Engine(Transformer.random(cfg, "cpu", torch.bfloat16, seed=4), Options(), 128)
    w12_engine = Engine(Transformer.random(cfg, "cpu", torch.bfloat16, seed=4),
                        Options({"weights": "w12"}), 128)
    assert not any(isinstance(m, W12Linear) for m in stock_engine.model.modules())
    assert w12_engine.w12_stats["linears"] == 7 * cfg.num_layers + 1
    prompt = list(range(3, 23))
    assert w12_engine.generate(prompt, 12).tokens == stock_engine.generate(prompt, 12).tokens


def test_grouped_conversion_shares_planes_and_keeps_every_output():
    """convert_model(group=True): q/k/v and gate/up become row slices of one W12Linear per
    group (shared planes, each slice decoding to its own weight's bits, the same bytes as
    converting one by one), installed as the layer's fused group; the eager logits stay
    those of the bf16 model; a bf16 fused matrix is dropped; a replaced member disables the
    group; set_kernel and set_view reach the groups."""
    from stock.w12_linear import set_kernel, set_view
    from stock import fused as F_

    cfg = PRESETS["tiny-qwen3"]
    ref = Transformer.random(cfg, "cpu", torch.bfloat16, seed=6)
    net = Transformer.random(cfg, "cpu", torch.bfloat16, seed=6)
    one_by_one = Transformer.random(cfg, "cpu", torch.bfloat16, seed=6)
    for m in (ref, net, one_by_one):  # exceptions in every member
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.k_proj.weight.view(-1)[::11] = 0
                layer.mlp.up_proj.weight.view(-1)[3::13] = 0
    assert F_.fuse_projections(net) == 2 * cfg.num_layers
    stats = convert_model(net, group=True)
    plain = convert_model(one_by_one)  # CPU default: no groups
    assert plain["groups"] == 0 and stats["groups"] == 2 * cfg.num_layers
    assert stats["linears"] == plain["linears"] == 7 * cfg.num_layers + 1
    for key in ("params", "bytes_before", "bytes_after", "exceptions"):
        assert stats[key] == plain[key], key
    attn, mlp = net.model.layers[0].self_attn, net.model.layers[0].mlp
    assert "_fused_weight" not in attn.__dict__ and "_fused_weight" not in mlp.__dict__
    g = F_.fused_qkv(attn)
    assert isinstance(g, W12Linear) and isinstance(F_.fused_gate_up(mlp), W12Linear)
    assert g not in list(net.modules()) and len(F_.groups(net)) == 2 * cfg.num_layers
    row = g.hi.stride(0)
    assert attn.k_proj.hi.data_ptr() == g.hi.data_ptr() + attn.q_proj.out_features * row
    assert attn.k_proj.exc_idx.numel() > 0
    ref_attn = ref.model.layers[0].self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
        want = getattr(ref_attn, name).weight.view(torch.int16)
        assert torch.equal(getattr(attn, name).decode().view(torch.int16), want)
    cat = torch.cat([ref_attn.q_proj.weight, ref_attn.k_proj.weight, ref_attn.v_proj.weight])
    assert torch.equal(g.decode().view(torch.int16), cat.view(torch.int16))
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    want = ref(ids, ref.new_cache(16), 0).logits
    assert torch.equal(net(ids, net.new_cache(16), 0).logits, want)
    x = torch.randn(3, cfg.hidden_size).to(torch.bfloat16)
    parts = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
    torch.testing.assert_close(g(x), parts, atol=1e-2, rtol=1e-2)
    groups = len(F_.groups(net))
    assert set_kernel(net, "gemm") == stats["linears"] + groups and g.kernel == "gemm"
    assert set_view(net, "w8") == stats["linears"] + groups and g.view == "w8"
    with pytest.raises(ValueError):
        set_view(net, "w4")
    attn.k_proj = W12Linear.from_linear(ref_attn.k_proj)  # a member replaced: group off
    assert F_.fused_qkv(attn) is None and F_.fused_gate_up(mlp) is not None


def test_rows_refuses_bad_ranges_and_biases():
    lin = W12Linear.from_linear(nn.Linear(16, 8, bias=False).to(torch.bfloat16))
    part = lin.rows(2, 6)
    assert part.out_features == 4 and torch.equal(part.decode(), lin.decode()[2:6])
    for r0, r1 in ((4, 4), (-1, 3), (0, 9)):
        with pytest.raises(ValueError):
            lin.rows(r0, r1)
    with pytest.raises(ValueError):
        W12Linear.from_linear(nn.Linear(16, 8).to(torch.bfloat16)).rows(0, 4)
