"""The split-KV attention kernel (kernels/attention/decode.py) under Triton's interpreter
(fp32) against its plain-PyTorch reference and against SDPA with the static step's mask:
several chunks, chunks hidden from every row, two row blocks, a batch of two, KV lengths
short of the cache; its plan, and its errors on bad input."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.attention builds its kernels

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.attention import decode_attention, reference_attention, supported  # noqa: E402
from kernels.attention.decode import BLOCK_N, plan  # noqa: E402
from stock.body import step_mask  # noqa: E402

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)


def _case(b, hkv, g, t, d, slots, kv_len, last, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hkv, g * t, d, generator=gen)
    k = torch.randn(b, hkv, slots, d, generator=gen)
    v = torch.randn(b, hkv, slots, d, generator=gen)
    positions = torch.arange(last - t + 1, last + 1)
    return q, k, v, positions


@pytest.mark.parametrize("b,hkv,g,t,d,slots,kv_len,last", [
    (1, 2, 4, 1, 16, 200, 130, 126),   # 3 chunks; the last one (128, 129) hidden from all rows
    (1, 2, 4, 3, 32, 300, 257, 250),   # T = 3: rows of one token see one key fewer each
    (2, 1, 2, 5, 16, 100, 64, 40),     # a batch of two; most keys hidden
    (1, 1, 8, 9, 16, 256, 256, 255),   # 72 rows: two row blocks
    (1, 2, 2, 1, 64, 64, 17, 0),       # one visible key
])
def test_matches_reference_and_sdpa(b, hkv, g, t, d, slots, kv_len, last):
    q, k, v, positions = _case(b, hkv, g, t, d, slots, kv_len, last)
    got = decode_attention(q, k, v, positions, kv_len)
    want = reference_attention(q, k, v, positions, kv_len)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    mask = step_mask(positions, kv_len, q.dtype).repeat(g, 1).view(1, 1, g * t, kv_len)
    sdpa = F.scaled_dot_product_attention(q, k[:, :, :kv_len], v[:, :, :kv_len], attn_mask=mask)
    torch.testing.assert_close(got, sdpa, atol=2e-5, rtol=2e-5)


def test_keys_past_kv_len_and_hidden_keys_are_never_read():
    """NaN in every slot a row may not see: the output stays finite and unchanged."""
    q, k, v, positions = _case(1, 2, 4, 2, 16, 192, 150, 120)
    want = decode_attention(q, k, v, positions, 150)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 150:], v2[:, :, 150:] = float("nan"), float("nan")
    got = decode_attention(q, k2, v2, positions, 150)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    v3 = v.clone()
    v3[:, :, 121:150] = 1e4  # hidden from every row (positions 119, 120): no effect
    torch.testing.assert_close(decode_attention(q, k, v3, positions, 150), want)


@pytest.mark.parametrize("heads,rows,kv_len,sms", [(8, 8, 640, 132), (8, 128, 4096, 132),
                                                   (1, 1, 1, 132), (64, 512, 100, 8)])
def test_plan_covers_every_key_with_no_empty_chunk(heads, rows, kv_len, sms):
    block_r, chunk, splits = plan(heads, rows, kv_len, sms)
    assert chunk % BLOCK_N == 0 and block_r >= 16
    assert (splits - 1) * chunk < kv_len <= splits * chunk
    assert plan(heads, 1, kv_len, sms) == plan(heads, 4 * rows, kv_len, sms)  # row-invariant


def test_bad_input_is_refused():
    q, k, v, positions = _case(1, 2, 4, 1, 16, 64, 64, 10)
    with pytest.raises(ValueError, match="unsupported"):
        decode_attention(q, k, v, positions, 65)  # past the cache
    with pytest.raises(ValueError, match="unsupported"):
        decode_attention(q, k, v, torch.arange(3), 64)  # 8 rows are not 3 tokens' rows
    with pytest.raises(ValueError, match="disagree"):
        decode_attention(q, k[:, :1], v[:, :1], positions, 64)
    assert supported(128) and supported(16) and not supported(48) and not supported(512)


def test_a_row_does_not_depend_on_the_step_s_row_count():
    """Token i of a 5-token step gets what a 1-token step at its position gets (the AR step
    and a verify step must agree wherever their inputs do): the same tile and chunks (the
    plan); here to the interpreter's BLAS rounding, bit for bit in tests/gpu."""
    g, t = 4, 5
    q, k, v, positions = _case(1, 2, g, t, 16, 260, 200, 180)
    many = decode_attention(q, k, v, positions, 200)
    for i in range(t):
        rows = torch.arange(g) * t + i  # token i's row in each group
        one = decode_attention(q[:, :, rows], k, v, positions[i:i + 1], 200)
        torch.testing.assert_close(one, many[:, :, rows], atol=1e-6, rtol=0)


