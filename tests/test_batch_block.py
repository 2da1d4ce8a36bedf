"""The block drafter batched (stock/drafters/block_batch.py): every row's block in one
forward drafts what the single-request BlockDrafter drafts from the same context, and the
BatchEngine speculating with it gives every request its single-request greedy output
(fp32, CPU; a toy-trained drafter, so drafts are accepted)."""

from __future__ import annotations

import pytest
import torch

from block_fixtures import random_net, toy, toy_trained  # noqa: F401 (fixtures)
from stock.batch import BatchEngine, BatchError
from stock.drafters.base import DraftContext
from stock.drafters.block import BlockDrafter, BlockDrafterError
from stock.drafters.block_batch import BatchBlockDrafter
from stock.engine import Engine
from stock.options import Options


def test_a_batch_of_rows_drafts_what_single_drafters_draft(toy):
    target, prompts, _ = toy
    net = random_net(target, block_size=4, seed=3)
    layers = tuple(net.cfg.target_layers)
    bd = BatchBlockDrafter(net, target, 256, rows=4, topk=3)
    want, spans, pend = [], [], []
    for row, p in enumerate(prompts[:3]):
        ids = torch.tensor([p])
        out = target(ids, target.new_cache(256), 0, logits="last", hidden_layers=layers)
        single = BlockDrafter(net, target, 256, topk=3)
        pending = int(out.logits[0, -1].argmax())
        want.append(single.draft(DraftContext(p + [pending], out.hidden), 3))
        spans.append((row, len(p), torch.cat([out.hidden[i][0] for i in layers], -1)))
        pend.append(pending)
    bd.extend(spans[:1])           # rows extended in two calls, then drafted together
    bd.extend(spans[1:])
    got = bd.draft([0, 1, 2], pend, [3, 2, 0])
    for i, k in enumerate([3, 2, 0]):
        assert torch.equal(got[i].ids, want[i].ids[:k]), i
        assert torch.allclose(got[i].logprobs, want[i].logprobs[:k], atol=1e-5), i
    assert len(got[2]) == 0 and bd.ctx_len[:3] == [len(p) for p in prompts[:3]]


def test_the_static_draft_pads_the_batch_and_drafts_what_the_eager_one_does(toy):
    """The fixed-shape draft (the CUDA graphs' path, run eagerly here): 3 rows in a bucket of
    4 (the fourth on the spare row) over 256 keys give the eager path's lattices; padding
    writes only the spare row; a spare-less drafter is refused by a batch it would serve."""
    target, prompts, _ = toy
    net = random_net(target, block_size=4, seed=3)
    layers = tuple(net.cfg.target_layers)
    sides = [BatchBlockDrafter(net, target, 256, rows=6, topk=3, static=s, capture=False)
             for s in (False, True)]
    assert sides[1].b_buckets == (1, 2, 4, 5) and sides[1].spare == 5
    pend = []
    for row, p in enumerate(prompts[:3]):
        out = target(torch.tensor([p]), target.new_cache(256), 0, logits="last",
                     hidden_layers=layers)
        pend.append(int(out.logits[0, -1].argmax()))
        for bd in sides:
            bd.extend([(row, len(p), torch.cat([out.hidden[i][0] for i in layers], -1))])
    before = [k.clone() for k in sides[1].k]
    eager, static = (bd.draft([0, 1, 2], pend, [4, 3, 1]) for bd in sides)
    assert [len(x) for x in static] == [4, 3, 1]
    for a, b in zip(eager, static):
        assert torch.equal(a.ids, b.ids)
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    for k0, k1 in zip(before, sides[1].k):   # rows 3-4 untouched; the spare row written
        assert torch.equal(k0[3:5], k1[3:5]) and not torch.equal(k0[5], k1[5])
    with pytest.raises(BatchError, match="spare row"):
        BatchEngine(target, max_batch=3, max_context=256,
                    batch_drafter=BatchBlockDrafter(net, target, 256, rows=3, static=True,
                                                    capture=False))


