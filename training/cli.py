"""Train the block drafter by self-distillation from the target.

    python -m training.block --out stock/drafters/weights/embedded --seed 0 --device cuda
    python -m training.block --out /tmp/toy --seed 0 --toy      # CPU, seconds
    # answers in shards (one GPU each), then one training run on all of them:
    python -m training.block --seed 0 --device cuda --prompt-shard 0/2 --data-out /tmp/data0.pt
    python -m training.block --seed 0 --device cuda --prompt-shard 1/2 --data-out /tmp/data1.pt
    python -m training.block --out /tmp/block --seed 0 --device cuda \
        --data-in /tmp/data0.pt,/tmp/data1.pt --features live --init-from-weights DIR

1. Prompts: `training.prompts.build_prompts(seed, n)` (templates, project instructions, stdlib
   docstrings and functions; never the sealed set, never the dev prompts), chat-formatted;
   --corpus wide adds combinatorial templates and stdlib methods (269,984 distinct prompts
   for 300,000 asked from seed 0 on Python 3.11, against the base corpus's 101,010: issue
   24's 5x data; summarisation grows further through --summaries); --mix chat=0.3,... sets
   the categories' shares instead of the corpus's own (asked for 60,000 chat prompts from
   seed 0, the wide corpus gives 29,210 distinct ones; the shipped drafter's data held 7,682).
   --self-prompts N adds N requests the target writes itself (sampled from its chat
   template's user turn, training/self_prompts.py), spread evenly through the others.
2. Data: the target answers them greedily, many prompts at once (left-padded batches with
   per-sequence positions and masks, of prompts of similar length: sorted by length within
   groups of training.data.SORT_GROUP batches, each batch padded to its own longest; the
   rows stay in the prompts' order, and --gen-seconds keeps whole groups, a prefix of the
   prompts); each answer ends at its first stop token. With
   --summaries N, N of its long-form/chat answers become passages of summarisation prompts
   that the target answers too (stage 2).
3. Features: one target forward over prompt + answer returns the hidden states of the chosen
   layers at every position (what the engine's prefill and verify forwards pass at run time).
4. Training: each step samples sequences and `anchors` positions inside their answers; a block
   at anchor p sees the target context before p, the token at p and block_size - 1 masks, and
   is trained with cross-entropy against the target's greedy tokens p+1 .. p+block_size,
   weighted exp(-j / decay) by block position j (earlier positions gate acceptance). The
   target's embedding and head are frozen; AdamW, warm-up then cosine decay (on the clock
   when --total-seconds is set). --init-from-target starts the drafter's layers as copies of
   target layers (BlockNet.init_from_target) instead of random weights; --init-from-weights
   DIR continues from a trained drafter (its config must match, but a larger --num-layers
   grows it: its layers first, new layers appended with their output projections zero, so
   the grown drafter drafts the same at the start); --resume DIR continues its
   training: its last step's fp32 weights and AdamW moments (the training state every run
   saves outside the repository, --optimizer-state FILE; a fresh optimizer when it grows),
   and the new manifest's history lists the runs before (training/resume.py).
   --time-steps N times the phases of N steps (features, drafter forward, head + loss,
   backward, optimizer), synchronised, after 5 warm ones: a progress line and the
   manifest's `step_time` (training/steptime.py).

Several GPUs of one host train one drafter under `python -m torch.distributed.run
--standalone --nproc_per_node N -m training.block ...` (training/dist.py: each rank
answers and caches its own shard, gradients are averaged every step, rank 0 validates and
saves; bench/gpu_train_ddp.sh). On CUDA the head and loss run compiled (training/loss.py). The
training loop is training/loop.py; the flags, set-ups and saving are this module's.

Scale-out (bench/archive/NOTES-2026.md "Block drafter"): --prompt-shard I/N answers only prompts
i % N == I of the corpus; --data-out FILE saves the answers (stages 1 and 2) and exits;
--data-in FILE[,FILE...] trains on merged saved answers instead of answering (the
training.data module); --features live computes the target's hidden states per
training step for that step's rows only (default cached: for every row once, before training).
Deterministic for a seed on CPU (the toy test checks bit equality); on CUDA the data and the
sampling are fixed by the seed, kernels may differ in the last bits. --toy trains on the
tiny-qwen3 preset with random weights and random prompts: a test of the machinery, not a drafter.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from stock.config import PRESETS
from stock.drafters.block_weights import save_block, target_fingerprint, write_manifest
from stock.model import Transformer
from stock.system import load_system
from training.data import (Data, DataHeader, generate_data, load_merged, log, merge_data,
                           prose_rows, save_data, shard, summary_prompts)
from training.dist import Dist
from training.loop import TrainConfig, train
from training.prompts import build_prompts, dev_prompts, parse_mix, prompt_group, shortfalls
from training.resume import default_state_path, history, save_state, stamp, weights_key
from training.self_prompts import interleave, sample_requests

_DESCRIPTION = __doc__.split("\n\n")[0]


def toy_setup(seed: int, n_prompts: int = 24):
    """tiny-qwen3 with random weights and random prompts (CPU tests, --toy)."""
    target = Transformer.random(PRESETS["tiny-qwen3"], seed=seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 512, (int(torch.randint(4, 12, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(n_prompts)]
    return target, prompts


def embedded_setup(cfg: TrainConfig, device: str | None, log_files: int | None = None,
                   with_prompts: bool = True):
    """(target, prompts, stop ids, category counts, groups, tokenizer, sources) of the
    embedded model and the whole corpus; without prompts (--data-in) the four corpus items
    are empty."""
    system = load_system("embedded", device=device, max_context=4096)
    if not with_prompts:
        return (system.engine.model, [], set(system.engine.stop_ids), {}, [], system.tokenizer,
                [])
    dev_texts = dev_prompts()
    asked: dict[str, tuple[int, int]] = {}
    pairs = build_prompts(cfg.seed, cfg.prompts, exclude=dev_texts, limit_files=log_files,
                          corpus=cfg.corpus, mix=parse_mix(cfg.mix), asked=asked)
    for line in shortfalls(asked):
        log(f"prompts short: {line}")
    tok = system.tokenizer
    prompts = [tok.chat(text)[-cfg.max_prompt:] for _, text in pairs]
    cats: dict[str, int] = {}
    for c, _ in pairs:
        cats[c] = cats.get(c, 0) + 1
    stops = set(system.engine.stop_ids)
    groups = [prompt_group(c, text) for c, text in pairs]
    return system.engine.model, prompts, stops, cats, groups, tok, [c for c, _ in pairs]


def add_self_prompts(target, tok, cfg: TrainConfig, prompts: list[list[int]],
                     sources: list[str], groups: list | None, stops):
    """--self-prompts N: N requests the target writes itself, chat-wrapped like the rest and
    spread evenly through the corpus's prompts (source "self"). Returns (prompts, sources,
    groups, stats)."""
    room = cfg.max_prompt - len(tok.chat("")) - 2
    texts, stats = sample_requests(target, tok, cfg.self_prompts, cfg.seed, cfg.gen_batch,
                                   max(16, room), stops, cfg.self_temperature,
                                   exclude=dev_prompts(), progress=log,
                                   max_seconds=cfg.gen_seconds)
    log(f"self-written requests: {stats['kept']} kept of {stats['sampled']} sampled "
        f"({stats['unfinished']} unfinished or too short, {stats['duplicates']} repeats; "
        f"{stats['seconds']}s)")
    mine = [tok.chat(t)[-cfg.max_prompt:] for t in texts]
    prompts = interleave(prompts, mine)
    sources = interleave(sources, ["self"] * len(mine))
    if groups is not None:
        groups = interleave(groups, [prompt_group("self", t) for t in texts])
    return prompts, sources, groups, {f"self_{k}": v for k, v in stats.items()}


def answer_corpus(target, prompts: list[list[int]], sources: list[str], groups: list | None,
                  cfg: TrainConfig, stops, tok=None):
    """Stage 1: the target's answers to `prompts`; stage 2 (--summaries, with a tokenizer):
    prompts summarising some of its own prose answers, answered too. Returns (data, groups
    of its rows, category counts, stats)."""
    cats: dict[str, int] = {}
    t1 = time.perf_counter()
    data = generate_data(target, prompts, cfg.max_new, cfg.gen_batch, stops, log,
                         cfg.gen_seconds)
    for c in sources[:len(data.end)]:
        cats[c] = cats.get(c, 0) + 1
    groups = groups[:len(data.end)] if groups else None
    stats: dict = {}
    if cfg.summaries and tok is not None:
        late = cfg.gen_seconds and time.perf_counter() - t1 > 1.25 * cfg.gen_seconds
        rows = [] if late else prose_rows(data, sources, cfg.summaries, cfg.seed,
                                          min_tokens=min(96, cfg.max_new // 2))
        more = summary_prompts(tok, data, rows, stops, cfg.seed, cfg.max_prompt)
        log(f"stage 2: {len(more)} prompts summarising the target's own prose answers"
            + (" (skipped: stage 1 ran past 1.25 x --gen-seconds)" if late else ""))
        t2 = time.perf_counter()
        if more:
            data2 = generate_data(target, more, cfg.max_new, cfg.gen_batch, stops, log)
            if groups is not None:
                groups += [groups[i] for i in rows[:len(data2.end)]]
            data = merge_data(data, data2)
            cats["own-prose summaries"] = len(data2.end)
        stats = {"gen_stage2_s": round(time.perf_counter() - t2, 1),
                 "stage2_summaries": len(more)}
    stats = {"gen_s": round(time.perf_counter() - t1, 1), **stats}
    return data, groups, cats, stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m training.block",
                                 description=_DESCRIPTION)
    ap.add_argument("--out", default=None, help="folder for manifest.json and the shards")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--toy", action="store_true", help="tiny random target (CPU machinery test)")
    ap.add_argument("--data-out", default=None, metavar="FILE",
                    help="save the answers (stages 1 and 2) to FILE and exit without training")
    ap.add_argument("--data-in", default=None, metavar="FILE[,FILE...]",
                    help="train on answers saved by --data-out (merged) instead of answering")
    defaults = TrainConfig()
    for name, val in asdict(defaults).items():
        if name != "seed":
            ap.add_argument("--" + name.replace("_", "-"), type=type(val), default=None)
    args = ap.parse_args(argv)
    dist = Dist.from_env()
    if dist.on and (args.data_out or args.prompt_shard):
        ap.error("--data-out and --prompt-shard are for one process; under "
                 "torch.distributed.run each rank answers its own shard (training/dist.py)")
    args.device = dist.start(args.device)
    if args.data_in and args.data_out:
        ap.error("--data-in and --data-out: give one")
    if not args.data_out and not args.out:
        ap.error("--out is required (unless --data-out)")
    over = {k: getattr(args, k) for k in asdict(defaults) if k != "seed"
            and getattr(args, k) is not None}
    if args.data_in and over.get("prompt_shard"):
        ap.error("--prompt-shard applies to answering, not to --data-in")
    if over.get("corpus", "base") not in ("base", "wide"):
        ap.error(f"--corpus: unknown corpus {over['corpus']!r}; known: base, wide")
    try:
        parse_mix(over.get("mix", ""))
    except ValueError as e:
        ap.error(f"--mix: {e}")
    if args.toy:
        toy = dict(prompts=24, max_new=24, gen_batch=8, num_layers=1, num_target_layers=2,
                   block_size=4, steps=30, batch=8, anchors=4, warmup=5, lr=3e-3)
        over = {**toy, **over}
    if dist.on and not args.data_in:
        over["prompt_shard"] = dist.shard()
    cfg = TrainConfig(seed=args.seed, **over)
    launcher = (f"python -m torch.distributed.run --standalone --nproc_per_node {dist.world} "
                if dist.on else "python ")
    command = launcher + "-m training.block " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    tok = None
    if args.toy:
        target, prompts = toy_setup(cfg.seed, cfg.prompts)
        target = target.to(args.device or "cpu")
        stops, name, groups = set(), "tiny-qwen3 (random weights)", None
        sources = ["random"] * len(prompts)
    else:
        target, prompts, stops, _, groups, tok, sources = embedded_setup(
            cfg, args.device, with_prompts=not args.data_in)
        name = "embedded (SmolLM2-135M-Instruct)"
    self_stats: dict = {}
    if cfg.self_prompts and tok is not None and not args.data_in:
        prompts, sources, groups, self_stats = add_self_prompts(target, tok, cfg, prompts,
                                                                sources, groups, stops)
    corpus = len(prompts)
    prompts, sources = shard(prompts, cfg.prompt_shard), shard(sources, cfg.prompt_shard)
    groups = shard(groups, cfg.prompt_shard) if groups else None
    fingerprint = target_fingerprint(target)
    if args.data_in:
        data, groups, cats, files, headers = load_merged(args.data_in.split(","), fingerprint)
        if dist.on:  # this rank's rows of the merged files
            r, w = dist.rank, dist.world
            data = Data(data.tokens[r::w], data.pad[r::w], data.end[r::w], data.prompt_cols)
            groups = groups[r::w] if groups else groups
        n_prompts = sum(h.prompts for h in headers)
        data_stats = {"gen_s": max(h.gen_s for h in headers), "data_files": files}
        log(f"target {name} on {target.device} {target.dtype}; data from {len(files)} "
            f"file(s): " + ", ".join(f"{f['file']} ({f['rows']} rows)" for f in files)
            + f"; setup {time.perf_counter() - t0:.1f}s")
    else:
        log(f"target {name} on {target.device} {target.dtype}; {len(prompts)} prompts"
            + (f" (shard {cfg.prompt_shard} of {corpus})" if cfg.prompt_shard else "")
            + f"; setup {time.perf_counter() - t0:.1f}s")
        data, groups, cats, data_stats = answer_corpus(target, prompts, sources, groups, cfg,
                                                       stops, tok)
        data_stats.update(self_stats)
        n_prompts = len(prompts)
        if args.data_out:
            answer_tokens = int((data.end - data.prompt_cols).clamp(min=0).sum())
            header = DataHeader(
                target_fingerprint=fingerprint, target_name=name,
                vocab_size=target.cfg.vocab_size, seed=cfg.seed, prompt_shard=cfg.prompt_shard,
                corpus_prompts=corpus, prompts=n_prompts, rows=len(data.end),
                answer_tokens=answer_tokens, prompt_cols=data.prompt_cols, max_new=cfg.max_new,
                max_prompt=cfg.max_prompt, categories=cats, gen_s=data_stats["gen_s"],
                stats=data_stats, command=command)
            save_data(args.data_out, data, header, groups)
            log(f"saved {len(data.end)} rows ({answer_tokens} answer tokens, {cats}) to "
                f"{args.data_out}; total {time.perf_counter() - t0:.1f}s")
            return
    state: dict = {}
    net, stats, _ = train(target, prompts, cfg, stops, started=t0, groups=groups, data=data,
                          data_stats=data_stats, dist=dist, state_out=state)
    if dist.on:  # the data of every rank, in the manifest of rank 0
        mine = {"rank": dist.rank, "prompts": n_prompts, "answers": stats["answers"],
                "answer_tokens": stats["answer_tokens"], "gen_s": stats.get("gen_s"),
                "categories": cats, "steps": stats["steps"]}
        ranks = dist.gather(mine)
        if not dist.main:
            # wait for rank 0's save, then close together: a rank that tears the process
            # group down while the other still uses it aborts under gloo (SIGABRT, seen in
            # tests/test_training_dist.py on the 2-core CPU)
            dist.barrier()
            dist.close()
            return
        stats["rank_data"] = ranks
        stats["answers"] = sum(r["answers"] for r in ranks)
        stats["answer_tokens"] = sum(r["answer_tokens"] for r in ranks)
        if not args.data_in:
            n_prompts = sum(r["prompts"] for r in ranks)
            cats = {}
            for r in ranks:
                for k, v in r["categories"].items():
                    cats[k] = cats.get(k, 0) + v
    data_desc = {"prompts": n_prompts, "categories": cats,
                 "sources": "training/prompts.py templates (word lists: "
                            "training/words/prompts.json) + instructions + stdlib "
                            "docstrings/functions (dev prompts excluded, sealed set not used)"
                            + (f"; stage 2: {cats['own-prose summaries']} prompts summarising "
                               "the target's own long-form/chat answers"
                               if cats.get("own-prose summaries") else "")
                            + (f"; {cats['self']} requests written by the target itself "
                               "(training/self_prompts.py)" if cats.get("self") else ""),
                 "init": stats.get("init", ""),
                 "python": platform.python_version(), "max_prompt": cfg.max_prompt,
                 "max_new": cfg.max_new, "labels": "target greedy tokens"}
    if cfg.prompt_shard and not dist.on:
        data_desc["prompt_shard"] = f"{cfg.prompt_shard} of {corpus} prompts"
    if dist.on:
        data_desc["ranks"] = (
            f"{dist.world} processes, rank r on "
            + (f"the merged rows i % {dist.world} == r" if args.data_in else
               f"prompts i % {dist.world} == r of the {corpus}-prompt corpus")
            + "; gradients averaged over the ranks every step")
    if args.data_in:
        data_desc["files"] = data_stats.pop("data_files")
    man = save_block(net, Path(args.out), target=target, seed=cfg.seed, command=command,
                     data=data_desc, training={**asdict(cfg), **stats,
                                               "torch": torch.__version__,
                                               "device": str(target.device),
                                               "saved": stamp()},
                     target_name=name,
                     history=history(Path(cfg.resume)) if cfg.resume else [])
    total = sum(s.bytes for s in man.shards)
    where = (Path(cfg.optimizer_state) if cfg.optimizer_state
             else default_state_path(weights_key(man)))
    man.training["optimizer_state"] = save_state(where, man, state["weights"],
                                                 state["optimizer"], state["steps"])
    write_manifest(Path(args.out), man)
    log(f"saved {len(man.shards)} shard(s), {total} bytes, to {args.out}; its training state "
        f"({man.training['optimizer_state']['bytes']} bytes, for --resume) to {where}; "
        f"total {time.perf_counter() - t0:.1f}s")
    dist.barrier()   # the other ranks wait here for the save (above)
    dist.close()
