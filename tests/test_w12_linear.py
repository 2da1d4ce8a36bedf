"""W12Linear and convert_model on the CPU: decode at load, logits identical to the bf16 model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.w12.linear import W12Linear, convert_model
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
    assert torch.equal(w12(x), lin(x))
    w12.view = "w8"
    assert not torch.equal(w12(x), lin(x))


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
