"""Block-drafter training (training/): the toy training loop, the prompt corpus, the command's
manifest, validation and its prompt groups, initialisation, merged data. Toy target on CPU,
fp32 (weights on disk and the inference side: tests/test_block_drafter.py)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from specpilot.requests import load_dev
from stock.config import PRESETS
from stock.drafters.block import BlockDrafter, BlockDrafterError
from stock.drafters.block_weights import load_block
from stock.engine import Engine
from stock.model import Transformer
from stock.options import Options
from training.cli import main, toy_setup
from training.data import SORT_GROUP, generate_data, merge_data
from training.loop import (TrainConfig, block_forward, depth_rates, evaluate, extract_features,
                           init_layers, sample_anchors, train, validation_split, walk, walk_tau)
from training.prompts import (MIX, _math_more, build_prompts, dev_prompts, parse_mix,
                              prompt_group, shortfalls)

from block_fixtures import *  # noqa: F401,F403
from block_fixtures import TOY, one_thread, random_net  # noqa: F401


def test_toy_training_lowers_the_loss_and_repeats_bit_for_bit(toy, toy_trained):
    target, prompts, data = toy
    net, stats, losses = toy_trained
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, (first, last)
    again, stats2, losses2 = train(target, prompts, TrainConfig(seed=0, steps=40, **TOY),
                                   progress=lambda m: None, data=data)
    assert losses2 == losses
    for (name, a), (_, b) in zip(net.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    other, _, losses3 = train(target, prompts, TrainConfig(seed=1, steps=5, **TOY),
                              progress=lambda m: None, data=data)
    assert losses3[:5] != losses[:5]


def test_training_prompts_are_deterministic_balanced_and_exclude_dev():
    dev = {r.prompt for r in load_dev()}
    assert dev_prompts() == dev  # read as data (training does not import specpilot)
    a = build_prompts(3, 400, exclude=dev, limit_files=30)
    assert a == build_prompts(3, 400, exclude=dev, limit_files=30)
    assert a != build_prompts(4, 400, exclude=dev, limit_files=30)
    texts = [t for _, t in a]
    assert len(set(texts)) == len(texts) and not dev.intersection(texts)
    counts = {c: sum(1 for k, _ in a if k == c) for c in MIX}
    # 30 stdlib files run out of distinct prompts; every template source keeps its share
    assert all(abs(counts[c] - 400 * share) <= 1 for c, share in MIX.items()
               if c != "stdlib"), counts
    assert 0 < counts["stdlib"] <= 400 * MIX["stdlib"] + 1
    banned = {a[0][1]}
    assert a[0][1] not in {t for _, t in build_prompts(3, 400, exclude=banned, limit_files=30)}


def test_train_command_writes_a_manifest(tmp_path):
    main(["--out", str(tmp_path), "--seed", "5", "--toy", "--steps", "3", "--prompts", "6",
          "--max-new", "12", "--val-every", "2"])
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["seed"] == 5 and "--toy" in man["command"] and man["training"]["steps"] == 3
    assert [h["step"] for h in man["training"]["val_history"]] == [2, 3]
    assert man["training"]["kept_step"] in (2, 3)
    assert man["config"]["block_size"] == 4 and man["shards"][0]["sha256"]
    target, _ = toy_setup(5, 6)
    net, _ = load_block(tmp_path, target)
    assert net.cfg.target_layers == tuple(man["config"]["target_layers"])


def test_answering_stops_at_its_time_limit(toy):
    """--gen-seconds: groups of SORT_GROUP batches after the limit are not started; the rows
    kept are a prefix of the prompts, answered as in a run without the limit."""
    target, prompts, data = toy
    short = generate_data(target, prompts, 8, 1, set(), progress=lambda m: None,
                          max_seconds=1e-9)
    n = SORT_GROUP   # the first group only: SORT_GROUP batches of one prompt
    assert short.tokens.shape[0] == n < len(prompts) and len(short.end) == n
    assert torch.equal(short.tokens[:, : short.prompt_cols + 8],
                       data.tokens[:n, : data.prompt_cols + 8])


def test_answers_are_the_targets_greedy_outputs_in_prompt_order(toy):
    """Each row holds its prompt right-aligned to the data's prompt column and the target's
    own greedy answer (Engine.generate), whichever batch answered it: the prompts are
    sorted by length within a group and each batch is padded only to its own longest, but
    the rows come back in the prompts' order."""
    target, prompts, _ = toy
    assert len({len(p) for p in prompts}) > 2   # lengths differ: batches pad differently
    data = generate_data(target, prompts, 12, 3, set(), progress=lambda m: None)
    eng = Engine(target, Options(), 256)
    p_cols = data.prompt_cols
    assert p_cols == max(map(len, prompts))
    for i, p in enumerate(prompts):
        row, pad, end = data.tokens[i], int(data.pad[i]), int(data.end[i])
        assert pad == p_cols - len(p) and row[pad:p_cols].tolist() == p
        assert row[p_cols:end].tolist() == eng.generate(p, 12).tokens, i


