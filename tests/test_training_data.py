"""Block-drafter training at scale: prompt shards, saved answers (--data-out / --data-in),
hidden states computed per step (--features live) and continuing from trained weights
(--init-from-weights). Toy target on CPU, fp32."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from stock.drafters.block import BlockConfig, BlockDrafterError, BlockNet
from stock.drafters.block_weights import load_block, save_block, target_fingerprint
from training import loop
from training.cli import main, toy_setup
from training.data import (Data, DataFileError, DataHeader, generate_data, load_data,
                           load_merged, parse_shard, save_data, shard)
from training.loop import (LiveFeatures, TrainConfig, block_loss, evaluate, extract_features,
                           init_net, sample_anchors, train)

TOY = dict(prompts=8, max_new=24, gen_batch=8, num_layers=1, num_target_layers=2, block_size=4,
           batch=4, anchors=4, warmup=2, lr=3e-3)
CLI = ["--seed", "3", "--toy", "--prompts", "6", "--max-new", "12", "--steps", "4",
       "--val-every", "2"]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    target, prompts = toy_setup(0, TOY["prompts"])
    data = generate_data(target, prompts, TOY["max_new"], 8, set(), progress=lambda m: None)
    return target, prompts, data


def test_shards_are_disjoint_and_cover_the_corpus():
    corpus = [f"prompt {i}" for i in range(23)]
    for n in (1, 2, 3, 5):
        parts = [shard(corpus, f"{i}/{n}") for i in range(n)]
        flat = [p for part in parts for p in part]
        assert sorted(flat) == sorted(corpus) and len(flat) == len(set(flat))
        assert all(part == corpus[i::n] for i, part in enumerate(parts))
    assert shard(corpus, "") == corpus and parse_shard("") == (0, 1)
    for bad in ("2/2", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="--prompt-shard"):
            parse_shard(bad)


def test_data_out_then_in_trains_bit_equal_weights(tmp_path):
    """Answering in the run, or in two shard runs saved and merged back in corpus-shard
    order, gives the same rows; one file saved and read back trains the same weights."""
    main(CLI + ["--out", str(tmp_path / "a")])
    main(CLI + ["--data-out", str(tmp_path / "d.pt")])
    assert not (tmp_path / "d.pt.tmp").exists() and not (tmp_path / "b").exists()
    main(CLI + ["--out", str(tmp_path / "b"), "--data-in", str(tmp_path / "d.pt")])
    wa = {k: v for f in sorted((tmp_path / "a").glob("*.safetensors")) for k, v in
          load_file(str(f)).items()}
    wb = {k: v for f in sorted((tmp_path / "b").glob("*.safetensors")) for k, v in
          load_file(str(f)).items()}
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["data"]["files"][0]["rows"] == 6 and man["data"]["prompts"] == 6
    # shards: the two halves hold the corpus' rows i % 2 == 0 and 1, with their headers
    for i in range(2):
        main(CLI + ["--prompt-shard", f"{i}/2", "--data-out", str(tmp_path / f"s{i}.pt")])
    whole, _, _ = load_data(tmp_path / "d.pt")
    data, groups, cats, files, headers = load_merged(
        [str(tmp_path / "s0.pt"), str(tmp_path / "s1.pt")], None)
    assert [h.prompt_shard for h in headers] == ["0/2", "1/2"]
    assert [f["rows"] for f in files] == [3, 3] and cats == {"random": 6}
    assert all(h.corpus_prompts == 6 and h.prompts == 3 for h in headers)
    order = [0, 2, 4, 1, 3, 5]
    w = whole.tokens.shape[1]
    assert data.prompt_cols == whole.prompt_cols  # same widest prompt in both shards here
    assert torch.equal(data.tokens[:, :w], whole.tokens[order])
    assert torch.equal(data.end, whole.end[order]) and torch.equal(data.pad, whole.pad[order])


def test_missing_foreign_or_broken_data_files_are_clear_errors(tmp_path, toy):
    target, _, data = toy
    with pytest.raises(DataFileError, match="no such file"):
        load_data(tmp_path / "nope.pt")
    with pytest.raises(DataFileError, match="no such file"):
        main(CLI + ["--out", str(tmp_path / "w"), "--data-in", str(tmp_path / "nope.pt")])
    header = DataHeader(target_fingerprint="0123456789abcdef", target_name="another",
                        vocab_size=target.cfg.vocab_size, seed=0, corpus_prompts=8, prompts=8,
                        rows=len(data.end), answer_tokens=1, prompt_cols=data.prompt_cols,
                        max_new=24, max_prompt=256, categories={"random": 8}, gen_s=0.0)
    save_data(tmp_path / "foreign.pt", data, header, None)
    with pytest.raises(DataFileError, match="another target"):
        load_data(tmp_path / "foreign.pt", target_fingerprint(target))
    with pytest.raises(DataFileError, match="another target"):
        main(CLI + ["--out", str(tmp_path / "w"), "--data-in", str(tmp_path / "foreign.pt")])
    back, h, groups = load_data(tmp_path / "foreign.pt")  # no fingerprint: read as is
    assert torch.equal(back.tokens, data.tokens) and groups is None and h.rows == len(data.end)
    keys = [f"chat:topic {i % 3}" for i in range(len(data.end))]  # prompt groups: strings
    save_data(tmp_path / "grouped.pt", data, header, keys)
    assert load_data(tmp_path / "grouped.pt")[2] == keys
    with pytest.raises(ValueError, match="groups for"):
        save_data(tmp_path / "bad.pt", data, header, keys[:-1])
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(DataFileError, match="not a specpilot-block-data/1"):
        load_data(tmp_path / "junk.pt")
    torch.save({"header": {"format": "something-else/9"}}, tmp_path / "other.pt")
    with pytest.raises(DataFileError, match="not a specpilot-block-data/1"):
        load_data(tmp_path / "other.pt")


def test_live_features_give_the_cached_loss(toy):
    """--features live: per-batch target forwards truncated to the batch's longest answer
    give the losses and acc-lens of the features extracted once for every row."""
    target, _, full = toy
    # answers of several lengths (the toy target has no stop token): the live forward of a
    # batch is then shorter than the cached one
    end = full.prompt_cols + torch.tensor([24, 5, 17, 9, 3, 11, 24, 7])
    tokens = full.tokens.clone()
    for i, e in enumerate(end.tolist()):
        tokens[i, e:] = 0
    data = Data(tokens, full.pad, end, full.prompt_cols)
    cfg = BlockConfig.for_target(target.cfg, num_layers=1, block_size=4, num_target_layers=2)
    net = BlockNet(cfg).init_weights(1, std=0.2)
    cached = extract_features(target, data, cfg.target_layers, 3)
    live = LiveFeatures(target, data, cfg.target_layers)
    for rows in ([0, 1, 2, 3], [5, 7], [1, 4], [6]):
        idx = torch.tensor(rows)
        s = int(data.end[idx].max())
        torch.testing.assert_close(live.rows(idx, s), cached[idx, :s], rtol=1e-5, atol=1e-6)
        got = [block_loss(net, target, data, f, idx, torch.Generator().manual_seed(4), 4, 7.0)
               for f in (cached, live)]
        assert got[1][0].requires_grad  # the live features join the autograd graph
        torch.testing.assert_close(got[1][0], got[0][0], rtol=1e-5, atol=1e-5)
        assert got[1][1] == pytest.approx(got[0][1], abs=1e-6)
    idx = torch.arange(len(data.end))
    p = sample_anchors(data, idx, 4, torch.Generator().manual_seed(2))
    tc = TrainConfig(seed=0, **TOY)
    off = torch.autocast("cpu", enabled=False)
    ev = [evaluate(net, target, data, f, idx, p, tc, off) for f in (cached, live)]
    assert ev[1] == pytest.approx(ev[0], rel=1e-5)
    # and in training: the same data and seed train (nearly) the same losses
    runs = [train(target, [], TrainConfig(seed=0, steps=6, features=f, **TOY),
                  progress=lambda m: None, data=data) for f in ("cached", "live")]
    assert runs[1][2] == pytest.approx(runs[0][2], rel=1e-4)
    with pytest.raises(ValueError, match="--features"):
        train(target, [], TrainConfig(seed=0, steps=1, features="lazy", **TOY),
              progress=lambda m: None, data=data)


def test_init_from_weights_loads_the_exact_tensors_and_refuses_another_config(tmp_path, toy):
    target = toy[0]
    cfg = TrainConfig(seed=0, **TOY)
    bcfg = BlockConfig.for_target(target.cfg, cfg.num_layers, cfg.block_size,
                                  num_target_layers=cfg.num_target_layers)
    src = BlockNet(bcfg).init_weights(9, std=0.3)
    save_block(src, tmp_path / "w", target=target, seed=9)
    saved, _ = load_block(tmp_path / "w", target)
    cfg.init_from_weights = str(tmp_path / "w")
    net, init = init_net(target, bcfg, cfg)
    assert str(tmp_path / "w") in init
    fresh, _ = init_net(target, bcfg, TrainConfig(seed=0, **TOY))
    state, ref = net.state_dict(), saved.state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
    assert not torch.equal(fresh.state_dict()["fc.weight"], ref["fc.weight"])
    wider = BlockConfig.for_target(target.cfg, cfg.num_layers, 6,
                                   num_target_layers=cfg.num_target_layers)
    with pytest.raises(BlockDrafterError, match="block_size"):
        init_net(target, wider, cfg)
    cfg.init_from_target = "last"
    with pytest.raises(ValueError, match="give one"):
        init_net(target, bcfg, cfg)
    # the CLI (toy target of seed 3: the weights above are another target's) records it in
    # the manifest and trains from there
    with pytest.raises(BlockDrafterError, match="another target"):
        main(CLI + ["--out", str(tmp_path / "b"), "--init-from-weights", str(tmp_path / "w")])
    cli_target, _ = toy_setup(3, 6)
    save_block(BlockNet(bcfg).init_weights(9, std=0.3), tmp_path / "w3", target=cli_target,
               seed=9)
    main(CLI + ["--out", str(tmp_path / "b"), "--init-from-weights", str(tmp_path / "w3")])
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert str(tmp_path / "w3") in man["data"]["init"]
    assert man["training"]["init_from_weights"] == str(tmp_path / "w3")


def test_a_drafter_grows_into_more_layers_drafting_the_same_at_the_start(tmp_path, toy):
    """--init-from-weights (or --resume) with a larger --num-layers: the weights' layers
    first, the new ones appended with their output projections zero, so the grown drafter's
    loss is the small one's to the bit until training moves them; any other config change
    is still refused; a grown --resume starts a fresh optimizer and says why."""
    target, _, data = toy
    cfg = TrainConfig(seed=0, **TOY)
    small = BlockConfig.for_target(target.cfg, 1, cfg.block_size,
                                   num_target_layers=cfg.num_target_layers)
    big = small.model_copy(update={"num_layers": 3})
    save_block(BlockNet(small).init_weights(9, std=0.3), tmp_path / "w", target=target, seed=9)
    src, _ = load_block(tmp_path / "w", target)
    cfg.init_from_weights = str(tmp_path / "w")
    net, init = init_net(target, big, cfg)
    assert "grown from 1 to 3 layers" in init and len(net.layers) == 3
    state, ref = net.state_dict(), src.state_dict()
    assert all(torch.equal(state[k], ref[k]) for k in ref)
    assert net.layers[1].self_attn.q_proj.weight.detach().abs().sum() > 0   # seeded, not zero
    idx = torch.arange(len(data.end))
    p = sample_anchors(data, idx, 4, torch.Generator().manual_seed(2))
    feats = extract_features(target, data, small.target_layers, 8)
    off = torch.autocast("cpu", enabled=False)
    before = evaluate(src, target, data, feats, idx, p, cfg, off)
    assert evaluate(net, target, data, feats, idx, p, cfg, off) == before
    with pytest.raises(BlockDrafterError, match="block_size"):   # growth is layers only
        init_net(target, big.model_copy(update={"block_size": 6}), cfg)
    save_block(BlockNet(big).init_weights(1), tmp_path / "big", target=target, seed=1)
    with pytest.raises(BlockDrafterError, match="num_layers"):   # and never shrinks
        init_net(target, small, TrainConfig(seed=0, init_from_weights=str(tmp_path / "big"),
                                            **TOY))
    # resumed, grown: its training state (of one layer) is not loaded, the run says so
    said: list[str] = []
    rcfg = TrainConfig(seed=0, steps=3, resume=str(tmp_path / "w"), val_every=0,
                       **{**TOY, "num_layers": 3})   # no validation: the last step is kept
    grown, stats, losses = train(target, [], rcfg, progress=said.append, data=data)
    assert any("grown from 1 to 3 layers: a fresh optimizer" in m for m in said), said
    assert grown.layers[2].mlp.down_proj.weight.detach().abs().sum() > 0   # it trained them


def test_cached_features_that_would_not_fit_fall_back_to_live(toy, monkeypatch):
    """--features cached on a device without room for every row's hidden states trains
    with live features instead, says so, and records it (nothing of the answering lost)."""
    target, _, data = toy
    cfg = TrainConfig(seed=0, steps=4, **TOY)
    said: list[str] = []
    monkeypatch.setattr(loop, "free_bytes", lambda dev: 1000)  # 1 kB free
    _, stats, losses = train(target, [], cfg, progress=said.append, data=data)
    assert stats["features_used"] == "live (cached would not fit)"
    assert any("live features instead" in m and "need" in m for m in said)
    _, live_stats, live_losses = train(target, [], TrainConfig(seed=0, steps=4, features="live",
                                                              **TOY),
                                       progress=lambda m: None, data=data)
    assert live_stats["features_used"] == "live" and losses == live_losses
    monkeypatch.setattr(loop, "free_bytes", lambda dev: 10**12)  # room: stays cached
    assert train(target, [], cfg, progress=lambda m: None, data=data)[1]["features_used"] \
        == "cached"
