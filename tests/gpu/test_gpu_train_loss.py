"""The block drafter's training loss on CUDA: the compiled head and loss
(training/loss.py, used by the training loop on CUDA) against the eager ones, in the
bf16 autocast of a training step, at the embedded model's head shape."""

from __future__ import annotations

import torch

from training.loss import HeadLoss, head_terms


def test_compiled_head_loss_matches_eager_under_bf16_autocast():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(8, 4, 16, 576, device=dev, generator=g)
    w = (torch.randn(49152, 576, device=dev, generator=g) / 24).bfloat16()
    labels = torch.randint(0, 49152, (8, 4, 16), device=dev, generator=g)
    labels[3, 1, 9:] = -100
    # make some positions right, so acc-len is not trivially 1
    with torch.no_grad():
        top = torch.nn.functional.linear(h.bfloat16(), w).float().argmax(-1)
    labels[:, :, :2] = top[:, :, :2]
    he, hc = h.clone().requires_grad_(), h.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        le, ae = head_terms(he, labels, w, 7.0)
        hl = HeadLoss(w, 7.0, compiled=True)
        lc, ac = hl(hc, labels)
    le.backward()
    lc.backward()
    assert hl.compiled  # no fallback
    torch.testing.assert_close(lc, le, rtol=2e-3, atol=2e-3)
    assert float(ae) > 1.5 and abs(float(ac) - float(ae)) < 0.05
    torch.testing.assert_close(hc.grad, he.grad, rtol=2e-2, atol=1e-5)
