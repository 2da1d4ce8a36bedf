"""The split-KV attention kernel on CUDA in bf16 (kernels/attention/decode.py) against the
fp32 reference and SDPA with the step's mask, at the 27B-class config's head shape for every
T bucket and two KV lengths; replayed from a CUDA graph it equals a direct call bit for bit;
and the compiled engine with the kernel and fused projections stays close to the eager
static forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from stock import compiled as C
from stock.config import PRESETS
from stock.engine import Engine
from stock.fused import fused_gate_up, fused_qkv
from stock.graphs import GraphRunner
from stock.model import Transformer
from stock.options import Options
from stock.body import step_mask

# kernels.attention is imported inside the tests: on a CPU machine this module is collected
# (then skipped), and importing Triton kernels here, before the CPU tests set
# TRITON_INTERPRET=1, would build them for a GPU driver there is not.


@pytest.mark.parametrize("kv_len", [640, 4096])
@pytest.mark.parametrize("t", [1, 2, 4, 8, 16, 32, 64])
def test_bf16_against_reference_and_sdpa(t, kv_len):
    from kernels.attention import decode_attention, reference_attention

    gen = torch.Generator(device="cuda").manual_seed(t * 7 + kv_len)
    hkv, g, d = 8, 8, 128
    q = torch.randn(1, hkv, g * t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, hkv, kv_len + 64, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, hkv, kv_len + 64, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    positions = torch.arange(kv_len - t - 5, kv_len - 5, device="cuda")
    got = decode_attention(q, k, v, positions, kv_len).float()
    want = reference_attention(q.float(), k.float(), v.float(), positions, kv_len)
    mask = step_mask(positions, kv_len, q.dtype).repeat(g, 1).view(1, 1, g * t, kv_len)
    sdpa = F.scaled_dot_product_attention(q, k[:, :, :kv_len], v[:, :, :kv_len],
                                          attn_mask=mask).float()
    err, sdpa_err = (got - want).abs().max().item(), (sdpa - want).abs().max().item()
    assert err <= max(2 * sdpa_err, 1e-2), (err, sdpa_err)


def test_graph_replay_equals_direct_call():
    from kernels.attention import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, 8, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    positions = torch.tensor([700], device="cuda")
    want = decode_attention(q, k, v, positions, 768)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        decode_attention(q, k, v, positions, 768)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, positions, 768)
    graph.replay()
    assert torch.equal(out, want)
    positions.fill_(300)  # read on the device at replay: a new step, same graph
    graph.replay()
    assert torch.equal(out, decode_attention(q, k, v, positions, 768))
    assert not torch.equal(out, want)


def test_engine_default_fuses_and_uses_the_kernel_close_to_eager():
    cfg = dataclasses.replace(PRESETS["tiny-qwen3"], num_layers=3, head_dim=32)
    model = Transformer.random(cfg, "cuda", torch.bfloat16, seed=41, std=0.08)
    eng = Engine(model, max_context=256)
    assert eng.attention == "triton" and eng.runner.attention == "triton"
    assert eng.fused and eng.runner.fused
    assert all(fused_qkv(l.self_attn) is not None and fused_gate_up(l.mlp) is not None
               for l in model.model.layers)
    gen = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, cfg.vocab_size, (50,), generator=gen).tolist()
    cache = model.new_cache(eng.cache.max_len)
    for c in (cache, eng.cache):  # the same context in both
        model(torch.tensor([prompt], device="cuda"), c, 0, logits="none")
    eager = GraphRunner(model, cache, 256, capture=False)
    for t in (1, 5, 16):
        ids = torch.randint(0, cfg.vocab_size, (t,), generator=gen).tolist()
        want = eager.step(ids, len(prompt)).logits[:t].clone()
        got = eng.runner.step(ids, len(prompt)).logits[:t].clone()
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 2e-2, (t, rel)
    assert not C.fallbacks()
    off = Engine(model, Options({"attention_kernel": "sdpa", "fuse_projections": False}),
                 max_context=256)
    assert off.attention == "sdpa" and not off.runner.fused  # the model stays fused: unused
    assert eng.generate(prompt, 16).tokens and off.generate(prompt, 16).tokens


@pytest.mark.parametrize("t", [2, 8, 16, 64])
def test_a_row_does_not_depend_on_the_step_s_row_count(t):
    """bf16 on the GPU: token i of a T-token step gets the bits of a 1-token step at its
    position (what keeps speculative outputs equal to AR's)."""
    from kernels.attention import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(t)
    hkv, g, d, kv_len = 8, 8, 128, 640
    q = torch.randn(1, hkv, g * t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, hkv, kv_len, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    positions = torch.arange(500, 500 + t, device="cuda")
    many = decode_attention(q, k, v, positions, kv_len)
    for i in range(t):
        rows = torch.arange(g, device="cuda") * t + i
        one = decode_attention(q[:, :, rows].contiguous(), k, v, positions[i:i + 1], kv_len)
        assert torch.equal(one, many[:, :, rows]), i


@pytest.mark.parametrize("t", [1, 8, 16])
def test_split_queries_read_in_place_equal_the_folded_copy(t):
    """bf16 on the GPU: queries given as the [B, Hkv, G, T, D] view of [B, T, H, D]
    (stock/body.py's split_heads) give bit for bit what their folded copy gives, batched
    and merged as the compiled step calls the kernel."""
    from types import SimpleNamespace

    from kernels.attention import decode_attention
    from stock.body import fold, split_heads

    gen = torch.Generator(device="cuda").manual_seed(t)
    b, hkv, g, d, kv_len = 4, 8, 8, 128, 640
    attn = SimpleNamespace(h=hkv * g, hkv=hkv, d=d)
    natural = torch.randn(b, t, hkv * g, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b + 1, hkv, kv_len, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    pos = torch.tensor([[500], [7], [300], [100]], device="cuda") + torch.arange(t, device="cuda")
    rows = torch.tensor([4, 0, 2, 1], device="cuda")
    heads = natural.transpose(1, 2)
    want = decode_attention(fold(attn, heads), k, v, pos, kv_len, rows_of=rows, merged=True)
    got = decode_attention(split_heads(attn, heads), k, v, pos, kv_len, rows_of=rows,
                           merged=True)
    assert torch.equal(got, want)
