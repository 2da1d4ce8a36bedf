"""Continuous batching of hybrid GDN targets (stock/batch.py, stock/hybrid_cache.py): each
request's output under batching equals its single-request greedy output (fp32, CPU), with
ragged rows, chunked prefill, rows reused by new requests, steps accepting nothing, part of
a draft and everything; the per-row commit against a single request's state."""

from __future__ import annotations

import pytest
import torch

from block_fixtures import one_thread, random_net
from stock.batch import BatchEngine
from stock.config import PRESETS
from stock.drafters.block_batch import BatchBlockDrafter
from stock.drafters.draft_model import DraftModelDrafter
from stock.drafters.ngram import NGramDrafter
from stock.engine import Engine
from stock.hybrid_cache import StateError
from stock.model import Transformer
from stock.options import Options

TINY = PRESETS["tiny-hybrid"]
NEW, K, ROWS = 20, 4, 4


@pytest.fixture(scope="module")
def tiny():
    with one_thread():
        model = Transformer.random(TINY, seed=4, std=0.08)
        gen = torch.Generator().manual_seed(0)
        lengths = [5, 17, 9, 30, 3, 12, 44, 8, 21, 6, 14, 27]   # mixed; 3 prefill chunks at most
        motif = torch.randint(1, 512, (5,), generator=gen).tolist()
        prompts = [(motif * 10)[:n] if i % 3 == 0 else
                   torch.randint(1, 512, (n,), generator=gen).tolist()
                   for i, n in enumerate(lengths)]
        single = Engine(model, Options({"draft_len": K}), 256)
        want = [single.generate(p, NEW).tokens for p in prompts]
    return model, prompts, want


def _serve(model, prompts, _runner_calls=None, **kw):
    """The prompts through a BatchEngine of ROWS rows, two arriving every step
    (`_runner_calls`: a list that gets each static step's request count)."""
    be = BatchEngine(model, Options({"draft_len": K}), max_batch=ROWS, max_context=256,
                     prefill_chunk=16, **kw)
    if _runner_calls is not None:
        step = be.runner.step
        be.runner.step = lambda seqs, *a: (_runner_calls.append(len(seqs)), step(seqs, *a))[1]
    reqs, most = [], 0
    for i, p in enumerate(prompts):
        reqs.append(be.submit(p, NEW - (i % 3)))
        if i % 2:
            be.step()
            most = max(most, len(be.active))
    be.run()
    assert most == ROWS and be.idle   # the batch was full, rows were reused, all left
    return reqs


@pytest.mark.parametrize("drafter", ["ar", "ngram", "self", "truncated", "other", "block"])
def test_hybrid_requests_batched_equal_their_single_request_outputs(tiny, drafter):
    model, prompts, want = tiny
    with one_thread():
        if drafter == "block":
            kw = dict(batch_drafter=BatchBlockDrafter(random_net(model), model, 256, ROWS + 1))
        else:
            other = Transformer.random(TINY, seed=9, std=0.08) if drafter == "other" else None
            kw = dict(drafter_factory={
                "ar": lambda: None, "ngram": lambda: NGramDrafter(4, 1, 4),
                "self": lambda: DraftModelDrafter(model, 256),      # accepts everything
                # its first 3 of 4 layers: steps accepting part of a draft, rows ragged
                "truncated": lambda: DraftModelDrafter(model, 256, num_layers=3),
                "other": lambda: DraftModelDrafter(other, 256),     # accepts next to nothing
            }[drafter])
        reqs = _serve(model, prompts, **kw)
    for i, (req, ref) in enumerate(zip(reqs, want)):
        assert req.tokens == ref[:NEW - (i % 3)], i
    steps = [a for r in reqs for a in r.accepted]
    if drafter == "self":
        assert max(steps) == K + 1 and steps.count(K + 1) > len(steps) // 2
    if drafter == "other":
        assert steps.count(1) > len(steps) // 2
    if drafter == "truncated":
        assert len({a for a in steps if 1 < a < K + 1}) >= 2 and steps.count(1) > 0
    # (the random target repeats little: the n-gram and block drafts are rarely accepted;
    # their rows' outputs are what they check)