def test_the_static_context_update_writes_what_the_eager_one_does(toy):
    """A verify step's committed spans through the fixed-shape update (the CUDA graphs' path,
    run eagerly here): rows' features cut from one [rows bucket, T bucket] tensor write what
    the eager per-span update writes; padding (past a row's count, the padding row, T 5
    padded to the context update's bucket 16, T 20 to 64) writes no live row (only the
    spare row, which nothing reads); a span that skips positions is refused on both
    paths."""
    target, _, _ = toy
    net = random_net(target, block_size=4, seed=3)
    sides = [BatchBlockDrafter(net, target, 256, rows=6, static=s, capture=False)
             for s in (False, True)]
    width = len(net.cfg.target_layers) * target.cfg.hidden_size
    gen = torch.Generator().manual_seed(0)
    ctx = [(0, torch.randn(5, width, generator=gen)), (1, torch.randn(9, width, generator=gen)),
           (2, torch.randn(3, width, generator=gen))]
    for bd in sides:   # the prompts' context, then one step's spans of 1 to 5 tokens
        bd.extend([(row, len(f), f) for row, f in ctx])
    hidden = torch.randn(4, 5, width, generator=gen)     # 3 rows in a bucket of 4, T 5
    before = [k.clone() for k in sides[1].k]
    for bd in sides:
        bd.extend_rows([2, 0, 1], [3 + 4, 5 + 1, 9 + 5], [4, 1, 5], hidden)
    assert sides[0].ctx_len == sides[1].ctx_len and sides[1].ctx_len[:3] == [6, 14, 7]
    assert set(sides[1]._ext) == {(4, 16)}
    longer = torch.randn(2, 20, width, generator=gen)    # a prefill chunk's T 20: bucket 64
    for bd in sides:
        bd.extend_rows([1, 0], [14 + 20, 6 + 17], [20, 17], longer)
    assert sides[0].ctx_len == sides[1].ctx_len and sides[1].ctx_len[:3] == [23, 34, 7]
    assert set(sides[1]._ext) == {(4, 16), (2, 64)}
    for i in range(net.cfg.num_layers):
        for eager, static in ((sides[0].k[i], sides[1].k[i]), (sides[0].v[i], sides[1].v[i])):
            assert torch.allclose(eager[:5], static[:5], atol=1e-5), i   # rows 3-4: zeros
        assert torch.equal(before[i][:5, :, 34:], sides[1].k[i][:5, :, 34:])  # past the spans
        assert torch.equal(before[i][2, :, 7:], sides[1].k[i][2, :, 7:])     # row 2's too
    for bd in sides:
        with pytest.raises(BlockDrafterError, match="do not extend"):
            bd.extend_rows([0], [23 + 3], [2], hidden)   # positions 24-25 after a context of 23


@pytest.mark.parametrize("static", [False, True])
def test_batched_block_speculation_gives_single_request_outputs(toy, toy_trained, static):
    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4})
    single = Engine(target, opts, 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)) for p in prompts]
    be = BatchEngine(target, opts, max_batch=3, max_context=256, static=static,
                     capture=False, prefill_chunk=8,
                     batch_drafter=BatchBlockDrafter(net, target, 256, rows=4, static=static,
                                                     capture=False))
    if static:   # prepared: serving then meets no slot (nor drafter slot) it did not make
        made = be.prepare(max(map(len, prompts)) + 20 + 64)
        keys, drafts = set(be.runner.slots), set(be.batch_drafter._graphs)
        exts = set(be.batch_drafter._ext)
        assert made == len(keys) + len(drafts) + len(exts) and drafts
        # draft_len 3: verify steps of T up to 4; prefill chunks of 8 (graph_prefill), whose
        # drafter context updates go through the fixed-shape slots too, all of them in the
        # context update's bucket of 16 tokens: one shape per rows bucket
        assert exts == {(b, 16) for b in (1, 2, 3)}
        assert {t for _, t, _ in keys} == {1, 2, 4, 8}
        assert {b for b, _, _ in keys} == {1, 2, 3}
    reqs = []
    for i, p in enumerate(prompts):    # arrivals spread: rows freed and reused
        reqs.append(be.submit(p, 20))
        if i % 2:
            be.step()
    be.run()
    for i, (req, ref) in enumerate(zip(reqs, want)):
        assert req.tokens == ref.tokens, i
        assert req.accepted == ref.accepted, i       # the same drafts as one at a time
    assert max(max(r.accepted) for r in reqs) > 1    # drafts were accepted
    if static:
        assert set(be.runner.slots) == keys and set(be.batch_drafter._graphs) == drafts
        assert set(be.batch_drafter._ext) == exts
    else:
        assert be.prepare(200) == 0                   # the dynamic path: nothing to make


