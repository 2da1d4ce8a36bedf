"""The block drafter's training loss: the target's frozen head, then weighted cross-entropy.

`loss_terms(logits, labels, decay)` is the loss itself: cross-entropy on the target's greedy
tokens at every block position j, weighted exp(-j / decay) (earlier positions gate
acceptance), and the block acc-len (1 + the leading run of argmax hits: τ if every block
were full length), both as tensors.

`HeadLoss` applies the head and the loss to the drafter's final hidden states. On CUDA it
runs them through `torch.compile` (fixed shapes: a training step always has batch x anchors
x block_size rows): the head's GEMM stays cuBLAS, and the fp32 upcast of the logits, the
log-softmax, the gather, the argmax and the backward's softmax become a few fused passes
over the [rows, vocab] logits instead of one kernel (and one fp32 copy) each. On the H200
these passes were ~12 of a step's ~27 ms of device time (`bench/gpu_train_step.py
--profile`, bench/archive/NOTES-2026.md). A compile that fails falls back to the eager path, said once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def loss_terms(logits: torch.Tensor, labels: torch.Tensor, decay: float):
    """(weighted CE, block acc-len) of logits [B, A, T, V] against labels [B, A, T]
    (-100 past the answer), both 0-dim tensors; acc-len carries no gradient."""
    b, a, t, vocab = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100,
                         reduction="none").view(b, a, t)
    valid = (labels >= 0).float()
    w = torch.exp(-torch.arange(t, device=logits.device, dtype=torch.float32) / decay) * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-9)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels).float() * valid
        acc_len = 1.0 + hit.cumprod(-1).sum(-1).mean()
    return loss, acc_len


def head_terms(h: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, decay: float):
    """loss_terms of the head's logits: h [B, A, T, H] -> logits in fp32."""
    return loss_terms(F.linear(h, weight).float(), labels, decay)


class HeadLoss:
    """head_terms with the target's head weight, eager or compiled (see the module doc)."""

    def __init__(self, weight: torch.Tensor, decay: float, compiled: bool, log=print):
        self.weight, self.decay, self.log = weight, decay, log
        self.compiled = compiled
        self._fn = torch.compile(head_terms, dynamic=False) if compiled else None

    def __call__(self, h: torch.Tensor, labels: torch.Tensor):
        if self._fn is not None:
            try:
                return self._fn(h, labels, self.weight, self.decay)
            except Exception as exc:  # a compiler failure must not cost the run
                self.log(f"compiled loss failed ({exc.__class__.__name__}: "
                         f"{str(exc)[:200]}); eager loss from here on")
                self._fn, self.compiled = None, False
        return head_terms(h, labels, self.weight, self.decay)
