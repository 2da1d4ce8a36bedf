"""The indexed n-gram drafter (stock/drafters/ngram.py) against its plain reference: the same
lattice, bit for bit, on every prefix of a request and on contexts that do not continue."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from stock.drafters.base import DraftContext
from stock.drafters.ngram import NGramDrafter
from stock.drafters.ngram_reference import ReferenceNGramDrafter


def _same(got, want):
    assert torch.equal(got.ids, want.ids)
    assert torch.equal(got.logprobs, want.logprobs)


def _stream(seed: int, length: int, vocab: int) -> list[int]:
    """Tokens with repeats: random runs copied from earlier in the stream."""
    rng = random.Random(seed)
    out = [rng.randrange(vocab) for _ in range(8)]
    while len(out) < length:
        if rng.random() < 0.5:
            start = rng.randrange(len(out))
            out += out[start:start + rng.randrange(1, 12)]
        else:
            out.append(rng.randrange(vocab))
    return out[:length]


@pytest.mark.parametrize("vocab, nmax, nmin, topk, k", [
    (50, 4, 1, 4, 8), (3, 3, 1, 2, 16), (7, 2, 2, 3, 5), (1000, 4, 2, 4, 8)])
def test_every_prefix_gives_the_reference_lattice(vocab, nmax, nmin, topk, k):
    """One request, drafted at every length as the engine grows it (the index extended by
    the new tokens each call); vocab 3 sends most lattices down the numpy path."""
    toks = _stream(vocab, 400, vocab)
    fast, ref = NGramDrafter(nmax, nmin, topk), ReferenceNGramDrafter(nmax, nmin, topk)
    nonempty = 0
    for end in range(1, len(toks) + 1):
        ctx = DraftContext(toks[:end])
        got, want = fast.draft(ctx, k), ref.draft(ctx, k)
        _same(got, want)
        nonempty += len(want) > 0
    assert nonempty > 100  # the matches were exercised, not only empty lattices


def test_steps_of_several_tokens_and_contexts_that_do_not_continue():
    toks = _stream(5, 600, 4)  # small vocab: hundreds of unigram occurrences
    fast, ref = NGramDrafter(), ReferenceNGramDrafter()
    rng = random.Random(1)
    end, big = 10, 0
    while end <= len(toks):
        _same(fast.draft(DraftContext(toks[:end]), 8), ref.draft(DraftContext(toks[:end]), 8))
        big += len(ref._matches(np.asarray(toks[:end]), 1)) >= 48
        end += rng.randrange(1, 9)
    assert big > 10  # the numpy path ran
    for ctx in (toks[:50], toks[100:300], [9, 9, 9], [1], []):  # shorter, other, tiny
        _same(fast.draft(DraftContext(list(ctx)), 8), ref.draft(DraftContext(list(ctx)), 8))
    fast.reset()
    _same(fast.draft(DraftContext(toks), 8), ref.draft(DraftContext(toks), 8))


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError):
        NGramDrafter(ngram_max=1, ngram_min=2)
    with pytest.raises(ValueError):
        NGramDrafter(ngram_min=0)