@pytest.mark.parametrize("chains", [True, False])
def test_the_batched_drafter_through_compiled_regions_drafts_bit_for_bit(toy, toy_trained,
                                                                          monkeypatch, chains):
    """With `compiled` (the engine's option compile and block_compile, CUDA only: forced
    here) the batched draft and context update run through stock/compiled.py's regions;
    dynamo traces them with its "eager" backend on this CPU: every draft (the top-1 chains
    left on the device, or with batch_chain_device off the lattices read to the host) bit
    for bit the uncompiled static path's, the served outputs the single-request ones, no
    fallback, every region of the drafter compiled, and serving the same requests again
    compiles nothing."""
    from stock import compiled as C

    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4, "batch_chain_device": chains})
    single = Engine(target, opts, 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)).tokens for p in prompts]
    C.reset()
    monkeypatch.setattr(C, "BACKEND", "eager")
    try:
        served = {}
        for compiled in (False, True):
            bd = BatchBlockDrafter(net, target, 256, rows=4, static=True, capture=False,
                                   compiled=compiled)
            seen = served[compiled] = []
            lattices = bd._lattices   # both draft() and draft_chains() draft through it
            monkeypatch.setattr(bd, "_lattices", lambda rows, pend, top1=False, f=lattices,
                                seen=seen: seen.append(f(rows, pend, top1).clone()) or seen[-1])
            be = BatchEngine(target, opts, max_batch=3, max_context=256, static=True,
                             capture=False, prefill_chunk=8, batch_drafter=bd)
            assert C.graphs_compiled() == 0   # nothing compiled before the compiled drafter
            counts = []
            for _ in range(2):
                reqs = [be.submit(p, 20) for p in prompts]
                be.run()
                assert [r.tokens for r in reqs] == want
                counts.append(C.graphs_compiled())
        assert counts[0] > 0 and counts[1] == counts[0]   # the second round: no new compile
        assert not C.fallbacks()
        last = "batch_block_chain" if chains else "batch_block_lattice"
        assert {n for n, _ in C._compiled} >= {"batch_block_prologue", "batch_block_context",
                                               last, "attn_in", "attn_out_mlp"}
        plain, traced = served[False], served[True]
        assert len(plain) == len(traced) > 10
        for a, b in zip(plain, traced):
            assert a.dim() == (2 if chains else 4)   # chains [rows, T]; lattices [2, rows, T, k]
            assert torch.equal(a, b)
    finally:
        C.reset()


def _no(*_a, **_k):
    raise AssertionError("the other path was taken")


@pytest.mark.parametrize("on_device", [True, False])
def test_the_static_step_takes_the_chains_on_the_device_or_through_the_host(
        toy, toy_trained, on_device, monkeypatch):
    """On the static path (the CUDA graphs', run eagerly here) the batch drafter's top-1
    chains go to the verify step on the device (`draft_chains`, copied into the slot; the
    host never reads a lattice), or with option batch_chain_device off through the host
    (`draft`) as before: both serve every request its single-request tokens with the
    single-request acceptance (the same drafts)."""
    target, prompts, _ = toy
    net = toy_trained[0]
    opts = Options({"draft_len": 3, "block_size": 4, "batch_chain_device": on_device})
    single = Engine(target, opts, 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)) for p in prompts]
    bd = BatchBlockDrafter(net, target, 256, rows=4, static=True, capture=False)
    calls = []
    chains = bd.draft_chains
    monkeypatch.setattr(bd, "draft" if on_device else "draft_chains", _no)
    if on_device:
        monkeypatch.setattr(bd, "draft_chains", lambda *a: calls.append(a) or chains(*a))
    be = BatchEngine(target, opts, max_batch=3, max_context=256, static=True, capture=False,
                     prefill_chunk=8, batch_drafter=bd)
    reqs = [be.submit(p, 20) for p in prompts]
    be.run()
    assert [r.tokens for r in reqs] == [w.tokens for w in want]
    assert [r.accepted for r in reqs] == [w.accepted for w in want]
    assert max(max(r.accepted) for r in reqs) > 1
    assert bool(calls) == on_device


