"""Hybrid GDN targets on CUDA: flash-linear-attention against the plain-PyTorch delta rule,
and generation from captured steps giving the eager static steps' tokens."""

from __future__ import annotations

import pytest
import torch

from kernels.gdn import chunk_reference, fla_available, recurrent_reference
from kernels.gdn.ops import chunk_rule, recurrent_rule
from stock.config import PRESETS
from stock.drafters.draft_model import DraftModelDrafter
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options

TINY = PRESETS["tiny-hybrid"]


def _inputs(t, dtype, seed=0, hk=4, hv=8, d=128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(1, t, hk, d, device="cuda", generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(1, t, hv, d, device="cuda", generator=gen, dtype=dtype)
    g = -torch.rand(1, t, hv, device="cuda", generator=gen)
    beta = torch.rand(1, t, hv, device="cuda", generator=gen).to(dtype)
    s0 = 0.1 * torch.randn(1, hv, d, d, device="cuda", generator=gen)
    return q, k, v, g, beta, s0


@pytest.mark.skipif(not fla_available(), reason="flash-linear-attention is not installed")
@pytest.mark.parametrize("t", [1, 8, 16, 64, 300])
def test_fla_matches_the_reference_on_random_inputs(t):
    # fla runs its fp32 products in TF32 (Triton's default): about 1e-3 apart, not 1e-5
    for dtype, tol in ((torch.float32, 3e-3), (torch.bfloat16, 2e-2)):
        args = _inputs(t, dtype)
        want_o, want_s = recurrent_reference(*[a.float() for a in args])
        for fn in (chunk_rule, recurrent_rule):
            o, s = fn(*args)
            assert float((o.float() - want_o).abs().max() / want_o.abs().max()) <= tol, fn
            assert float((s - want_s).abs().max() / want_s.abs().max()) <= tol, fn
    o, _ = chunk_reference(*_inputs(t, torch.float32))   # the reference itself on CUDA
    assert o.isfinite().all()


@pytest.mark.skipif(not fla_available(), reason="flash-linear-attention is not installed")
def test_verify_steps_up_to_recurrent_max_t_run_the_recurrent_kernel():
    """chunk_rule below its limit is fla's fused recurrent kernel, bit for bit; above it the
    chunked kernel (which rounds differently)."""
    args = _inputs(16, torch.bfloat16, seed=3)
    rec_o, rec_s = recurrent_rule(*args)
    o, s = chunk_rule(*args, recurrent_max_t=16)
    assert torch.equal(o, rec_o) and torch.equal(s, rec_s)
    o, _ = chunk_rule(*args, recurrent_max_t=8)
    assert not torch.equal(o, rec_o)


def test_captured_hybrid_steps_give_the_eager_static_steps_tokens():
    """Replayed graphs run the eager static step's kernels: the same tokens, AR and
    speculative. Speculative against AR is reported, not demanded: the verify step runs
    fla's chunked kernel and AR its fused recurrent one, which round bf16 differently (on
    the H200, 2026-12-01, this random tiny target diverged at a near-tie by token 4)."""
    model = Transformer.random(TINY, "cuda", torch.bfloat16, seed=4, std=0.08)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (12, 90)]
    dynamic = Engine(model, Options({"draft_len": 4}), 256, static=False)
    graphs = Engine(model, Options({"draft_len": 4}), 256)
    eager = Engine(model, Options({"draft_len": 4}), 256, static=True, capture=False)
    assert graphs.uses_graphs and dynamic.runner is None
    for prompt in prompts:
        want = eager.generate(prompt, 32).tokens
        assert graphs.generate(prompt, 32).tokens == want          # AR, replayed
        spec = graphs.generate(prompt, 32, DraftModelDrafter(model, 256))
        spec_eager = eager.generate(prompt, 32, DraftModelDrafter(model, 256))
        assert spec.tokens == spec_eager.tokens and spec.accepted == spec_eager.accepted
        assert max(spec.accepted) == 5                             # whole drafts accepted
        print("speculative == AR:", spec.tokens == want,
              "dynamic == static:", dynamic.generate(prompt, 32).tokens == want)


@pytest.mark.parametrize("t", [1, 16])
def test_compiled_hybrid_regions_run_inductor_and_are_as_near_the_truth_as_the_eager_step(t):
    """stock/compiled.py's hybrid layers through inductor (the CPU tests trace with dynamo's
    eager backend, and one runs inductor's C++ code): no region falls back, and the step's
    bf16 logits and GDN states are no farther from the fp32 step of the same
    (bf16-representable) weights than the uncompiled bf16 step's are. Not "close to the
    eager bf16 step": the hybrid's bf16 rounding alone puts both 3-8e-2 off the truth
    (tests/test_compiled_hybrid.py's inductor test, CPU), so the two bf16 steps differ by
    that much without any fault; a fault (a stale state, a dropped gate) is off by the
    values' own size."""
    from stock import compiled as C
    from stock.fused import fuse_projections
    from stock.static_step import static_forward

    bf = Transformer.random(TINY, "cuda", torch.bfloat16, seed=4, std=0.08)
    f32 = Transformer.random(TINY, "cuda", torch.float32, seed=4, std=0.08)
    with torch.no_grad():
        for p, q in zip(f32.parameters(), bf.parameters()):
            p.copy_(q.float())
    assert fuse_projections(bf) == 2 * TINY.num_layers   # the compiled step's one GEMMs
    gen = torch.Generator().manual_seed(6)
    ctx = torch.randint(1, 512, (1, 40), generator=gen).cuda()
    ids = torch.randint(1, 512, (1, t), generator=gen).cuda()
    outs = []
    for model, compiled, fused in ((f32, False, False), (bf, False, True), (bf, True, True)):
        cache = model.new_cache(128)
        with torch.inference_mode():
            model(ctx, cache, 0)
            cache.commit(40)
            out = static_forward(model, ids, torch.arange(40, 40 + t, device="cuda"), cache,
                                 64, (), compiled=compiled, fused=fused)
        cache.commit(40 + t)
        outs.append((out.logits.float(), {i: s.float() for i, s in cache.state.items()}))
    assert not C.fallbacks() and C.graphs_compiled() > 0
    (truth, truth_state), (eager, eager_state), (got, state) = outs

    def off(x, ref):
        return float((x - ref).abs().max() / ref.abs().max())

    assert off(got, truth) <= 2 * off(eager, truth) + 1e-3, (off(got, truth), off(eager, truth))
    for layer, s in truth_state.items():
        assert off(state[layer], s) <= 2 * off(eager_state[layer], s) + 1e-3, layer
