"""Block drafter: forward shapes and lattices, the engine's hidden-state hook, a toy-trained
drafter accepted and lossless, weights on disk, and speculative ≡ autoregressive whatever the
drafter's quality (its training: tests/test_training_block.py)."""

from __future__ import annotations

import json

import pytest
import torch

from stock.config import PRESETS
from stock.drafters.base import DraftContext
from stock.drafters.ngram import NGramDrafter
from stock.drafters.block import BlockConfig, BlockDrafter, BlockDrafterError, BlockNet
from stock.drafters.block_weights import load_block, save_block, target_fingerprint
from stock.engine import Engine
from stock.errors import StockError
from stock.model import Transformer
from stock.options import Options
from stock.system import make_drafter

from block_fixtures import *  # noqa: F401,F403
from block_fixtures import TOY, one_thread, random_net  # noqa: F401


def prefilled(target, prompt, drafter):
    cache = target.new_cache(128)
    out = target(torch.tensor([prompt]), cache, 0, hidden_layers=drafter.hidden_layers)
    return DraftContext(prompt + [int(out.logits[0, -1].argmax())], out.hidden)


def test_default_context_layers_spread_over_the_target():
    cfg = BlockConfig.for_target(PRESETS["smollm2-135m"])
    assert cfg.target_layers == (1, 10, 19, 28) and cfg.block_size == 16
    with pytest.raises(BlockDrafterError, match="outside"):
        BlockConfig.for_target(PRESETS["tiny-qwen3"], target_layers=(0, 5))


def test_block_forward_gives_a_valid_lattice():
    target = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    drafter = BlockDrafter(random_net(target), target, 128, topk=3)
    ctx = prefilled(target, list(range(5, 17)), drafter)
    lat = drafter.draft(ctx, 9)
    assert lat.ids.shape == (4, 3) and lat.logprobs.shape == (4, 3)  # clipped to block_size
    assert ((lat.ids >= 0) & (lat.ids < 512)).all()
    assert (lat.logprobs <= 0).all() and (lat.logprobs[:, :-1] >= lat.logprobs[:, 1:]).all()
    assert lat.chain == lat.ids[:, 0].tolist()
    logits = drafter.block_logits(ctx.tokens[-1])
    assert logits.shape == (4, 512) and logits.dtype == torch.float32
    assert lat.chain == logits.argmax(-1).tolist()
    assert len(drafter.draft(DraftContext(ctx.tokens, {}), 2)) == 2  # context already held


def test_missing_or_gapped_hidden_states_are_errors():
    target = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    drafter = BlockDrafter(random_net(target), target, 128)
    with pytest.raises(BlockDrafterError, match="no target hidden states"):
        drafter.draft(DraftContext([1, 2, 3], {}), 4)
    ctx = prefilled(target, [4, 5, 6], drafter)
    gap = DraftContext(ctx.tokens + [7, 8, 9], {k: v[:, :1] for k, v in ctx.hidden.items()})
    with pytest.raises(BlockDrafterError, match="do not extend"):
        drafter.draft(gap, 4)
    with pytest.raises(BlockDrafterError, match="layers"):
        drafter.draft(DraftContext(ctx.tokens, {0: ctx.hidden[0]}), 4)


@pytest.mark.parametrize("static", [False, True])
def test_engine_feeds_the_committed_context_only(toy, toy_trained, static):
    """After speculative generation with rejections, the drafter's context equals the one
    built from a single target forward over the committed tokens; with `static` (the
    fixed-shape step: block_size + 1 context rows a step, stale ones past the span) too."""
    target, prompts, _ = toy
    drafter = BlockDrafter(toy_trained[0], target, 256, static=static)
    engine = Engine(target, Options({"draft_len": 4}), max_context=256)
    res = engine.generate(prompts[0], 40, drafter)
    assert any(a < 5 for a in res.accepted[:-1])  # some draft tokens were rejected
    tokens = (prompts[0] + res.tokens)[: drafter.ctx_len]
    fresh = BlockDrafter(toy_trained[0], target, 256)
    cache = target.new_cache(256)
    out = target(torch.tensor([tokens]), cache, 0, hidden_layers=fresh.hidden_layers)
    fresh.extend(out.hidden, len(tokens))
    for mine, ref in zip(drafter.k + drafter.v, fresh.k + fresh.v):
        assert torch.allclose(mine[:, :, : len(tokens)], ref[:, :, : len(tokens)], atol=1e-5)