def test_the_context_update_queued_before_the_read_writes_what_the_late_one_writes(
        toy, toy_trained, monkeypatch):
    """Option batch_overlap: the drafter's context update of a decode step is queued behind
    the verify step from the counts on the device (`queue_extend`) before the host reads
    the acceptance, or with the option off after the read (`extend_rows`): the same tokens
    and acceptance as a single request's, the same drafter K/V and context lengths."""
    target, prompts, _ = toy
    net = toy_trained[0]
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, 20, BlockDrafter(net, target, 256)) for p in prompts[:3]]
    caches = []
    for on in (True, False):
        bd = BatchBlockDrafter(net, target, 256, rows=4, static=True, capture=False)
        calls = {"queue_extend": 0, "extend_rows": 0}
        for name in calls:
            real = getattr(bd, name)
            monkeypatch.setattr(bd, name, lambda *a, _n=name, _f=real: (
                calls.__setitem__(_n, calls[_n] + 1), _f(*a))[1])
        opts = Options({"draft_len": 3, "block_size": 4, "batch_overlap": on})
        be = BatchEngine(target, opts, max_batch=3,
                         max_context=256, static=True, capture=False, prefill_chunk=8,
                         batch_drafter=bd)
        reqs = [be.submit(p, 20) for p in prompts[:3]]   # one batch: the same rows each time
        be.run()
        assert [r.tokens for r in reqs] == [w.tokens for w in want]
        assert [r.accepted for r in reqs] == [w.accepted for w in want]
        assert (calls["queue_extend"] > 0) == on   # prefill chunks update after their read
        assert calls["extend_rows"] > 0
        caches.append((bd.k, bd.v, list(bd.ctx_len)))
    (k0, v0, n0), (k1, v1, n1) = caches
    assert n0 == n1 and all(torch.equal(a, b) for a, b in zip(k0 + v0, k1 + v1))


def test_drafts_queued_ahead_serve_the_single_request_tokens_and_acceptance(
        toy, toy_trained, monkeypatch):
    """Option batch_draft_ahead: a step's successor's drafts are queued once the host has
    read the step's acceptance; the next step takes them where its requests were all among
    the step's (a subset, after a request finished), else drafts again (a request admitted
    into a freed row must not take the chain of the row's last request). More requests than
    rows, ragged budgets: the single-request tokens and acceptance, and fewer drafts at a
    step's start than steps."""
    import stock.batch as batch_mod

    target, prompts, _ = toy
    net = toy_trained[0]
    budgets = [20, 7, 13, 20, 9, 16]
    single = Engine(target, Options({"draft_len": 3, "block_size": 4}), 256)
    want = [single.generate(p, m, BlockDrafter(net, target, 256))
            for p, m in zip(prompts, budgets)]
    bd = BatchBlockDrafter(net, target, 256, rows=4, static=True, capture=False)
    be = BatchEngine(target, Options({"draft_len": 3, "block_size": 4,
                                      "batch_draft_ahead": True}),
                     max_batch=3, max_context=256, static=True, capture=False,
                     prefill_chunk=8, batch_drafter=bd)
    took = {"all": 0, "some": 0, "none": 0}
    real = batch_mod.BatchEngine._drafted_ahead

    def counted(self, live):
        ahead = self._ahead
        got = real(self, live)
        if ahead is not None:
            took["none" if got is None else "all" if got is ahead[1] else "some"] += 1
        return got
    monkeypatch.setattr(batch_mod.BatchEngine, "_drafted_ahead", counted)
    reqs = [be.submit(p, m) for p, m in zip(prompts, budgets)]
    be.run()
    assert [r.tokens for r in reqs] == [w.tokens for w in want]
    assert [r.accepted for r in reqs] == [w.accepted for w in want]
    assert took["all"] > 5 and took["some"] >= 1 and took["none"] >= 1, took


def test_a_queued_context_update_past_a_row_s_context_is_refused(toy, toy_trained):
    target, _, _ = toy
    bd = BatchBlockDrafter(toy_trained[0], target, 256, rows=3, static=True, capture=False)
    width = len(bd.hidden_layers) * target.cfg.hidden_size
    with pytest.raises(BlockDrafterError, match="does not extend its context of 0"):
        bd.queue_extend([1], [5], torch.tensor([2]), torch.zeros(1, 4, width))
    with pytest.raises(BlockDrafterError, match="static path"):
        BatchBlockDrafter(toy_trained[0], target, 256, rows=3).queue_extend(
            [0], [0], torch.tensor([1]), torch.zeros(1, 4, width))


