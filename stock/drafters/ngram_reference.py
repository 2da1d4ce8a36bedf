"""The n-gram drafter's plain reference: what `stock.drafters.ngram.NGramDrafter` proposes.

Match the longest suffix n-gram (ngram_max down to ngram_min) earlier in the context and
propose what followed its most recent occurrence. The lattice's alternatives at each
position are the continuations of every occurrence that agrees with the chain so far,
scored by their frequency (ties in the order the occurrences are visited, most recent
first). This version scans the whole context on every call; the drafter keeps an index
instead and must give the same lattice bit for bit (tests/test_ngram_drafter.py).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from stock.drafters.base import DraftContext, DraftLattice, Drafter


class ReferenceNGramDrafter(Drafter):
    name = "ngram-reference"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1, topk: int = 4):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min, self.topk = ngram_max, ngram_min, topk

    def _matches(self, toks: np.ndarray, n: int) -> np.ndarray:
        """Start positions of earlier occurrences of the last n tokens, most recent first."""
        if len(toks) <= n:
            return np.empty(0, dtype=np.int64)
        windows = np.lib.stride_tricks.sliding_window_view(toks[:-1], n)
        hits = np.nonzero((windows == toks[-n:]).all(axis=1))[0]
        return hits[::-1]

    def draft(self, ctx: DraftContext, k: int) -> DraftLattice:
        toks = np.asarray(ctx.tokens, dtype=np.int64)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            starts = self._matches(toks, n)
            if len(starts):
                return self._lattice(toks, starts + n, k)
        return DraftLattice.empty(self.topk)

    def _lattice(self, toks: np.ndarray, conts: np.ndarray, k: int) -> DraftLattice:
        ids = torch.full((k, self.topk), -1, dtype=torch.long)
        lps = torch.full((k, self.topk), -math.inf)
        live = [int(c) for c in conts if c < len(toks)]
        chain_len = 0
        for j in range(k):
            counts = Counter(int(toks[c + j]) for c in live if c + j < len(toks))
            if not counts:
                break
            best = int(toks[live[0] + j]) if live[0] + j < len(toks) else counts.most_common(1)[0][0]
            total = sum(counts.values())
            ranked = [best] + [t for t, _ in counts.most_common() if t != best]
            for r, tok in enumerate(ranked[: self.topk]):
                ids[j, r] = tok
                lps[j, r] = math.log(counts[tok] / total)
            live = [c for c in live if c + j < len(toks) and int(toks[c + j]) == best]
            chain_len = j + 1
            if not live:
                break
        return DraftLattice(ids[:chain_len], lps[:chain_len])