def test_training_blocks_see_what_the_drafter_sees(toy, toy_trained):
    """No train/inference mismatch: the training forward's logits for a block at anchor p
    (left-padded batch, features of the padded forward) equal the drafter's after the
    engine-style context of the tokens before p, with the token at p pending."""
    target, prompts, data = toy
    net = toy_trained[0]
    feats = extract_features(target, data, net.cfg.target_layers, 8)
    idx = torch.tensor([1, 3])
    p = torch.stack([data.prompt_cols + torch.tensor([0, 5]),
                     data.prompt_cols + torch.tensor([2, 9])])
    logits, labels = block_forward(net, target, data, feats, idx, p)
    for bi, i in enumerate(idx.tolist()):
        for ai in range(p.shape[1]):
            col = int(p[bi, ai])
            tokens = data.tokens[i, data.pad[i]:col].tolist()
            drafter = BlockDrafter(net, target, 256)
            out = target(torch.tensor([tokens]), target.new_cache(256), 0,
                         hidden_layers=drafter.hidden_layers)
            drafter.extend(out.hidden, len(tokens))
            got = drafter.block_logits(int(data.tokens[i, col]))
            assert torch.allclose(got, logits[bi, ai], atol=1e-4, rtol=1e-4), \
                (i, col, (got - logits[bi, ai]).abs().max())
            want = data.tokens[i, col + 1: col + 1 + net.cfg.block_size]
            ok = labels[bi, ai] >= 0
            assert torch.equal(labels[bi, ai][ok], want[: int(ok.sum())])


def test_validation_keeps_the_best_checkpoint_and_patience_stops(toy):
    """Periodic validation on fixed anchors: the returned weights are those of the best check
    (here an early one: the random toy target's answers do not generalise), and --patience
    stops training after that many checks without a better one."""
    target, prompts, data = toy
    cfg = TrainConfig(seed=0, steps=40, val_every=5, **TOY)
    net, stats, _ = train(target, prompts, cfg, progress=lambda m: None, data=data)
    hist = stats["val_history"]
    assert [h["step"] for h in hist] == list(range(5, 41, 5))
    best = max(hist, key=lambda h: (h["val_tau"], -h["val_loss"]))
    assert stats["kept_step"] == best["step"] < stats["steps"] == 40
    _, val = validation_split(data, cfg)
    vsel = val[: cfg.val_seqs]
    vp = sample_anchors(data, vsel, cfg.anchors, torch.Generator().manual_seed(cfg.seed + 2))
    loss, acc = evaluate(net, target, data, data_feats(target, data, net), vsel, vp, cfg,
                         torch.autocast("cpu", enabled=False))
    assert round(acc, 3) == best["val_acc_len"] and abs(loss - best["val_loss"]) < 1e-3
    _, stats2, losses2 = train(target, prompts, TrainConfig(seed=0, steps=40, val_every=5,
                                                            patience=2, **TOY),
                               progress=lambda m: None, data=data)
    assert stats2["steps"] == best["step"] + 10 and len(losses2) == stats2["steps"]


