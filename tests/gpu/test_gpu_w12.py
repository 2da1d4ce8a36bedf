"""W12 on CUDA: GPU encoder == CPU encoder bit for bit; fused GEMM (bf16) vs references."""

from __future__ import annotations

import pytest
import torch

from kernels.w12 import encode


def _close(y, r):
    y, r = y.float(), r.float()
    rel = ((y - r).norm() / r.norm().clamp_min(1e-30)).item()
    assert rel < 1e-2, rel


def test_gpu_encoder_matches_cpu_encoder():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 1000, generator=g) * 0.02).to(torch.bfloat16)
    w.view(-1)[::997] = 0
    a, b = encode(w), encode(w.cuda())
    for name in ("hi", "lo", "base", "exc_idx", "exc_val"):
        assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    assert torch.equal(b.decode().view(torch.int16).cpu(), w.view(torch.int16))


@pytest.mark.parametrize("m", [1, 8, 33, 64])
@pytest.mark.parametrize("view", ["w12", "w8"])
def test_fused_gemm_bf16(m, view):
    from kernels.w12.gemm import w12_matmul
    from kernels.w12.reference import w12_matmul_ref

    g = torch.Generator(device="cuda").manual_seed(m)
    w = (torch.randn(1536, 1024, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w.view(-1)[::501] = 0  # exceptions in many tiles
    t = encode(w)
    x = torch.randn(m, 1024, device="cuda", generator=g).to(torch.bfloat16)
    _close(w12_matmul(x, t, view), w12_matmul_ref(x, t, view))


@pytest.mark.parametrize("m", [1, 3, 16, 40])
@pytest.mark.parametrize("view", ["w12", "w8"])
def test_gemv_bf16_every_config_of_each_bucket(m, view):
    """Every candidate of the bucket in the W12 view (the tuner may pick any), the first in
    the W8 view."""
    from kernels.w12 import gemv
    from kernels.w12.reference import w12_matmul_ref

    g = torch.Generator(device="cuda").manual_seed(m)
    w = (torch.randn(1536, 1024, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w.view(-1)[::501] = 0
    t = encode(w)
    x = torch.randn(m, 1024, device="cuda", generator=g).to(torch.bfloat16)
    ref = w12_matmul_ref(x, t, view)
    configs = gemv.CONFIGS[gemv.bucket(m)]
    for cfg in configs if view == "w12" else configs[:1]:
        y = gemv.w12_gemv(x, t, view, cfg)
        _close(y, ref)
        assert torch.equal(y, gemv.w12_gemv(x, t, view, cfg))  # no atomics: run to run equal


def test_gemv_tuned_odd_k_and_generic_x():
    """Odd K: x read per element (not as pairs), K mask on; the M = 1 bucket tuned."""
    from kernels.w12 import gemv
    from kernels.w12.reference import w12_matmul_ref

    g = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn(640, 999, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w.view(-1)[::333] = 0
    t = encode(w)
    x = torch.randn(1, 999, device="cuda", generator=g).to(torch.bfloat16)
    _close(gemv.w12_gemv(x, t), w12_matmul_ref(x, t))
    assert gemv.chosen(1, t, "w12", x.dtype) in gemv.CONFIGS[1]


@pytest.mark.parametrize("kernel", ["gemm", "gemv", "auto"])
def test_converted_model_on_cuda_runs_the_fused_kernel_close_to_bf16(kernel):
    from kernels.w12.ops import chosen_kernels
    from stock.w12_linear import W12Linear, convert_model, set_kernel
    from stock.config import PRESETS
    from stock.model import Transformer

    cfg = PRESETS["tiny-qwen3"]
    ref = Transformer.random(cfg, "cuda", torch.bfloat16, seed=5)
    net = Transformer.random(cfg, "cuda", torch.bfloat16, seed=5)
    stats = convert_model(net)
    assert stats["linears"] == 7 * cfg.num_layers + 1
    assert stats["groups"] == 2 * cfg.num_layers  # q/k/v and gate/up fused on CUDA
    assert set_kernel(net, kernel) == stats["linears"] + stats["groups"]
    lin = next(m for m in net.modules() if isinstance(m, W12Linear))
    assert lin._dense is None and lin.hi.is_cuda  # the fused path, no dense copy
    ids = torch.randint(0, cfg.vocab_size, (1, 40), device="cuda")
    want = ref(ids, ref.new_cache(64), 0).logits
    got = net(ids, net.new_cache(64), 0).logits
    _close(got, want)
    if kernel == "auto":   # every shape met got a timed choice of one of the two kernels
        picks = chosen_kernels()
        assert picks and set(picks.values()) <= {"gemm", "gemv"}


def test_w12_linear_under_torch_compile_is_one_op_with_eager_results():
    """Under torch.compile a W12Linear is the custom op specpilot_w12::matmul (fullgraph:
    no break), running the same kernels as the eager forward."""
    from torch import nn

    from stock.w12_linear import W12Linear

    torch.manual_seed(0)
    lin = W12Linear.from_linear(nn.Linear(1000, 768, bias=False).to("cuda", torch.bfloat16))
    x = torch.randn(4, 1000, device="cuda").to(torch.bfloat16)
    eager = lin(x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v: lin(v * 2) + 1, fullgraph=True)(x)
    assert torch.equal(compiled, lin(x * 2) + 1)
    assert torch.equal(lin(x), eager)


def test_grouped_w12_in_the_compiled_step_matches_one_by_one():
    """W12 groups on CUDA (stock/w12_linear.py): a group's GEMV equals its members'
    outputs side by side (bf16 rounding of another split-K plan at most), and the compiled
    static forward with `fused` (one GEMV per group) gives the logits of the same forward
    without (one GEMV per module) to bf16 rounding."""
    from stock.w12_linear import convert_model
    from stock import fused as F_
    from stock.config import PRESETS
    from stock.model import Transformer
    from stock.static_step import static_forward

    cfg = PRESETS["tiny-qwen3"]
    net = Transformer.random(cfg, "cuda", torch.bfloat16, seed=9)
    stats = convert_model(net)
    assert stats["groups"] == 2 * cfg.num_layers
    attn = net.model.layers[1].self_attn
    g = F_.fused_qkv(attn)
    x = torch.randn(3, cfg.hidden_size, device="cuda").to(torch.bfloat16)
    parts = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
    _close(g(x), parts)
    ids = torch.randint(0, cfg.vocab_size, (1, 6), device="cuda")
    pos = torch.arange(20, 26, device="cuda")
    outs = []
    for fused in (True, False):
        cache = net.new_cache(96)
        net(torch.arange(1, 21, device="cuda").view(1, 20), cache, 0, logits="none")
        outs.append(static_forward(net, ids, pos, cache, 64, (), compiled=True,
                                   fused=fused).logits)
    _close(outs[0], outs[1])
