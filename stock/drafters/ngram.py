"""Prompt-lookup n-gram drafter: no weights.

Match the longest suffix n-gram (ngram_max down to ngram_min) earlier in the context and
propose what followed its most recent occurrence. The lattice's alternatives at each
position are the continuations of every occurrence that agrees with the chain so far,
scored by their frequency. The lattice is exactly that of the plain version in
`stock.drafters.ngram_reference` (tests/test_ngram_drafter.py compares them on every
prefix of real outputs).

Its cost is host time inside every speculative step, while the GPU waits: the reference
scans the whole context for each n on every call (numpy windows over a fresh array of the
token list). This drafter keeps, per request, an index from each n-gram to the positions
where it starts, extended by the tokens committed since its last call (a context that does
not extend the indexed one, a new request say, is indexed afresh). A lookup is then one
dict access per n, and the lattice walks only the matching occurrences: plain Python for a
few of them, numpy for many (a frequent unigram).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from stock.drafters.base import DraftContext, DraftLattice, Drafter

_NUMPY_FROM = 48  # occurrences at which the lattice counts with numpy instead of Python


class NGramDrafter(Drafter):
    name = "ngram"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1, topk: int = 4):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min, self.topk = ngram_max, ngram_min, topk
        self.reset()

    def reset(self) -> None:
        self._toks: list[int] = []
        self._arr = np.empty(256, dtype=np.int64)  # the same tokens, grown by doubling
        # n -> n-gram -> ascending start positions of its windows in the context
        self._index: dict[int, dict[tuple, list[int]]] = {
            n: {} for n in range(self.ngram_min, self.ngram_max + 1)}

    def _extend(self, tokens: list[int]) -> None:
        m = len(self._toks)
        if len(tokens) < m or tokens[:m] != self._toks:  # not a continuation: start over
            self.reset()
            m = 0
        new = tokens[m:]
        if not new:
            return
        toks = self._toks
        toks.extend(int(t) for t in new)
        if len(toks) > len(self._arr):
            arr = np.empty(max(len(toks), 2 * len(self._arr)), dtype=np.int64)
            arr[:m] = self._arr[:m]
            self._arr = arr
        self._arr[m:len(toks)] = toks[m:]
        for n, index in self._index.items():
            # windows starting at m - n + 1 .. len - n are new (they end in a new token)
            for i in range(max(0, m - n + 1), len(toks) - n + 1):
                index.setdefault(tuple(toks[i:i + n]), []).append(i)

    def draft(self, ctx: DraftContext, k: int) -> DraftLattice:
        self._extend(ctx.tokens)
        toks = self._toks
        size = len(toks)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if size <= n:
                continue
            starts = self._index[n].get(tuple(toks[size - n:]), ())
            # the suffix itself is the last window; earlier ones are the matches
            last = len(starts) - 1 if starts and starts[-1] == size - n else len(starts)
            if last:
                conts = [starts[i] + n for i in range(last - 1, -1, -1)]  # most recent first
                return self._lattice(conts, k)
        return DraftLattice.empty(self.topk)

    def _lattice(self, live: list[int], k: int) -> DraftLattice:
        toks, size, topk = self._toks, len(self._toks), self.topk
        ids, lps = [], []  # rows of the lattice, built in Python: one tensor each at the end
        for j in range(k):
            ranked, counts, total = (self._rank_numpy(live, j) if len(live) >= _NUMPY_FROM
                                     else self._rank(live, j))
            if not total:
                break
            top = ranked[:topk]
            pad = topk - len(top)
            ids.append(top + [-1] * pad)
            lps.append([math.log(counts[tok] / total) for tok in top] + [-math.inf] * pad)
            best = ranked[0]
            live = [c for c in live if c + j < size and toks[c + j] == best]
            if not live:
                break
        if not ids:
            return DraftLattice.empty(topk)
        # through numpy: torch.tensor from nested lists costs ~20 µs a call here
        return DraftLattice(torch.from_numpy(np.array(ids, dtype=np.int64)),
                            torch.from_numpy(np.array(lps, dtype=np.float32)))

    def _rank(self, live: list[int], j: int):
        """(ranked tokens, counts, total) of the tokens j after each occurrence: the most
        recent occurrence's token first, then by count, ties in visiting order."""
        toks, size = self._toks, len(self._toks)
        counts: dict[int, int] = {}
        for c in live:
            if c + j < size:
                t = toks[c + j]
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            return [], counts, 0
        order = sorted(counts, key=counts.__getitem__, reverse=True)  # stable: ties in order
        best = toks[live[0] + j] if live[0] + j < size else order[0]
        return [best] + [t for t in order if t != best], counts, sum(counts.values())

    def _rank_numpy(self, live: list[int], j: int):
        """`_rank` for many occurrences, counted with numpy (same order, same counts)."""
        size = len(self._toks)
        pos = np.asarray(live, dtype=np.int64) + j
        vals = self._arr[pos[pos < size]]
        if not len(vals):
            return [], {}, 0
        uniq, first, cnt = np.unique(vals, return_index=True, return_counts=True)
        order = np.lexsort((first, -cnt))  # count descending, then first visit
        ranked_all = [int(t) for t in uniq[order]]
        counts = dict(zip(ranked_all, (int(c) for c in cnt[order])))
        best = int(vals[0]) if pos[0] < size else ranked_all[0]
        return [best] + [t for t in ranked_all if t != best], counts, int(len(vals))