def test_walk_tau_is_the_engines_tau_on_the_greedy_answers(toy, toy_trained):
    """The validation's τ (walk_tau: every answer column's block scored by teacher forcing,
    then walked as decoding walks) is the τ the engine measures decoding the same prompts
    with the same drafter, to the last step; across batches and anchor chunks."""
    target, prompts, data = toy
    net = toy_trained[0]
    k = net.cfg.block_size - 1
    engine = Engine(target, Options({"draft_len": k}), max_context=256)
    gained = steps = 0
    for i, p in enumerate(prompts[:6]):
        res = engine.generate(p, TOY["max_new"], BlockDrafter(net, target, 256))
        assert res.tokens == data.tokens[i, data.prompt_cols:int(data.end[i])].tolist()
        gained, steps = gained + sum(res.accepted), steps + len(res.accepted)
    assert steps < gained  # drafts were accepted: a τ above 1 to match
    tau = walk_tau(net, target, data, data_feats(target, data, net), torch.arange(6), k,
                   batch=4, chunk=5, autocast=torch.autocast("cpu", enabled=False))
    assert tau == pytest.approx(gained / steps, abs=1e-12)


def test_walk_and_depth_rates_count_as_decoding_does():
    """The walk starts at the first answer token and moves by each step's gain (run + 1):
    a run of 3 at anchor 0 ends a four-anchor answer in one step; runs 0, 0, 1 at anchors
    0, 1, 2 gain 1, 1, then 2. Depth d's rate: runs >= d among runs >= d - 1."""
    assert walk(torch.tensor([3, 0, 1, 0])) == [4]
    assert walk(torch.tensor([0, 0, 1, 0])) == [1, 1, 2]
    # the last step gains no more than the answer has left (the engine counts what it keeps)
    assert walk(torch.tensor([0, 2, 0])) == [1, 2]
    # depth d: anchors with a run >= d among those with a run >= d - 1
    assert depth_rates([torch.tensor([0, 1, 2, 3]), torch.tensor([1])], 3) == [4 / 5, 2 / 4, 1 / 2]


def data_feats(target, data, net):
    return extract_features(target, data, net.cfg.target_layers, 8).clone()


def test_validation_holds_out_whole_prompt_groups(toy):
    target, prompts, data = toy
    cfg = TrainConfig(seed=0, holdout=0.25, **TOY)
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    tr, val = validation_split(data, cfg, groups)
    assert len(val) == 2 and len(tr) == 6
    assert not {groups[i] for i in val.tolist()} & {groups[i] for i in tr.tolist()}
    # the same groups for every seed (runs that continue one another use other seeds)
    held = {groups[i] for i in val.tolist()}
    many = [f"g{i // 3}" for i in range(len(data.end))]
    for seed in (1, 5):
        other = TrainConfig(seed=seed, holdout=0.25, **TOY)
        assert {groups[i] for i in validation_split(data, other, groups)[1].tolist()} == held
        assert ({many[i] for i in validation_split(data, other, many)[1].tolist()}
                == {many[i] for i in validation_split(data, cfg, many)[1].tolist()})
    # near-duplicate prompts (one question, other openers and closers) share a group
    pairs = [(c, t) for c, t in build_prompts(1, 300, limit_files=5) if c == "chat"]
    cores = {prompt_group(c, t) for c, t in pairs}
    assert 1 < len(cores) < len(pairs)
    assert prompt_group("chat", "Hi! Why do we yawn? Thanks!") == \
        prompt_group("chat", "Why do we yawn? Explain it simply.")