def _tile_rows_placement_free() -> bool:
    """Whether a row of this machine's tile products is the same bits wherever it sits in
    the tile. The interpreter runs tl.dot as numpy's matmul: on the GPU a tensor-core row
    does not depend on its place (tests/gpu/test_gpu_tree.py), but a CPU BLAS may block a
    64-row tile into micro-panels with different code for the last one (on an AVX-512 CPU,
    2026-12-02, row 10 of a 64 x 16 by 16 x 64 product was 5e-7 off the same row at 3)."""
    gen = torch.Generator().manual_seed(0)
    for m, n in ((16, 64), (64, 16)):     # q . k^T, then p . v
        a, b = torch.randn(64, m, generator=gen).numpy(), torch.randn(m, n, generator=gen).numpy()
        moved = np.zeros_like(a)
        for src, dst in ((10, 3), (3, 40), (63, 0)):
            moved[dst] = a[src]
            if not np.array_equal(np.matmul(a, b)[src], np.matmul(moved, b)[dst]):
                return False
    return True


@pytest.mark.parametrize("t,start,kv_len", [(8, 40, 64), (16, 100, 200), (64, 70, 192),
                                            (8, 300, 330), (8, 62, 200), (16, 64, 140)])
def test_tree_mask_matches_reference_sdpa_and_the_chain_bitwise(t, start, kv_len):
    """A draft tree's step: each node's rows see the context before `start` and its
    ancestors; they equal the reference and SDPA with the tree's mask, and, bit for bit, the
    rows of the same token in a chain step over its root path with that path's K/V in
    place (T = 64: depths past one 64-key tile; start 300: four chunks of context alone,
    which the kernel runs in row blocks of all nodes, one chunk per node; start 62 and 64: a
    chunk ending just past the context, and one ending at it). Bit for bit where
    this machine's tile products are placement-free (the interpreter's tl.dot is numpy's
    matmul), else to 1e-6."""
    from stock.tree import ancestors, tree_table, visibility

    gen = torch.Generator().manual_seed(t)
    parents = torch.tensor([0] + [int(torch.randint(max(0, i - 3), i, (1,), generator=gen))
                                  for i in range(1, t)])
    anc = ancestors(parents)
    depths = anc.sum(1) - 1
    g, d = 2, 16
    q = torch.randn(1, 2, g * t, d, generator=gen)
    k = torch.randn(1, 2, kv_len + 8, d, generator=gen)
    v = torch.randn(1, 2, kv_len + 8, d, generator=gen)
    tree = tree_table(anc, depths, torch.tensor(start))
    slots = start + torch.arange(t)
    got = decode_attention(q, k, v, slots, kv_len, tree=tree)
    want = reference_attention(q, k, v, slots, kv_len, tree=tree)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    seen = visibility(anc, start, kv_len).repeat(g, 1).view(1, 1, g * t, kv_len)
    mask = torch.where(seen, 0.0, float("-inf"))
    sdpa = F.scaled_dot_product_attention(q, k[:, :, :kv_len], v[:, :, :kv_len], attn_mask=mask)
    torch.testing.assert_close(got, sdpa, atol=2e-5, rtol=2e-5)
    deepest = int(depths.argmax())
    path = [j for j in range(t) if anc[deepest, j]]          # root .. deepest, by depth
    kc, vc = k.clone(), v.clone()
    kc[:, :, start:start + len(path)] = k[:, :, start + torch.tensor(path)]
    vc[:, :, start:start + len(path)] = v[:, :, start + torch.tensor(path)]
    rows = [r * t + j for r in range(g) for j in path]        # the path's query rows
    qc = torch.zeros(1, 2, g * len(path), d)
    qc[:, :, [r * len(path) + e for r in range(g) for e in range(len(path))]] = q[:, :, rows]
    chain = decode_attention(qc, kc, vc, start + torch.arange(len(path)), kv_len)
    if _tile_rows_placement_free():
        assert torch.equal(chain, got[:, :, rows])
    else:
        torch.testing.assert_close(chain, got[:, :, rows], atol=1e-6, rtol=0)


