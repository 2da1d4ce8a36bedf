"""The drafter interface and the draft lattice it returns.

A draft lattice holds, per drafted position, the top-k token ids and their log-probabilities
under the drafter; the chain the engine verifies is the top-1 token of each position. A
drafter may ask for target hidden states of chosen layers (a block drafter reads them):
the engine then passes the hidden states of the tokens committed by the last verification.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftLattice:
    ids: torch.Tensor  # [n, K] int64 on CPU; -1 pads missing alternatives
    logprobs: torch.Tensor  # [n, K] float32; -inf pads
    top1: list[int] | None = None  # ids[:, 0] as a list, where the drafter has it already

    @property
    def chain(self) -> list[int]:
        if self.top1 is not None:
            return self.top1
        return self.ids[:, 0].tolist() if len(self.ids) else []

    def __len__(self) -> int:
        return self.ids.shape[0]

    @classmethod
    def empty(cls, k: int = 1) -> "DraftLattice":
        return cls(torch.empty(0, k, dtype=torch.long), torch.empty(0, k))

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int) -> "DraftLattice":
        """From drafter logits [n, vocab]: top-k of the log-softmax per position."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        top = lp.topk(k, dim=-1)
        return cls(top.indices.cpu(), top.values.cpu())


@dataclass
class DraftContext:
    tokens: list[int]  # every token so far: prompt, generated, and the pending last token
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [1, n, H]


class Drafter:
    """Propose up to `k` tokens after `ctx.tokens`."""

    name = "base"
    hidden_layers: tuple[int, ...] = ()  # target layers whose hidden states it reads

    def draft(self, ctx: DraftContext, k: int) -> DraftLattice:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget per-request state (called at the start of each request)."""