def test_init_from_target_copies_the_chosen_layers():
    """--init-from-target: every drafter layer starts as the chosen target layer (each weight
    equal), fc selects the deepest context layer, and the init is recorded in the stats."""
    target = Transformer.random(PRESETS["tiny-qwen3"], seed=4, std=0.2)
    n = target.cfg.num_layers
    for layers in (None, (n - 1, 0)):
        net = random_net(target, num_target_layers=2).init_from_target(target, layers)
        chosen = layers or (n - 2, n - 1)
        for mine, i in zip(net.layers, chosen):
            theirs = target.model.layers[i].state_dict()
            for name, p in mine.state_dict().items():
                assert torch.equal(p, theirs[name]), (i, name)
        hidden = [torch.randn(1, 5, target.cfg.hidden_size) for _ in net.cfg.target_layers]
        deepest = net.cfg.target_layers.index(max(net.cfg.target_layers))
        assert torch.allclose(net.fc(torch.cat(hidden, -1)), hidden[deepest])
    fresh = random_net(target)
    assert not torch.equal(fresh.layers[0].mlp.up_proj.weight,
                           target.model.layers[n - 2].mlp.up_proj.weight)
    with pytest.raises(BlockDrafterError, match="init from target"):
        random_net(target).init_from_target(target, (0, n))
    assert init_layers("last", 30, 3) == (27, 28, 29) and init_layers("3,9", 30, 2) == (3, 9)
    with pytest.raises(ValueError, match="init-from-target"):
        init_layers("27,28", 30, 3)


def test_training_from_target_init_records_it(toy):
    target, prompts, data = toy
    cfg = TrainConfig(seed=0, steps=4, val_every=0, init_from_target="last", **TOY)
    net, stats, losses = train(target, prompts, cfg, progress=lambda m: None, data=data)
    last = target.cfg.num_layers - 1
    assert stats["init"].startswith(f"target layers [{last}]")
    moved = net.layers[0].mlp.up_proj.weight - target.model.layers[last].mlp.up_proj.weight
    assert 0 < moved.abs().max() < 0.05  # trained a little from the target's weights


def test_merge_data_keeps_every_row(toy):
    """Two answer sets of different prompt widths and answer lengths merge into one padded
    Data whose rows hold the same tokens between their padding and their end."""
    target, prompts, data = toy
    other = generate_data(target, [p[:3] for p in prompts[:3]], 12, 8, set(),
                          progress=lambda m: None)
    both = merge_data(data, other)
    assert both.prompt_cols == max(data.prompt_cols, other.prompt_cols)
    for src, rows in ((data, range(len(data.end))), (other, range(len(other.end)))):
        off = 0 if src is data else len(data.end)
        for i in rows:
            got = both.tokens[off + i, int(both.pad[off + i]):int(both.end[off + i])]
            assert torch.equal(got, src.tokens[i, int(src.pad[i]):int(src.end[i])])
            assert int(both.end[off + i]) - both.prompt_cols == int(src.end[i]) - src.prompt_cols


def test_math_prompts_group_by_template():
    a, b = (_math_more(random.Random(s), 8) for s in (1, 2))
    assert a != b and prompt_group("math", a) == prompt_group("math", b)
    assert prompt_group("math", a) != prompt_group("math", _math_more(random.Random(1), 9))


@pytest.mark.slow
def test_the_wide_corpus_holds_five_times_the_shipped_drafters_prompts():
    """Issue 24's data: at least 5x the shipped drafter's 53k rows. The wide corpus gives
    265,000 or more distinct prompts from one seed, none of them a dev prompt, each
    template source at its share (summarisation and instruction run out of sources; stage 2
    adds summaries of the target's own prose); the base corpus runs out far below."""
    from training.prompts import W

    dev = dev_prompts()
    wide = build_prompts(0, 300_000, exclude=dev, corpus="wide")
    texts = [t for _, t in wide]
    assert len(texts) >= 265_000 and len(set(texts)) == len(texts)
    assert not dev.intersection(texts)
    counts = {c: sum(1 for k, _ in wide if k == c) for c in W.wide_mix}
    for c in ("code", "math", "chat", "long-form", "stdlib"):
        assert abs(counts[c] - 300_000 * W.wide_mix[c] / sum(W.wide_mix.values())) <= 1, counts
    base = build_prompts(0, 300_000, exclude=dev, mix={"code": 1.0})
    assert len(base) < 20_000 < counts["code"]   # the base code templates run out


