"""The batched block drafter's attention through kernels/attention's split-KV kernel
(BatchBlockDrafter `attention="triton"`, the CUDA path) under Triton's interpreter (fp32)
against the same drafter's SDPA over gathered rows: every block position sees its whole
block (the kernel's causal mask at the block's last position), each row its own keys."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.attention builds its kernels

import pytest  # noqa: E402
import torch  # noqa: E402

from block_fixtures import random_net  # noqa: E402
from stock.config import PRESETS  # noqa: E402
from stock.drafters.block_batch import BatchBlockDrafter  # noqa: E402
from stock.model import Transformer  # noqa: E402

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)


def test_the_kernel_drafts_what_sdpa_over_the_gathered_rows_drafts():
    target = Transformer.random(PRESETS["tiny-qwen3"], "cpu", torch.float32, seed=1, std=0.08)
    net = random_net(target, block_size=8, seed=3)
    layers = tuple(net.cfg.target_layers)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (37, 5, 80)]
    sides = []
    for kernel in (False, True):
        bd = BatchBlockDrafter(net, target, 256, rows=6, static=True, capture=False)
        assert not bd.kernel   # no CUDA: SDPA unless forced, as here
        bd.kernel = kernel
        pend = []
        for row, p in zip((4, 0, 2), prompts):   # rows out of order, others never written
            out = target(torch.tensor([p]), target.new_cache(256), 0, logits="last",
                         hidden_layers=layers)
            pend.append(int(out.logits[0, -1].argmax()))
            bd.extend([(row, len(p), torch.cat([out.hidden[i][0] for i in layers], -1))])
        if kernel:   # rows no request reads: junk the kernel must not touch
            for buf in bd.k + bd.v:
                buf[1].fill_(float("nan"))
                buf[3].fill_(float("nan"))
        sides.append(bd._lattices([4, 0, 2], pend))   # [2, rows, T, top-k]
    sdpa, kern = sides
    assert torch.isfinite(kern).all()
    torch.testing.assert_close(kern[1], sdpa[1], atol=1e-4, rtol=1e-4)   # log-probs
    lead = sdpa[1, :, :, 0] - sdpa[1, :, :, 1] > 1e-3
    assert lead.sum() > 10 and torch.equal(kern[0, :, :, 0][lead], sdpa[0, :, :, 0][lead])


def test_a_block_that_saw_only_its_causal_past_would_draft_otherwise(monkeypatch):
    """The check above can fail: masking each block position at its own position (the
    kernel's plain causal mask) instead of the block's last changes the drafts."""
    import stock.drafters.block_batch_step as step

    target = Transformer.random(PRESETS["tiny-qwen3"], "cpu", torch.float32, seed=1, std=0.08)
    net = random_net(target, block_size=8, seed=3)
    layers = tuple(net.cfg.target_layers)
    p = torch.randint(1, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    out = target(torch.tensor([p]), target.new_cache(256), 0, logits="last",
                 hidden_layers=layers)
    feats = torch.cat([out.hidden[i][0] for i in layers], -1)
    real = step.decode_attention

    def causal(q, k, v, seen, kv_len, **kw):   # each block position's own
        t = seen.shape[1]
        return real(q, k, v, seen - (t - 1) + torch.arange(t), kv_len, **kw)

    got = []
    for attend in (real, causal):
        monkeypatch.setattr(step, "decode_attention", attend)
        bd = BatchBlockDrafter(net, target, 256, rows=3, static=True, capture=False)
        bd.kernel = True
        bd.extend([(0, len(p), feats)])
        got.append(bd._lattices([0], [int(out.logits[0, -1].argmax())]))
    assert not torch.allclose(got[0][1], got[1][1], atol=1e-3)
