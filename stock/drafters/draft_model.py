"""Draft-model drafter: a smaller causal LM with the target's tokenizer, greedy.

By default the target truncated to its first `draft_layers` layers (plus its final norm and
head): no extra weights, the same tokenizer by construction. Any other Transformer with the
same vocabulary works too. The drafter keeps its own KV cache and, each step, rolls it back
to the longest prefix it shares with the context, then feeds only what is new. A hybrid
draft model's recurrent state rewinds only to the context it last drafted from (a mark),
so it re-feeds the drafts the target accepted.
"""

from __future__ import annotations

import torch

from stock.cache import KVCache
from stock.drafters.base import DraftContext, DraftLattice, Drafter
from stock.model import Transformer


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, model: Transformer, max_len: int, num_layers: int | None = None,
                 topk: int = 4):
        self.model, self.num_layers, self.topk = model, num_layers, topk
        n = model.cfg.num_layers if num_layers is None else num_layers
        self.cache: KVCache = model.new_cache(max_len, num_layers=n)
        self.recurrent = model.cfg.hybrid   # its cache rewinds only to a mark (HybridCache)
        self.seen: list[int] = []

    def reset(self) -> None:
        self.cache.rollback(0)
        self.seen = []

    def _step(self, toks: list[int], start: int) -> torch.Tensor:
        ids = torch.tensor([toks], device=self.model.device)
        out = self.model(ids, self.cache, start, logits="last", num_layers=self.num_layers)
        self.cache.commit(start + len(toks))
        return out.logits[0, -1]

    def draft(self, ctx: DraftContext, k: int) -> DraftLattice:
        toks = ctx.tokens
        common = 0
        limit = min(len(self.seen), len(toks) - 1)  # always re-feed at least one token
        while common < limit and self.seen[common] == toks[common]:
            common += 1
        if self.recurrent:   # back to the context it drafted from, re-feeding what follows
            common = min(common, self.cache.mark_length)
        self.cache.rollback(common)
        k = min(k, self.cache.max_len - len(toks))
        if k <= 0:
            return DraftLattice.empty(self.topk)
        logits = [self._step(toks[common:], common)]
        if self.recurrent:
            self.cache.mark()
        fed = list(toks)
        for _ in range(k - 1):
            nxt = int(logits[-1].argmax())
            logits.append(self._step([nxt], len(fed)))
            fed.append(nxt)
        self.seen = fed
        return DraftLattice.from_logits(torch.stack(logits), self.topk)