def test_trained_drafter_is_accepted_and_lossless(toy, toy_trained):
    target, prompts, _ = toy
    engine = Engine(target, Options({"draft_len": 4}), max_context=256)
    taus = []
    for p in prompts[:4]:
        ar = engine.generate(p, 40)
        sp = engine.generate(p, 40, BlockDrafter(toy_trained[0], target, 256))
        assert sp.tokens == ar.tokens
        taus.append(sp.tau)
    assert max(taus) > 1.5  # it learned the target's continuations


def test_static_engine_path_feeds_the_block_drafter(toy, toy_trained):
    """The padded static step (the CUDA-graph path, run eagerly here) gives the drafter the
    same context and the output stays the AR output."""
    target, prompts, _ = toy
    opts = Options({"draft_len": 4})
    dynamic = Engine(target, opts, max_context=256)
    static = Engine(target, opts, max_context=256, static=True)
    for p in prompts[:2]:
        ar = dynamic.generate(p, 30)
        d1, d2 = (BlockDrafter(toy_trained[0], target, 256) for _ in range(2))
        a, b = dynamic.generate(p, 30, d1), static.generate(p, 30, d2)
        assert a.tokens == b.tokens == ar.tokens and a.accepted == b.accepted
        n = d1.ctx_len
        assert d2.ctx_len == n and torch.allclose(d1.k[0][:, :, :n], d2.k[0][:, :, :n], atol=1e-5)


def test_static_chain_steps_take_the_draft_on_the_device(toy, toy_trained):
    """On the static path the block drafter's chain goes from its packed lattice into the
    verify step on the device (GraphRunner.chain_step, no host read of the lattice): AR's
    tokens and the host-read path's steps; a lattice log or the test fault (both on the
    host) keeps the host read."""
    from stock.lattice_log import LatticeRecorder

    target, prompts, _ = toy
    static = Engine(target, Options({"draft_len": 4}), max_context=256, static=True)
    used = []
    step = static.runner.chain_step
    static.runner.chain_step = lambda *a, **kw: (used.append(a[3]), step(*a, **kw))[1]

    class HostOnly:   # the same drafter without draft_packed: the lattice read to the host
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "draft_packed":
                raise AttributeError(name)
            return getattr(self.inner, name)

    for p in prompts[:2]:
        ar = static.generate(p, 30)
        dev = static.generate(p, 30, BlockDrafter(toy_trained[0], target, 256, static=True))
        steps = len(used)
        host = static.generate(p, 30, HostOnly(BlockDrafter(toy_trained[0], target, 256,
                                                            static=True)))
        assert len(used) == steps > 0   # the device path ran, and only with draft_packed
        assert dev.tokens == host.tokens == ar.tokens and dev.accepted == host.accepted
    assert max(used) == 4 and any(a < 5 for a in dev.accepted)   # drafts were also rejected
    before = len(used)
    static.generate(prompts[0], 10, BlockDrafter(toy_trained[0], target, 256, static=True),
                    recorder=LatticeRecorder(4))
    assert len(used) == before


def test_the_device_chain_is_the_lattices_top_one_and_chain_steps_take_it(toy, toy_trained):
    """`draft_chain` (the static step ending in an argmax) gives the top-1 tokens of
    `draft_packed`'s lattice from the same context; the engine's device chain steps take
    the chain (never the lattice) and serve AR's tokens."""
    target, prompts, _ = toy
    net = toy_trained[0]
    for p in prompts[:3]:
        a, b = (BlockDrafter(net, target, 256, static=True) for _ in range(2))
        ctx = prefilled(target, p, a)   # the same context for both (neither changes it)
        lat, chain = a.draft_packed(ctx, 4), b.draft_chain(ctx, 4)
        assert chain.dtype == torch.long and chain.shape == (net.cfg.block_size,)
        assert torch.equal(lat[0, :, 0].long(), chain)
        assert a.draft_packed(DraftContext(ctx.tokens, ctx.hidden), 0) is None
    static = Engine(target, Options({"draft_len": 4}), max_context=256, static=True)
    d = BlockDrafter(net, target, 256, static=True)
    calls = {"draft_chain": 0, "draft_packed": 0}
    for name in calls:
        def spy(*a, inner=getattr(d, name), name=name):
            calls[name] += 1
            return inner(*a)
        setattr(d, name, spy)
    for p in prompts[:2]:
        assert static.generate(p, 30, d).tokens == static.generate(p, 30).tokens
    assert calls["draft_chain"] > 0 and calls["draft_packed"] == 0


