"""Requests the embedded target writes itself (training/self_prompts.py, --self-prompts):
the pre-query template, sampling fixed by the seed, what is kept, the dev prompts and
repeats excluded, and their place in the corpus. fp32 CPU."""

from __future__ import annotations

import pytest

from training.loop import TrainConfig
from training.self_prompts import (MIN_TOKENS, interleave, kept_request, query_prefix,
                                   sample_requests)

N, MAX_NEW = 6, 48


def _sample(smol, seed, exclude=frozenset(), n=N):
    return sample_requests(smol.engine.model, smol.tokenizer, n, seed, batch=16,
                           max_new=MAX_NEW, stops=set(smol.engine.stop_ids), exclude=exclude,
                           progress=lambda m: None)


def test_the_prefix_is_the_chat_template_before_the_users_text(smol):
    tok = smol.tokenizer
    prefix = query_prefix(tok)
    assert prefix.endswith("user\n") and "system" in prefix
    user = "Write a haiku about rain."
    ids = tok.tok.encode(prefix + user, add_special_tokens=False).ids
    assert tok.chat(user)[:len(ids)] == ids


@pytest.fixture(scope="module")
def seed_11(smol):
    return _sample(smol, 11)


def test_requests_are_fixed_by_the_seed_distinct_and_finished(smol, seed_11):
    texts, counts = seed_11
    again, _ = _sample(smol, 11)
    other, _ = _sample(smol, 12)
    assert texts == again and texts != other
    assert len(texts) == N == counts["kept"] and len(set(texts)) == N
    assert all(t and t == t.strip() for t in texts)


def test_excluded_texts_are_never_kept(smol, seed_11):
    texts, _ = seed_11
    kept, counts = _sample(smol, 11, exclude=set(texts[:3]))
    assert not set(texts[:3]) & set(kept)
    assert kept[:N - 3] == texts[3:]                  # the same draws, the excluded skipped
    assert counts["duplicates"] >= 3


def test_what_a_row_keeps(smol):
    tok = smol.tokenizer
    stops = set(smol.engine.stop_ids)
    stop = min(stops)
    body = tok.encode(" a poem about the sea, please.")
    assert len(body) >= MIN_TOKENS
    assert kept_request("Write", body + [stop, 5, 6], stops, tok) == \
        "Write" + tok.decode(body)
    assert kept_request("", body, stops, tok) is None                      # no stop: unfinished
    assert kept_request("", body[:MIN_TOKENS - 1] + [stop], stops, tok) is None   # too short
    im_start = tok.tok.token_to_id("<|im_start|>")
    assert kept_request("", body + [im_start] + body + [stop], stops, tok) is None  # special
    blank = tok.encode("    ")
    assert kept_request("", blank * MIN_TOKENS + [stop], stops, tok) is None


def test_interleave_keeps_each_order_and_spreads_the_second_list():
    a, b = list(range(100)), [f"s{i}" for i in range(25)]
    out = interleave(a, b)
    assert [x for x in out if isinstance(x, int)] == a
    assert [x for x in out if isinstance(x, str)] == b
    for cut in (20, 40, 80):
        share = sum(isinstance(x, str) for x in out[:cut]) / cut
        assert abs(share - 0.2) <= 0.05
    assert interleave(a, []) == a and interleave([], b) == b


def test_self_prompts_join_the_corpus_as_their_own_source(smol):
    from training.cli import add_self_prompts

    tok = smol.tokenizer
    cfg = TrainConfig(seed=5, self_prompts=4, gen_batch=8, max_prompt=24 + len(tok.chat("")))
    base = [tok.chat(f"Question number {i}?") for i in range(8)]
    prompts, sources, groups, stats = add_self_prompts(
        smol.engine.model, tok, cfg, base, ["chat"] * 8, [f"chat:{i}" for i in range(8)],
        set(smol.engine.stop_ids))
    assert stats["self_kept"] == 4 and sources.count("self") == 4
    assert len(prompts) == len(sources) == len(groups) == 12
    assert [p for p, s in zip(prompts, sources) if s == "chat"] == base
    mine = [p for p, s in zip(prompts, sources) if s == "self"]
    assert all(len(p) <= cfg.max_prompt for p in mine)
    assert all(g.startswith("self:") for g, s in zip(groups, sources) if s == "self")


def test_sampling_keeps_to_the_nucleus_among_the_likeliest():
    import math

    import torch

    from training.self_prompts import TOP_K, TOP_P, nucleus

    assert TOP_P == 0.95
    pick = nucleus(1.0, torch.Generator().manual_seed(0))
    probs = torch.tensor([0.5, 0.3, 0.1, 0.08, 0.02])       # cumulative before: .5 .8 .9 .98
    seen = pick(probs.log().expand(4000, -1).clone())
    assert set(seen.tolist()) == {0, 1, 2, 3}                  # the 5th starts at 0.98: out
    share = (seen == 0).float().mean().item()
    assert abs(share - 0.5 / 0.98) < 0.03
    flat = -torch.arange(1000, dtype=torch.float) * 1e-4      # nucleus wider than TOP_K
    seen = pick(flat.expand(4000, -1).clone())
    assert int(seen.max()) < TOP_K and len(set(seen.tolist())) > TOP_K // 2
    hot = nucleus(0.01, torch.Generator().manual_seed(0))     # near-greedy at low temperature
    assert set(hot(torch.tensor([[0.0, math.log(0.9)]]).expand(50, -1).clone()).tolist()) == {0}