def test_a_batched_step_reads_each_request_from_its_own_row_with_its_own_positions():
    """stock/batch.py's step: requests of ragged lengths in rows of one cache, each at its
    own positions; the kernel against the reference and against gathering each request's
    row first (what SDPA needs), and junk in the other rows never read."""
    gen = torch.Generator().manual_seed(3)
    hkv, g, t, d, slots, kv_len = 2, 4, 3, 16, 200, 192
    cache_k = torch.randn(5, hkv, slots, d, generator=gen)
    cache_v = torch.randn(5, hkv, slots, d, generator=gen)
    rows_of = torch.tensor([3, 0, 4])
    starts = torch.tensor([150, 7, 60])
    positions = starts[:, None] + torch.arange(t)
    q = torch.randn(3, hkv, g * t, d, generator=gen)
    got = decode_attention(q, cache_k, cache_v, positions, kv_len, rows_of=rows_of)
    want = reference_attention(q, cache_k, cache_v, positions, kv_len, rows_of=rows_of)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert plan(3 * hkv, g * t, kv_len, 8) == plan(hkv, g * t, kv_len, 8)   # same chunks
    for i, r in enumerate(rows_of.tolist()):   # one request alone, its row only: same bits
        one = decode_attention(q[i:i + 1], cache_k[r:r + 1], cache_v[r:r + 1], positions[i],
                               kv_len)
        torch.testing.assert_close(got[i:i + 1], one, atol=0, rtol=0)
    for other in (1, 2):   # rows no request reads
        cache_k[other], cache_v[other] = float("nan"), float("nan")
    again = decode_attention(q, cache_k, cache_v, positions, kv_len, rows_of=rows_of)
    torch.testing.assert_close(again, got, atol=0, rtol=0)
    with pytest.raises(ValueError, match="batched step"):
        decode_attention(q, cache_k, cache_v, positions[0], kv_len, rows_of=rows_of)


def test_the_compiled_batched_step_runs_the_kernel_on_each_requests_row(monkeypatch):
    """stock/compiled.py's batched step with the kernel (forced here: CUDA only) gives the
    logits of the SDPA path over gathered rows (the interpreter's fp32)."""
    from stock import compiled as C
    from stock.batch_graphs import row_steps
    from stock.config import PRESETS
    from stock.model import Transformer

    model = Transformer.random(PRESETS["tiny-qwen3"], seed=2, std=0.08)
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 512, (2, 4), generator=gen)
    rows, starts = torch.tensor([2, 0]), torch.tensor([30, 9])
    pos, seen = row_steps(starts, 4, 64)
    outs = []
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    try:
        for kernel in (False, True):
            monkeypatch.setattr(C, "uses_kernel", lambda *a, _k=kernel: _k)
            cache = model.new_cache(128, batch=3)
            for x in cache.k + cache.v:
                x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(5)))
            with torch.inference_mode():
                outs.append(C.forward(model, ids, pos, cache, 64, (), attention="triton",
                                      seen=seen, rows=rows).logits)
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)
        assert not C.fallbacks()
    finally:
        C.reset()