def test_a_rows_commit_keeps_what_a_single_request_would(tiny):
    """One batched step over three rows of 5, 3 and 5 real tokens (padded to 5): a row that
    keeps every real token, one that keeps its 3 real tokens before 2 of padding, one that
    keeps 2 of 5; each row's state then equals the state a single request's step of the
    same tokens commits, and its conv window too."""
    model, _, _ = tiny
    gen = torch.Generator().manual_seed(3)
    ctx = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (7, 4, 11)]
    new = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (5, 3, 5)]
    keep = [5, 3, 2]
    with one_thread():
        be = BatchEngine(model, max_batch=3, max_context=64, prefill_chunk=64)
        reqs = [be.submit(c, 8) for c in ctx]
        be.step()   # admits and prefills all three, then one AR step each
        starts = [be.lengths[r.row] for r in reqs]
        rows = [r.row for r in reqs]
        seqs = [[r.pending] + n for r, n in zip(reqs, new)]
        be._forward(seqs, rows, starts)
        be.cache.commit_rows(rows, keep, [len(s) for s in seqs])
        for req, seq, n in zip(reqs, seqs, keep):
            single = Engine(model, Options(), 64)
            single._prefill(req.prompt + req.tokens[:-1])   # the committed context
            start = single.cache.length
            single.model(torch.tensor([seq]), single.cache, start)
            single.cache.commit(start + n)
            # fp32 GEMMs of 15 rows and of 5 sum in other orders (this CPU: 1.7e-6 apart);
            # a commit of one token too many or too few is off by the state's own size
            for layer in be.cache.gdn_layers:
                torch.testing.assert_close(be.cache.state[layer][req.row],
                                           single.cache.state[layer][0], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(be.cache.window[layer][req.row],
                                           single.cache.window[layer][0], rtol=1e-4, atol=1e-5)
        with pytest.raises(StateError, match="commit of 4 tokens of a row's 3"):
            be._forward(seqs, rows, starts)
            be.cache.commit_rows(rows, [1, 4, 1], [5, 3, 5])


@pytest.mark.parametrize("drafter", ["ar", "self", "truncated", "block"])
def test_hybrid_requests_on_the_static_step_equal_their_single_request_outputs(tiny, drafter):
    """The static batched step the CUDA graphs replay (run eagerly here: capture=False):
    padded to its requests and tokens buckets, padding requests in the spare row, each
    row's GDN staging handed back to the cache for the per-row commit. Steps accepting
    everything, part of a draft and nothing; rows reused; single-request outputs."""
    model, prompts, want = tiny
    with one_thread():
        if drafter == "block":
            kw = dict(batch_drafter=BatchBlockDrafter(random_net(model), model, 256, ROWS + 1,
                                                      static=True, capture=False))
        else:
            kw = dict(drafter_factory={
                "ar": lambda: None, "self": lambda: DraftModelDrafter(model, 256),
                "truncated": lambda: DraftModelDrafter(model, 256, num_layers=3)}[drafter])
        calls = []
        reqs = _serve(model, prompts, static=True, capture=False, _runner_calls=calls, **kw)
    assert calls and max(calls) > 1   # batched static steps ran, several requests each
    for i, (req, ref) in enumerate(zip(reqs, want)):
        assert req.tokens == ref[:NEW - (i % 3)], i
    steps = [a for r in reqs for a in r.accepted]
    if drafter == "self":
        assert max(steps) == K + 1
    if drafter == "truncated":
        assert len({a for a in steps if 1 < a < K + 1}) >= 2 and steps.count(1) > 0


def test_the_static_step_commits_what_the_dynamic_step_does(tiny):
    """One step over three rows (3 real requests padded to the requests bucket 4, their
    tokens to the tokens bucket): the logits' argmax, and after the commit each row's GDN
    state and window, equal the dynamic forward's; the spare row's state stays empty."""
    model, _, _ = tiny
    gen = torch.Generator().manual_seed(3)
    ctx = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (7, 4, 11)]
    new = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (5, 3, 5)]
    keep = [5, 3, 2]
    sides = []
    with one_thread():
        for static in (False, True):
            be = BatchEngine(model, max_batch=4, max_context=64, prefill_chunk=64,
                             static=static, capture=False)
            reqs = [be.submit(c, 8) for c in ctx]
            be.step()
            seqs = [[r.pending] + n for r, n in zip(reqs, new)]
            starts, rows = [be.lengths[r.row] for r in reqs], [r.row for r in reqs]
            accepted, _ = be._run(seqs, starts, rows)
            be.cache.commit_rows(rows, keep, [len(x) for x in seqs])
            sides.append((be, accepted))
    (dyn, acc_d), (sta, acc_s) = sides
    assert sta.runner is not None and sta.runner.last.b == 4   # 3 requests + 1 of padding
    assert [a[1][:len(x)] for a, x in zip(acc_s, new)] == [a[1][:len(x)]
                                                          for a, x in zip(acc_d, new)]
    for layer in dyn.cache.gdn_layers:
        for row in range(3):
            torch.testing.assert_close(sta.cache.state[layer][row], dyn.cache.state[layer][row],
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(sta.cache.window[layer][row],
                                       dyn.cache.window[layer][row], rtol=1e-4, atol=1e-5)
        assert not sta.cache.state[layer][sta.runner.spare].any()   # nothing commits it


def test_the_static_step_through_compiled_regions_gives_single_request_outputs(tiny,
                                                                              monkeypatch):
    """With option compile (CUDA only: forced here) a hybrid batch's static step runs
    stock/compiled.py's regions with batched rows: the GDN layers' regions around each row's
    own recurrence, gated attention's region A writing each request's K/V into its own row,
    fused projections; dynamo traces them with its "eager" backend on the CPU."""
    import stock.batch as batch_mod
    from stock import compiled as C

    _, prompts, want = tiny
    model = Transformer.random(TINY, seed=4, std=0.08)   # the fixture's weights, fused here
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    monkeypatch.setattr(batch_mod, "compile_enabled", lambda options, device: True)
    try:
        with one_thread():
            calls = []
            reqs = _serve(model, prompts, static=True, capture=False, _runner_calls=calls,
                          drafter_factory=lambda: DraftModelDrafter(model, 256, num_layers=3))
        assert calls and max(calls) > 1
        assert C.graphs_compiled() > 0 and not C.fallbacks()
        for i, (req, ref) in enumerate(zip(reqs, want)):
            assert req.tokens == ref[:NEW - (i % 3)], i
    finally:
        C.reset()


def test_a_forward_whose_states_were_not_committed_stops_the_next_one(tiny):
    """A batched forward on a hybrid target stages its rows' states; a code path that skips
    commit_rows (as an entry's riding step once did) would decode on from stale states: the
    next forward is a one-line error instead."""
    model, prompts, _ = tiny
    with one_thread():
        be = BatchEngine(model, max_batch=2, max_context=64, prefill_chunk=64)
        reqs = [be.submit(p, 8) for p in prompts[:2]]
        be.step()
        seqs = [[r.pending] for r in reqs]
        rows, starts = [r.row for r in reqs], [be.lengths[r.row] for r in reqs]
        be._forward(seqs, rows, starts)             # staged, never committed
        with pytest.raises(StateError, match="staged but not committed") as err:
            be._forward(seqs, rows, starts)
    assert "\n" not in str(err.value)


def test_the_hybrid_batched_step_compiles_once_for_every_requests_bucket(monkeypatch):
    """The GDN layers' regions take the batched step's requests and tokens buckets as
    dynamic sizes too (stock/compiled.py, requests_dynamic; their recurrence's outputs and
    gates marked between the regions): every slot of 8 requests and 8 tokens compiles a
    fifth of the graphs static sizes compile, with the same packed outputs."""
    import stock.batch as batch_mod
    from stock import compiled as C

    model = Transformer.random(TINY, seed=4, std=0.08)
    monkeypatch.setattr(C, "BACKEND", "eager")
    monkeypatch.setattr(batch_mod, "compile_enabled", lambda options, device: True)
    counts, packed = {}, {}
    try:
        for dyn in (False, True):
            C.reset()
            monkeypatch.setattr(C, "DYNAMIC_SIZES", dyn)
            with one_thread():
                be = BatchEngine(model, Options({"draft_len": 7}), max_batch=8,
                                 max_context=128, static=True, capture=False)
                be.prepare(40)
                runner, outs = be.runner, []
                for s in runner.slots.values():
                    runner._scratch(s)
                    outs.append(runner._compute(s)[0].clone())
                    runner.cache.discard_staged()   # the spare row's staging: never committed
            counts[dyn], packed[dyn] = C.graphs_compiled(), outs
            assert not C.fallbacks()
    finally:
        C.reset()
    assert counts[True] * 4 < counts[False], counts
    assert all(torch.equal(a, b) for a, b in zip(packed[False], packed[True]))