def _drafts(engine, prompt, drafter, max_new=40):
    """(result, every lattice the drafter returned)."""
    seen, inner = [], drafter.draft

    def record(ctx, k):
        lat = inner(ctx, k)
        seen.append(lat)
        return lat
    drafter.draft = record
    return engine.generate(prompt, max_new, drafter), seen


def test_fixed_shape_step_drafts_what_the_plain_path_drafts(toy, toy_trained):
    """The fixed-shape step (stock/drafters/block_step.py: context update of block_size + 1
    rows inside the step, stale rows past the committed span) drafts the plain path's
    lattices: same ids, log-probs equal up to fp32 rounding (its context GEMM has more
    rows), over spans of every length the engine commits."""
    target, prompts, _ = toy
    engine = Engine(target, Options({"draft_len": 4}), max_context=256)
    spans = set()
    for p in prompts[:3]:
        ar = engine.generate(p, 40)
        plain, want = _drafts(engine, p, BlockDrafter(toy_trained[0], target, 256))
        d = BlockDrafter(toy_trained[0], target, 256, static=True)
        extends, inner = [], d.extend
        d.extend = lambda hidden, end: extends.append(end) or inner(hidden, end)
        fixed, got = _drafts(engine, p, d)
        assert fixed.tokens == plain.tokens == ar.tokens and fixed.accepted == plain.accepted
        assert extends == [len(p)]  # only the prompt: every step's span went into the step
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert torch.equal(a.ids, b.ids)
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=1e-4)
        spans |= set(fixed.accepted[:-1])
    assert {1, 5} <= spans and len(spans) >= 3  # rejections, full acceptance, in between


def test_fixed_shape_step_traces_to_one_graph_per_region(toy, toy_trained, monkeypatch):
    """Through stock/compiled.py's regions (dynamo, its eager backend on this CPU): the same
    lattices bit for bit as the step run eagerly, no fallback, one graph per region (the
    drafter's layers share stock's), and a second request compiles nothing new."""
    from stock import compiled as C

    target, prompts, _ = toy
    monkeypatch.setattr(C, "BACKEND", "eager")
    C.reset()
    engine = Engine(target, Options({"draft_len": 4}), max_context=256)
    try:
        counts = []
        for p in prompts[:2]:
            _, want = _drafts(engine, p, BlockDrafter(toy_trained[0], target, 256, static=True))
            traced = BlockDrafter(toy_trained[0], target, 256, static=True)
            traced.compiled = True  # the CUDA-only switch, on the CPU for the test
            res, got = _drafts(engine, p, traced)
            assert res.tokens == engine.generate(p, 40).tokens
            assert [(a.ids.tolist(), a.logprobs.tolist()) for a in got] == \
                [(b.ids.tolist(), b.logprobs.tolist()) for b in want]
            counts.append(C.graphs_compiled())
        assert C.fallbacks() == {}
        # prologue, context, attn_in, attn_out_mlp (the toy drafter has one layer), lattice
        assert counts == [5, 5]
    finally:
        C.reset()