def test_device_chains_are_the_lattices_top_one_and_reach_the_dynamic_forward(
        toy, toy_trained, monkeypatch):
    """`draft_chains` gives draft()'s chains on the device, zeros for a row that drafts
    nothing; a step too long for the static buckets (BUCKETS cut here) reads them to the
    host for the dynamic forward, with the same outputs."""
    import stock.batch as batch_mod

    target, prompts, _ = toy
    net = toy_trained[0]
    bd = BatchBlockDrafter(net, target, 256, rows=4, static=True, capture=False)
    layers = tuple(net.cfg.target_layers)
    pend = []
    for row, p in enumerate(prompts[:3]):
        out = target(torch.tensor([p]), target.new_cache(256), 0, logits="last",
                     hidden_layers=layers)
        pend.append(int(out.logits[0, -1].argmax()))
        bd.extend([(row, len(p), torch.cat([out.hidden[i][0] for i in layers], -1))])
    ks = [3, 0, 2]
    lat = bd.draft([0, 1, 2], pend, ks)
    got = bd.draft_chains([0, 1, 2], pend, ks).long()
    assert got.shape == (3, net.cfg.block_size) and not got[1].any()
    for i, k in enumerate(ks):
        assert got[i, :k].tolist() == lat[i].chain[:k]
    assert bd.draft_chains([0], pend[:1], [0]) is None

    opts = Options({"draft_len": 3, "block_size": 4})
    single = Engine(target, opts, 256)
    want = [single.generate(p, 12, BlockDrafter(net, target, 256)).tokens for p in prompts[:3]]
    be = BatchEngine(target, opts, max_batch=3, max_context=256, static=True, capture=False,
                     batch_drafter=BatchBlockDrafter(net, target, 256, rows=4, static=True,
                                                     capture=False))
    reqs = [be.submit(p, 12) for p in prompts[:3]]
    be.step()                                        # admitted through the static steps
    monkeypatch.setattr(batch_mod, "BUCKETS", (1, 2))   # then every 4-token step: dynamic
    monkeypatch.setattr(be.runner, "step", _no)
    be.run()
    assert [r.tokens for r in reqs] == want and be._chains is None


def test_chain_len_drafts_only_the_columns_a_step_verifies(toy, toy_trained):
    """A drafter made with chain_len k runs the head over a block's first k positions only:
    its chains are the whole block's first k columns; a row asking for more is refused."""

    target, prompts, _ = toy
    net = toy_trained[0]
    layers = tuple(net.cfg.target_layers)
    whole = BatchBlockDrafter(net, target, 256, rows=3, static=True, capture=False)
    cut = BatchBlockDrafter(net, target, 256, rows=3, static=True, capture=False,
                            chain_len=3)
    assert whole.chain_len == net.cfg.block_size and cut.chain_len == 3
    pend = []
    for row, p in enumerate(prompts[:2]):
        out = target(torch.tensor([p]), target.new_cache(256), 0, logits="last",
                     hidden_layers=layers)
        pend.append(int(out.logits[0, -1].argmax()))
        for bd in (whole, cut):
            bd.extend([(row, len(p), torch.cat([out.hidden[i][0] for i in layers], -1))])
    full = whole.draft_chains([0, 1], pend, [3, 2]).long()
    got = cut.draft_chains([0, 1], pend, [3, 2]).long()
    assert got.shape == (2, 3) and got.tolist() == full[:, :3].tolist()
    with pytest.raises(BlockDrafterError, match="chain_len"):
        cut.draft_chains([0, 1], pend, [4, 1])


def test_a_batch_drafter_and_a_drafter_factory_are_refused_together(toy):
    target, _, _ = toy
    bd = BatchBlockDrafter(random_net(target), target, 64, rows=2)
    with pytest.raises(BatchError, match="not both"):
        BatchEngine(target, max_batch=1, max_context=64, batch_drafter=bd,
                    drafter_factory=lambda: None)


def test_the_auto_drafter_is_batched_where_the_block_drafter_is_chosen(toy, toy_trained,
                                                                       tmp_path):
    """stock.system.batch_engine resolves "auto" as make_drafter does: the block drafter,
    batched (one drafter for every row), where its weights fit the target; else n-gram
    drafters, one per request (a shared single-request BlockDrafter would mix rows)."""
    from stock.drafters.block_weights import save_block
    from stock.drafters.ngram import NGramDrafter
    from stock.system import batch_engine

    target, _, _ = toy
    save_block(toy_trained[0], tmp_path / "w", target=target, seed=0)
    fits = Engine(target, Options({"block_weights": str(tmp_path / "w")}), 256)
    be = batch_engine(fits, "auto", 2, capture=False)
    assert isinstance(be.batch_drafter, BatchBlockDrafter)
    other = Engine(target, Options({"block_weights": str(tmp_path / "none")}), 256)
    be = batch_engine(other, "auto", 2, capture=False)
    assert be.batch_drafter is None and isinstance(be.drafter_factory(), NGramDrafter)