def test_the_wide_corpus_is_deterministic_and_shares_no_opening_with_the_sealed_templates():
    """The wide corpus is fixed by its seed and differs from the base one (whose seed-0
    corpus stays pinned: test_training_layout.py); the held-out check draws the sealed
    generator's templates with a public seed (bench/drafter_tau.py), which training must
    not have seen: no wide prompt opens with the same six words as any of 500 such draws."""
    from specpilot.requests.sealed import generate_sealed

    a = build_prompts(3, 3000, limit_files=30, corpus="wide")
    assert a == build_prompts(3, 3000, limit_files=30, corpus="wide")
    assert a != build_prompts(3, 3000, limit_files=30)
    with pytest.raises(ValueError, match="unknown corpus"):
        build_prompts(3, 10, corpus="huge")

    def opening(text):
        return " ".join(text.split()[:6])

    held = {opening(r.prompt) for r in generate_sealed(20261204, 500)}   # drafter_tau's seed
    assert len(held) > 50
    assert not held.intersection(opening(t) for _, t in
                                 build_prompts(0, 30_000, limit_files=60, corpus="wide"))


def test_an_unknown_corpus_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--out", "/tmp/x", "--seed", "0", "--toy", "--corpus", "huge"])
    assert exc.value.code == 2
    assert "unknown corpus 'huge'; known: base, wide" in capsys.readouterr().err


def test_a_mix_of_categories_sets_the_corpus_shares_and_bad_ones_are_refused_in_one_line(
        tmp_path, capsys):
    """--mix: the prompt categories' shares instead of the corpus's own (issue 24: the dev
    requests are a fifth chat, the wide corpus's own mix 8 %), recorded with the run's
    configuration; a typo is a one-line usage error before any model loads."""
    mix = parse_mix("chat=3, long-form=1")
    assert mix == {"chat": 3.0, "long-form": 1.0} and parse_mix("") is None
    got = Counter(c for c, _ in build_prompts(0, 400, mix=mix, corpus="wide"))
    assert got == {"chat": 300, "long-form": 100}
    for bad, said in (("chats=1", "categories: code"), ("chat", "category=share"),
                      ("chat=0", "not a positive number"), ("chat=x", "not a positive")):
        with pytest.raises(ValueError, match=said):
            parse_mix(bad)
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "run"), "--seed", "0", "--toy", "--mix", "chats=1"])
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and said.endswith(
        "--mix: 'chats=1' is not category=share; categories: " + ", ".join(MIX)), said
    assert not (tmp_path / "run").exists()   # refused before anything ran


def test_a_source_short_of_its_share_is_reported():
    """A mix can ask a source for more distinct prompts than its templates hold (session
    30's run asked summarisation for 17 % and got about 8 %: the reference passages ran
    out): `asked` gives each source's ask and yield, `shortfalls` one line a short one."""
    asked: dict = {}
    got = Counter(c for c, _ in build_prompts(0, 20000, mix={"summarisation": 1, "chat": 1},
                                              corpus="wide", asked=asked))
    assert asked["chat"] == (10000, 10000) and got["chat"] == 10000
    want, made = asked["summarisation"]
    assert want == 10000 and made == got["summarisation"] and made < 9500
    lines = shortfalls(asked)
    assert len(lines) == 1 and lines[0].startswith(f"summarisation: {made:,} prompts of the "
                                                   "10,000 its share asks for"), lines
    assert shortfalls({"chat": (100, 96)}) == [] and len(shortfalls({"chat": (100, 94)})) == 1