def test_weights_round_trip_and_checksums(tmp_path, toy, toy_trained):
    target, _, _ = toy
    net = toy_trained[0]
    man = save_block(net, tmp_path / "w", target=target, seed=0, command="test")
    assert all(s.bytes <= 16_000_000 for s in man.shards)
    loaded, man2 = load_block(tmp_path / "w", target)
    assert man2.config == net.cfg and man2.target_fingerprint == target_fingerprint(target)
    for (name, a), (_, b) in zip(net.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), name
    # corrupt one byte of a shard: the checksum catches it
    shard = tmp_path / "w" / man.shards[0].file
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x55
    shard.write_bytes(bytes(raw))
    with pytest.raises(BlockDrafterError, match="sha256"):
        load_block(tmp_path / "w", target)
    with pytest.raises(BlockDrafterError, match="training.block"):
        load_block(tmp_path / "nothing", target)
    other = Transformer.random(PRESETS["tiny-qwen3"], seed=99)
    save_block(net, tmp_path / "w2", target=target, seed=0)
    with pytest.raises(BlockDrafterError, match="another target"):
        load_block(tmp_path / "w2", other)
    bad = json.loads((tmp_path / "w2" / "manifest.json").read_text())
    bad["config"]["hidden_size"] = 32
    (tmp_path / "w2" / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(BlockDrafterError, match="block drafter built for"):
        load_block(tmp_path / "w2", target)


def test_save_splits_shards_under_the_limit(tmp_path, monkeypatch):
    import stock.drafters.block_weights as bw

    target = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    monkeypatch.setattr(bw, "MAX_SHARD_BYTES", 70_000)
    man = bw.save_block(random_net(target), tmp_path, target=target, seed=0)
    assert len(man.shards) > 1 and all(s.bytes <= 70_000 for s in man.shards)
    assert len(bw.load_block(tmp_path, target)[0].state_dict()) == sum(len(s.tensors)
                                                                       for s in man.shards)


def test_make_drafter_block(tmp_path, toy, toy_trained):
    target, _, _ = toy
    engine = Engine(target, Options({"block_weights": str(tmp_path / "none")}), max_context=256)
    with pytest.raises(StockError, match="training.block"):
        make_drafter("block", engine)
    save_block(toy_trained[0], tmp_path / "w", target=target, seed=0)
    engine = Engine(target, Options({"block_weights": str(tmp_path / "w"), "block_size": 3,
                                     "block_topk": 2}), max_context=256)
    drafter = make_drafter("block", engine)
    assert isinstance(drafter, BlockDrafter) and drafter.net.cfg.block_size == 3
    assert drafter.hidden_layers == toy_trained[0].cfg.target_layers
    assert make_drafter(None, engine) is None  # the default stays autoregressive
    # one block drafter per engine (weights read once, CUDA graphs kept); each request
    # starts from a reset context
    assert make_drafter("block", engine) is drafter
    prompt = list(range(20, 40))
    first = engine.generate(prompt, 12, drafter)
    engine.generate(list(range(60, 90)), 12, drafter)
    again = engine.generate(prompt, 12, make_drafter("block", engine))
    assert again.tokens == first.tokens and again.accepted == first.accepted


def test_auto_drafter_is_the_block_drafter_where_its_weights_fit_the_target(tmp_path, toy,
                                                                            toy_trained):
    target, _, _ = toy
    save_block(toy_trained[0], tmp_path / "w", target=target, seed=0)
    engine = Engine(target, Options({"block_weights": str(tmp_path / "w")}), max_context=256)
    assert make_drafter("auto", engine) is make_drafter("block", engine)
    for weights in (str(tmp_path / "none"), ""):   # none there; the shipped ones: not this target's
        engine = Engine(target, Options({"block_weights": weights}), max_context=256)
        assert isinstance(make_drafter("auto", engine), NGramDrafter)
    with pytest.raises(StockError, match="auto"):
        make_drafter("blocks", engine)


def test_shipped_weights_load_by_default_for_the_embedded_model(smol):
    """The trained drafter ships with the package: the block drafter of the embedded model
    loads it by default, every shard is under 16 MB and matches its checksum, and the
    manifest names the target, the seed and the command that trained it."""
    from stock.drafters.block_weights import DEFAULT_DIR, MAX_SHARD_BYTES, read_manifest

    man = read_manifest(DEFAULT_DIR)
    assert all((DEFAULT_DIR / s.file).stat().st_size == s.bytes <= MAX_SHARD_BYTES
               for s in man.shards)
    # the first run was trained under the command's old name (stock.drafters.train_block)
    assert man.dtype == "bfloat16" and f"--seed {man.seed} " in man.command
    assert "-m stock.drafters.train_block " in man.command or "-m training.block " in man.command
    # continued from run to run (issue 24): every earlier run is in the history
    assert all(f"--seed {run['seed']} " in run["command"] for run in man.history)
    drafter = make_drafter("block", smol.engine)  # checks fingerprint and sha256
    assert isinstance(drafter, BlockDrafter) and drafter.net.cfg == man.config
    assert drafter.hidden_layers == man.config.target_layers


def test_shipped_weights_refuse_another_target_and_a_corrupt_shard(smol, toy, tmp_path):
    """Weights for another target, or a shard changed by one bit, are clear errors."""
    import shutil

    from stock.drafters.block_weights import DEFAULT_DIR, read_manifest

    engine = Engine(toy[0], Options(), max_context=256)
    with pytest.raises(StockError, match="block drafter built for|another target"):
        make_drafter("block", engine)
    copy = tmp_path / "w"
    shutil.copytree(DEFAULT_DIR, copy)
    shard = copy / read_manifest(copy).shards[-1].file
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(StockError, match="sha256"):
        load_block(copy, smol.engine.model)


@pytest.mark.slow
def test_block_speculative_equals_autoregressive_embedded(smol, dev_prompts):
    """The embedded model in fp32 with an untrained block drafter (blocks of 16, 4 of them
    verified a step to keep CPU time down): the same tokens as autoregressive decoding."""
    model = smol.engine.model
    net = BlockNet(BlockConfig.for_target(model.cfg, num_layers=1)).init_weights(0)
    engine = Engine(model, Options({"draft_len": 4}), 1024, smol.engine.stop_ids)
    drafter = BlockDrafter(net, model, 1024)
    prompt = dev_prompts[2]
    ar = engine.generate(prompt, 16)
    sp = engine.generate(prompt, 16, drafter)
    assert sp.tokens == ar.tokens
    assert drafter.ctx_len >= len(prompt) + sp.steps - 1


def reference_block_logits(net, target, tokens, pending):
    """The drafter's logits computed the plain way: the module path (BlockNet.forward), the
    context built from one target forward, no cache, no mask, no fused weights."""
    out = target(torch.tensor([tokens]), target.new_cache(256), 0,
                 hidden_layers=net.cfg.target_layers)
    n, t = len(tokens), net.cfg.block_size
    feat = net.features([out.hidden[i] for i in net.cfg.target_layers])
    ctx = net.context_kv(feat, target.cos[:n][None, None], target.sin[:n][None, None])
    x = net.block_inputs(target.model.embed_tokens(torch.tensor([pending])))  # [1, T, H]
    pos = torch.arange(n, n + t)
    h = net(x, target.cos[pos][None, None], target.sin[pos][None, None], ctx)
    return target.lm_head(h[0]).float()


def test_fused_fixed_shape_drafter_matches_the_module_path(toy, toy_trained):
    """The inference path (fused GEMMs, block K/V in the cache, bucketed keys under a mask)
    computes what the modules compute, at several context lengths and for qk-norm targets."""
    target, prompts, data = toy
    for net in (toy_trained[0], random_net(target, block_size=5)):
        drafter = BlockDrafter(net, target, 256)
        for n in (3, 17, 40):
            tokens = data.tokens[0, data.pad[0]:][:n].tolist()
            out = target(torch.tensor([tokens]), target.new_cache(256), 0,
                         hidden_layers=drafter.hidden_layers)
            drafter.reset()
            drafter.extend(out.hidden, n)
            got = drafter.block_logits(7)
            ref = reference_block_logits(net, target, tokens, 7)
            assert got.shape == ref.shape
            assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (n, (got - ref).abs().max())
            assert drafter.kv_bucket(n + net.cfg.block_size) == 256  # one fixed shape here


def test_block_graphs_need_cuda(tmp_path):
    target = Transformer.random(PRESETS["tiny-qwen3"], seed=3)
    with pytest.raises(BlockDrafterError, match="CUDA"):
        BlockDrafter(random_net(target), target, 64, graphs=True)
    assert Options()["block_graphs"] is True  # on by default, as cuda_graphs ...
    save_block(random_net(target, block_size=16), tmp_path / "w", target=target, seed=0)
    engine = Engine(target, Options({"block_weights": str(tmp_path / "w")}), max_context=64)
    drafter = make_drafter("block", engine)
    assert drafter.graphs is False and drafter.compiled is False  # ... ignored on the CPU
    with pytest.raises(BlockDrafterError, match="CUDA"):
        BlockDrafter(random_net(target), target, 64, compiled=True)