def test_the_merged_layout_holds_the_same_bits_as_the_query_head_layout():
    """`merged`: the output written as [B, T, H*D] (what the output projection reads) holds
    bit for bit what stock/body.py's merge makes of the [B, Hkv, G*T, D] output: a chain
    step, a batched step and a tree step; and at T > 1 the two layouts differ in memory
    (the test could fail: a transposed write would put heads and tokens apart)."""
    from types import SimpleNamespace

    from stock.body import merge
    from stock.tree import ancestors, tree_table

    gen = torch.Generator().manual_seed(6)
    hkv, g, t, d = 2, 3, 5, 16
    attn = SimpleNamespace(h=hkv * g, d=d)
    k = torch.randn(4, hkv, 96, d, generator=gen)
    v = torch.randn(4, hkv, 96, d, generator=gen)
    parents = torch.tensor([0, 0, 1, 1, 2])
    anc = ancestors(parents)
    cases = [   # (q, positions, kwargs)
        (torch.randn(1, hkv, g * t, d, generator=gen), torch.arange(40, 40 + t), {}),
        (torch.randn(3, hkv, g * t, d, generator=gen),
         torch.tensor([[50], [7], [20]]) + torch.arange(t), {"rows_of": torch.tensor([3, 0, 2])}),
        (torch.randn(1, hkv, g * t, d, generator=gen), 30 + torch.arange(t),
         {"tree": tree_table(anc, anc.sum(1) - 1, torch.tensor(30))}),
    ]
    for q, pos, kw in cases:
        kk, vv = (k, v) if "rows_of" in kw else (k[:1], v[:1])
        plain = decode_attention(q, kk, vv, pos, 64, **kw)
        got = decode_attention(q, kk, vv, pos, 64, merged=True, **kw)
        assert got.shape == (q.shape[0], t, hkv * g * d) and got.is_contiguous()
        assert torch.equal(got, merge(attn, plain, q.shape[0], t))
        assert not torch.equal(got.flatten(), plain.flatten())


def test_split_queries_read_in_place_hold_the_bits_of_the_folded_copy():
    """q given as [B, Hkv, G, T, D], a view of the projection's [B, T, H, D] queries
    (stock/body.py's split_heads, no folding copy): the kernel reads rows g * T + t by their
    strides and gives bit for bit what the folded contiguous copy gives, for a chain step, a
    batched step and a tree step, merged or not. The view is not the folded layout in memory
    (the test could fail: a kernel reading it as [B, Hkv, G*T, D] would mix heads and
    tokens)."""
    from types import SimpleNamespace

    from stock.body import fold, split_heads
    from stock.tree import ancestors, tree_table

    gen = torch.Generator().manual_seed(8)
    hkv, g, t, d = 2, 3, 5, 16
    attn = SimpleNamespace(h=hkv * g, hkv=hkv, d=d)
    k = torch.randn(4, hkv, 96, d, generator=gen)
    v = torch.randn(4, hkv, 96, d, generator=gen)
    anc = ancestors(torch.tensor([0, 0, 1, 1, 2]))
    cases = [   # (batch, positions, kwargs)
        (1, torch.arange(40, 40 + t), {}),
        (3, torch.tensor([[50], [7], [20]]) + torch.arange(t),
         {"rows_of": torch.tensor([3, 0, 2])}),
        (1, 30 + torch.arange(t), {"tree": tree_table(anc, anc.sum(1) - 1, torch.tensor(30))}),
    ]
    for b, pos, kw in cases:
        natural = torch.randn(b, t, hkv * g, d, generator=gen)   # [B, T, H, D] as projected
        heads = natural.transpose(1, 2)                          # [B, H, T, D], a view
        folded, split = fold(attn, heads), split_heads(attn, heads)
        assert split.data_ptr() == natural.data_ptr() and folded.is_contiguous()
        assert not torch.equal(natural.flatten(), folded.flatten())   # memory order
        kk, vv = (k, v) if "rows_of" in kw else (k[:1], v[:1])
        for merged in (False, True):
            want = decode_attention(folded, kk, vv, pos, 64, merged=merged, **kw)
            got = decode_attention(split, kk, vv, pos, 64, merged=merged, **kw)
            assert torch.equal(got, want), (kw.keys(), merged)
    with pytest.raises(ValueError, match="tokens"):
        decode_attention(split, k[:1], v[:1], torch.arange(40, 40 + t - 1), 64)
