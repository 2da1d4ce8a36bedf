"""The engine on CUDA: bf16 weights, fp32 logits, speculative ≈ autoregressive up to near-ties."""

from __future__ import annotations

import torch

from stock.config import PRESETS
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.model import Transformer


def test_bf16_model_returns_fp32_logits_close_to_fp32_model():
    cfg = PRESETS["tiny-qwen3"]
    ref = Transformer.random(cfg, "cpu", torch.float32, seed=11)
    gpu = Transformer.from_state_dict(cfg, ref.state_dict(), "cuda", torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    want = ref(ids, ref.new_cache(64), 0).logits
    got = gpu(ids.cuda(), gpu.new_cache(64), 0).logits
    assert got.dtype == torch.float32 and got.device.type == "cuda"
    rel = ((got.cpu() - want).norm() / want.norm()).item()
    assert rel < 2e-2


def test_speculative_diverges_from_autoregressive_only_at_near_ties():
    cfg = PRESETS["tiny-qwen3"]
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=12, std=0.08)
    engine = Engine(model, max_context=512)
    prompt = [int(t) for t in torch.randint(0, cfg.vocab_size, (40,),
                                            generator=torch.Generator().manual_seed(1))]
    prompt = prompt + prompt  # repetition gives the n-gram drafter something to find
    ar = engine.generate(prompt, 96).tokens
    spec = engine.generate(prompt, 96, NGramDrafter()).tokens
    first = next((i for i, (a, b) in enumerate(zip(ar, spec)) if a != b), None)
    if first is not None:
        margin = engine.force(prompt, ar, chunk=1).margin[first]
        assert margin <= 0.25, f"divergence at {first} with reference margin {margin}"
