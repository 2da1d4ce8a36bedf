"""The block drafter's training loop (step 4 of the pipeline in training/cli.py).

`train` samples sequences and anchors inside their answers; a block at anchor p sees the
target context before p (the target's hidden states of the chosen layers: cached for every
row, or computed per step with --features live), the token at p and block_size - 1 masks,
and is trained against the target's greedy tokens (training/loss.py). Validation holds out
whole prompt groups and measures the τ the engine would get decoding those answers
(`walk_tau`); the checkpoint with the best is kept. `init_net` builds the drafter to train
(random, --init-from-target, --init-from-weights).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from stock.drafters.block import BlockConfig, BlockDrafterError, BlockNet
from stock.drafters.block_weights import load_block, read_manifest
from training.data import Data, _mask, generate_data, log
from training.dist import Dist
from training.loss import HeadLoss, head_terms, loss_terms
from training.resume import find_state, load_state
from training.steptime import StepTimer


@dataclass
class TrainConfig:
    seed: int = 0
    prompts: int = 4096
    corpus: str = "base"  # training.prompts.build_prompts: "base" or "wide" (issue 24's 5x)
    mix: str = ""  # "chat=0.3,code=0.2,...": prompt categories' shares instead of the
    # corpus's own (training.prompts.parse_mix; "" keeps it)
    max_prompt: int = 256  # prompt tokens kept (the end of longer prompts is kept)
    max_new: int = 256  # greedy answer tokens per prompt
    gen_batch: int = 256  # prompts answered at once (greedy decoding is launch-bound: larger
    # batches give more answers per second; KV for 2048 x 448 tokens of the embedded model
    # is ~21 GB in bf16)
    feat_batch: int = 512  # sequences per feature-extraction forward (full attention)
    summaries: int = 0  # second-stage prompts: summarise/explain the target's own prose answers
    self_prompts: int = 0  # requests the target writes itself (training/self_prompts.py),
    # sampled before answering (within --gen-seconds, if set) and spread through the
    # corpus's prompts
    self_temperature: float = 1.0  # their sampling temperature (top-p 0.95)
    init_from_target: str = ""  # "" random init; "last": the target's last num_layers layers;
    # or comma-separated target layer indices (see BlockNet.init_from_target)
    num_layers: int = 3
    num_target_layers: int = 4
    block_size: int = 16
    steps: int = 3000
    batch: int = 32  # sequences per step
    anchors: int = 16  # blocks per sequence per step
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.1
    decay: float = 7.0  # loss weight exp(-j/decay) at block position j
    holdout: float = 0.05  # fraction of sequences kept for validation
    val_every: int = 250  # validate every this many steps; the best checkpoint is kept (0: off)
    val_seqs: int = 128  # validation sequences per periodic check (fixed anchors)
    patience: int = 0  # stop after this many checks without a better validation τ (0: never)
    max_seconds: float = 0.0  # stop the training loop after this long (0: never)
    total_seconds: float = 0.0  # stop it so that the whole run ends within this (0: never)
    gen_seconds: float = 0.0  # answer no more prompt batches after this long (0: all)
    # with total_seconds, the learning-rate schedule runs on whichever is further along, the
    # step count or the clock, so the cosine decay ends when the time is up
    prompt_shard: str = ""  # "I/N": answer only prompts i with i % N == I ("" all)
    features: str = "cached"  # cached: target hidden states of every row, computed once;
    # live: computed per step for that step's rows only (memory then holds tokens only)
    init_from_weights: str = ""  # a block-weights folder to start from (config must match)
    resume: str = ""  # a block-weights folder to continue: its weights, training state and
    # history (training/resume.py)
    optimizer_state: str = ""  # where the training state is saved (and read by --resume);
    # default: the user cache, keyed by the weights
    compile_loss: bool = True  # head + loss through torch.compile on CUDA (training/loss.py)
    time_steps: int = 0  # time this many steps' phases, synchronised (training/steptime.py)


def extract_features(target, data: Data, layers: tuple[int, ...], batch: int) -> torch.Tensor:
    """[N, S, len(layers) * H] target hidden states (target dtype, target device). A normal
    tensor (allocated outside inference mode, filled inside it): usable by autograd without
    a copy, so the largest buffer of a run exists once."""
    dev = target.device
    n, s = data.tokens.shape
    out = torch.empty(n, s, len(layers) * target.cfg.hidden_size, dtype=target.dtype, device=dev)
    with torch.inference_mode():
        _fill_features(target, data, layers, batch, out)
    return out


def _fill_features(target, data: Data, layers: tuple[int, ...], batch: int,
                   out: torch.Tensor) -> None:
    n = data.tokens.shape[0]
    for b0 in range(0, n, batch):
        ids = data.tokens[b0:b0 + batch]
        out[b0:b0 + ids.shape[0]] = _hidden(target, ids, data.pad[b0:b0 + batch], layers)


def _hidden(target, tokens: torch.Tensor, pad: torch.Tensor, layers: tuple[int, ...]
            ) -> torch.Tensor:
    """[B, S, len(layers) * H]: one target forward over rows `tokens` [B, S] (first real
    column `pad`), positions counted from it, causal mask over real keys."""
    dev = target.device
    ids = tokens.to(dev)
    b, s = ids.shape
    vfrom = pad.to(dev)
    cols = torch.arange(s, device=dev).expand(b, s)
    cache = target.new_cache(s, b)
    res = target(ids, cache, 0, positions=(cols - vfrom[:, None]).clamp(min=0),
                 mask=_mask(vfrom, cols, s), logits="none", hidden_layers=layers)
    return torch.cat([res.hidden[i] for i in layers], dim=-1)


class LiveFeatures:
    """--features live: the target hidden states of a step's rows, computed when the step
    asks (one forward over them, truncated to the step's longest answer; the mask is causal,
    so the columns kept see what they see in the full-width forward of `extract_features`).
    Memory then holds the tokens of every row and the features of one batch."""

    def __init__(self, target, data: Data, layers: tuple[int, ...]):
        self.target, self.data, self.layers = target, data, layers
        self.device, self.dtype = target.device, target.dtype

    def rows(self, idx: torch.Tensor, s: int) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(self.device.type, enabled=False):
            h = _hidden(self.target, self.data.tokens[idx, :s], self.data.pad[idx], self.layers)
        return h.clone()  # a normal tensor: autograd may save it for the backward pass


def free_bytes(device: torch.device) -> int | None:
    """Free memory on a CUDA device (None elsewhere: the CPU's cached features are not
    checked)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]


def feature_rows(feats, idx: torch.Tensor, s: int) -> torch.Tensor:
    """[B, s, F] features of rows idx from a cached tensor or a LiveFeatures."""
    if isinstance(feats, LiveFeatures):
        return feats.rows(idx, s)
    return feats[idx.to(feats.device), :s]


def block_hidden(net: BlockNet, target, data: Data, feats: torch.Tensor, idx: torch.Tensor,
                 p: torch.Tensor, mark=None):
    """Final hidden states [B, A, T, H] (before the target's head) and labels [B, A, T] (-100
    past the answer) of the blocks at anchors p [B, A] (columns of data.tokens) of sequences
    idx: the block at p holds the token at p then masks, sees the target context of columns
    [pad, p), positions counted from the sequence's first real column. The same inputs as
    `BlockDrafter` at inference (tests/test_block_drafter.py checks that both give the same
    logits). `mark(phase)`: a StepTimer's, after the features and after the forward."""
    mark = mark or (lambda phase: None)
    dev = feats.device
    t = net.cfg.block_size
    end = data.end[idx]
    s = int(end.max())
    toks = data.tokens[idx, :s]
    pad = data.pad[idx]
    # labels: the token j + 1 after the anchor, where it is still inside the answer
    tgt = p[:, :, None] + 1 + torch.arange(t)  # [B, A, T]
    labels = toks.gather(1, tgt.clamp(max=s - 1).view(len(idx), -1)).view_as(tgt)
    labels = torch.where(tgt < end[:, None, None], labels, -100)
    b, a = p.shape
    p_d, pad_d = p.to(dev), pad.to(dev)
    with torch.no_grad():
        anchor_emb = target.model.embed_tokens(toks.gather(1, p).to(dev))  # [B, A, H]
    x = net.block_inputs(anchor_emb.to(feats.dtype)).reshape(b, a * t, -1)
    cols = torch.arange(s, device=dev)
    ctx_pos = (cols[None] - pad_d[:, None]).clamp(min=0)
    q_pos = ((p_d - pad_d[:, None])[:, :, None] + torch.arange(t, device=dev)).reshape(b, a * t)
    cos, sin = target.cos, target.sin
    rows = feature_rows(feats, idx, s)   # --features live: the target's forward
    mark("features")
    feat = net.features([rows])
    ctx_kv = net.context_kv(feat, cos[ctx_pos][:, None], sin[ctx_pos][:, None])
    ctx_ok = (cols[None, None] >= pad_d[:, None, None]) & (cols[None, None] < p_d[:, :, None])
    ctx_ok = ctx_ok[:, :, None, :].expand(b, a, t, s).reshape(b, a * t, s)
    blk = torch.arange(a, device=dev).repeat_interleave(t)
    mask = torch.cat([ctx_ok, (blk[:, None] == blk[None, :]).expand(b, -1, -1)], dim=-1)
    h = net(x, cos[q_pos][:, None], sin[q_pos][:, None], ctx_kv, mask[:, None])
    mark("drafter forward")
    return h.view(b, a, t, -1), labels.to(dev)


def block_forward(net: BlockNet, target, data: Data, feats: torch.Tensor, idx: torch.Tensor,
                  p: torch.Tensor):
    """Logits [B, A, T, vocab] fp32 and labels of `block_hidden`'s blocks."""
    h, labels = block_hidden(net, target, data, feats, idx, p)
    return target.lm_head(h).float(), labels


def sample_anchors(data: Data, idx: torch.Tensor, anchors: int, gen: torch.Generator):
    """[B, anchors] anchor columns, uniform over each answer's [P, end - 2]."""
    span = (data.end[idx] - 1 - data.prompt_cols).clamp(min=1).float()
    u = torch.rand(len(idx), anchors, generator=gen)
    return data.prompt_cols + (u * span[:, None]).long()


def block_loss(net: BlockNet, target, data: Data, feats: torch.Tensor, idx: torch.Tensor,
               gen: torch.Generator, anchors: int, decay: float, head_loss: HeadLoss | None = None,
               mark=None):
    """Weighted CE over a batch of blocks, plus the expected accepted length of the blocks
    (training.loss.loss_terms); `head_loss`: the head and loss to use (default eager);
    `mark`: a StepTimer's (block_hidden's phases, then "head + loss")."""
    p = sample_anchors(data, idx, anchors, gen)
    h, labels = block_hidden(net, target, data, feats, idx, p, mark)
    if head_loss is None:
        loss, acc = head_terms(h, labels, target.lm_head.weight, decay)
    else:
        loss, acc = head_loss(h, labels)
    if mark is not None:
        mark("head + loss")
    return loss, float(acc)


def _loss_acc(logits: torch.Tensor, labels: torch.Tensor, decay: float):
    loss, acc_len = loss_terms(logits, labels, decay)
    return loss, float(acc_len)


def evaluate(net: BlockNet, target, data: Data, feats: torch.Tensor, idx: torch.Tensor,
             p: torch.Tensor, cfg: TrainConfig, autocast) -> tuple[float, float]:
    """(loss, block acc-len) of sequences idx at fixed anchors p, averaged over batches."""
    vl, va, n = 0.0, 0.0, 0
    with torch.no_grad(), autocast:
        for v0 in range(0, len(idx), cfg.batch):
            logits, labels = block_forward(net, target, data, feats, idx[v0:v0 + cfg.batch],
                                           p[v0:v0 + cfg.batch])
            lo, ac = _loss_acc(logits, labels, cfg.decay)
            w = len(idx[v0:v0 + cfg.batch])
            vl, va, n = vl + float(lo) * w, va + ac * w, n + w
    return vl / max(n, 1), va / max(n, 1)


def anchor_runs(net: BlockNet, target, data: Data, feats, idx: torch.Tensor, draft_len: int,
                batch: int, chunk: int, autocast) -> list[torch.Tensor]:
    """Per sequence of idx, the block at every answer column that has a label, scored by
    teacher forcing: its leading run of top-1 hits (at most draft_len; no labels past the
    answer, so a run never passes it), column P first. `batch` sequences and `chunk`
    anchors a forward."""
    pc, out = data.prompt_cols, []
    with torch.no_grad(), autocast:
        for v0 in range(0, len(idx), batch):
            sel = idx[v0:v0 + batch]
            last = data.end[sel] - 2   # the last anchor column with a label
            width = int(last.max()) - pc + 1
            lead = torch.zeros(len(sel), width, dtype=torch.long)
            for c0 in range(0, width, chunk):
                cols = pc + c0 + torch.arange(min(chunk, width - c0))
                p = torch.minimum(cols[None], last[:, None])
                logits, labels = block_forward(net, target, data, feats, sel, p)
                hit = (logits.argmax(-1) == labels) & (labels >= 0)
                run = hit[:, :, :draft_len].long().cumprod(-1).sum(-1)
                lead[:, c0:c0 + len(cols)] = run.cpu()
            out += [lead[r, :int(last[r]) - pc + 1] for r in range(len(sel))]
    return out


def walk(runs: torch.Tensor) -> list[int]:
    """Tokens gained by each verification step decoding one answer whose anchor runs are
    `runs` (anchor_runs): from the first answer token, each step gains its anchor's run + 1,
    as the engine's steps do, the last step no more than the answer has left (the engine
    counts only the tokens it keeps)."""
    i, gains = 0, []
    while i < len(runs):
        gains.append(min(int(runs[i]) + 1, len(runs) - i))
        i += gains[-1]
    return gains


def depth_rates(runs: list[torch.Tensor], depths: int = 4) -> list[float]:
    """P(draft token d right, given tokens 1..d-1 right) for d = 1..depths, over every anchor
    of `runs` (anchor_runs): where a drafter's blocks fail."""
    r = torch.cat(runs) if runs else torch.zeros(0, dtype=torch.long)
    return [float((r >= d).sum()) / max(int((r >= d - 1).sum()), 1) for d in range(1, depths + 1)]


def run_tau(runs: list[torch.Tensor]) -> float:
    """Tokens gained per step over every answer of `runs`, each walked (`walk`)."""
    gains = [g for r in runs for g in walk(r)]
    return sum(gains) / max(len(gains), 1)


def walk_tau(net: BlockNet, target, data: Data, feats, idx: torch.Tensor, draft_len: int,
             batch: int, chunk: int, autocast) -> float:
    """The τ the engine gets decoding answers idx with this drafter (tokens gained per
    verification step, bonus included; the first answer token is prefill's): `walk` over
    `anchor_runs`. Greedy answers make the walk's anchors the engine's
    (tests/test_training_block.py checks they give the engine's τ). Unlike the mean block
    acc-len over uniform anchors, hard stretches weigh as much as the steps they cost."""
    return run_tau(anchor_runs(net, target, data, feats, idx, draft_len, batch, chunk, autocast))


def group_rank(key) -> int:
    """A prompt group's place in validation's order: a fixed hash of its key, the same in
    every run and for every seed."""
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")


def validation_split(data: Data, cfg: TrainConfig, groups: list | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) sequence indices: answers of at least 2 tokens, shuffled by the
    seed, `holdout` of them (at least one) for validation. With `groups` (one key per
    sequence, e.g. `training.prompts.prompt_group`), whole groups are held out, in the order
    of `group_rank`, until the holdout is reached: no validation answer has a near-copy in
    training, and runs that continue one another (--resume) hold out the same groups (the
    first ones in that order: a run with a larger share holds out a few more), so a
    continued drafter is not validated on groups its earlier runs trained on. (The order was
    the seed's until 2026-12-06, so each continued run held out other groups than the runs
    before it, and could be validated on groups they had trained on.)"""
    keep = torch.nonzero(data.end - data.prompt_cols >= 2).flatten()
    keep = keep[torch.randperm(len(keep), generator=torch.Generator().manual_seed(cfg.seed))]
    n_val = max(1, int(len(keep) * cfg.holdout)) if len(keep) > 1 else 0
    if groups is None or n_val == 0:
        return keep[n_val:], keep[:n_val]
    members: dict = {}
    for i in keep.tolist():
        members.setdefault(groups[i], []).append(i)
    val: list[int] = []
    for key in sorted(members, key=group_rank):
        if len(val) >= n_val:
            break
        if len(val) + len(members[key]) <= 2 * n_val or not val:
            val += members[key]
    held = set(val)
    if len(held) == len(keep):  # one group only: fall back to sequences
        return keep[n_val:], keep[:n_val]
    gen = torch.Generator().manual_seed(cfg.seed + 3)
    val_t = torch.tensor(val, dtype=torch.long)
    val_t = val_t[torch.randperm(len(val_t), generator=gen)]  # any prefix is a fair sample
    return torch.tensor([i for i in keep.tolist() if i not in held], dtype=torch.long), val_t


def _lr(step: int, cfg: TrainConfig, time_frac: float = 0.0) -> float:
    """Linear warm-up, then cosine to 10% over the steps, or over the time left when
    `time_frac` (elapsed share of the training time, see TrainConfig) is further along."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = max((step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1), time_frac)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(target, prompts: list[list[int]], cfg: TrainConfig, stop_ids=(), progress=log,
          data: Data | None = None, started: float | None = None, groups: list | None = None,
          data_stats: dict | None = None, dist: Dist | None = None,
          state_out: dict | None = None):
    """Returns (net, stats, losses). `target` stays frozen; the net trains in fp32 (bf16
    autocast on CUDA). `started`: perf_counter at the start of the run (for total_seconds).
    `groups`: one key per data row; validation then holds out whole groups. `data_stats`:
    added to the stats (how a `data` passed in was made). `dist`: data-parallel ranks
    (training/dist.py; `data` is then this rank's rows, rank 0 validates and decides stops).
    `state_out`: filled with the last step's weights, the optimizer and the steps run in all
    (training/resume.py saves them)."""
    started = time.perf_counter() if started is None else started
    dist = dist or Dist()
    if not dist.main:
        progress = (lambda m, _p=progress: _p(f"[rank {dist.rank}] {m}"))
    torch.manual_seed(cfg.seed)
    for prm in target.parameters():
        prm.requires_grad_(False)
    dev = target.device
    t0 = time.perf_counter()
    if data is None:
        data = generate_data(target, prompts, cfg.max_new, cfg.gen_batch, stop_ids, progress,
                             cfg.gen_seconds)
    gen_s = time.perf_counter() - t0
    bcfg = BlockConfig.for_target(target.cfg, cfg.num_layers, cfg.block_size,
                                  num_target_layers=cfg.num_target_layers)
    if cfg.features not in ("cached", "live"):
        raise ValueError(f"--features {cfg.features!r}: cached or live")
    features = cfg.features
    if features == "cached":
        if dev.type == "cuda":  # answering's KV blocks cannot hold the one large buffer
            torch.cuda.empty_cache()
        need = (data.tokens.numel() * len(bcfg.target_layers) * target.cfg.hidden_size
                * target.dtype.itemsize)
        free = free_bytes(dev)
        if free is not None and need > 0.8 * free:
            features = "live (cached would not fit)"
            progress(f"cached features need {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free on "
                     f"{dev}: live features instead (--features live; or more GPUs, each "
                     "caching its own shard)")
    if features == "cached":
        feats = extract_features(target, data, bcfg.target_layers, cfg.feat_batch)
    else:
        feats = LiveFeatures(target, data, bcfg.target_layers)
    feat_s = time.perf_counter() - t0 - gen_s
    gen = torch.Generator().manual_seed(cfg.seed + 1000 * dist.rank)  # rank 0: as one process
    groups = groups[: len(data.end)] if groups else None
    tr, val = validation_split(data, cfg, groups)
    if dist.on:  # rank 0 validates; the other ranks leave out its held-out prompt groups
        held = dist.gather({groups[i] for i in val.tolist()} if dist.main and groups else None)[0]
        if not dist.main:
            rows = torch.cat([tr, val])
            if held:
                rows = rows[torch.tensor([groups[i] not in held for i in rows.tolist()],
                                         dtype=torch.bool)]
            tr, val = rows, val[:0]
    keep = torch.cat([tr, val])
    if len(tr) == 0:
        raise ValueError("no training sequences: every answer ended at once")
    answer_tokens = int((data.end[keep] - data.prompt_cols).sum())
    progress(f"data: {len(keep)} answers, {answer_tokens} answer tokens, gen {gen_s:.1f}s, "
             f"features {feat_s:.1f}s; train {len(tr)}, validation {len(val)}")

    net, init = init_net(target, bcfg, cfg)
    progress(f"drafter init: {init}")
    decay, no_decay = [], []
    for name, prm in net.named_parameters():
        (no_decay if prm.ndim < 2 else decay).append(prm)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                            betas=(0.9, 0.95))
    before, resumed = 0, ""
    if cfg.resume:
        path, why = find_state(Path(cfg.resume), cfg.optimizer_state)
        have = read_manifest(Path(cfg.resume)).config
        if grows(have, bcfg):   # the saved moments are of the smaller drafter's tensors
            path, why = None, f"grown from {have.num_layers} to {bcfg.num_layers} layers"
        if path is None:
            progress(f"resume: {why}: a fresh optimizer from its weights (warm-up kept)")
        else:
            before, resumed = load_state(path, Path(cfg.resume), net, opt, dev), str(path)
            cfg = dataclasses.replace(cfg, warmup=0)   # the moments are warm already
            progress(f"resume: the last step's fp32 weights and AdamW moments from {path} "
                     f"({before} steps before this run; no warm-up)")
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16,
                              enabled=dev.type == "cuda" or target.dtype == torch.bfloat16)
    losses, t1, steps_done = [], time.perf_counter(), 0
    # periodic validation on fixed sequences and anchors; the best state (by the engine's τ
    # on those answers, walk_tau, then loss) is what is returned: later steps that only
    # memorise the training answers (train acc-len up, validation down) are dropped
    vsel = val[: cfg.val_seqs]
    vp = (sample_anchors(data, vsel, cfg.anchors, torch.Generator().manual_seed(cfg.seed + 2))
          if len(vsel) else None)
    history: list[dict] = []
    best: dict | None = None
    since_best = 0

    def check(step: int) -> None:
        nonlocal best, since_best
        net.eval()
        vl, va = evaluate(net, target, data, feats, vsel, vp, cfg, autocast)
        runs = anchor_runs(net, target, data, feats, vsel, net.cfg.block_size - 1, cfg.batch,
                           cfg.anchors, autocast)
        vt, d1 = run_tau(runs), depth_rates(runs, 1)[0]
        net.train()
        history.append({"step": step, "val_loss": round(vl, 4), "val_acc_len": round(va, 3),
                        "val_tau": round(vt, 3), "val_depth1": round(d1, 3)})
        if best is None or (vt, -vl) > (best["val_tau"], -best["val_loss"]):
            best = {"step": step, "val_loss": vl, "val_acc_len": va, "val_tau": vt,
                    "state": {k: v.detach().clone() for k, v in net.state_dict().items()}}
            since_best = 0
        else:
            since_best += 1
        progress(f"  validate at step {step}: loss {vl:.4f}  block acc-len {va:.3f}  "
                 f"τ {vt:.3f}  first draft token right {d1:.3f}"
                 f"{'  (best)' if best['step'] == step else ''}")

    deadline = started + cfg.total_seconds - 30 if cfg.total_seconds else 0.0

    def time_frac() -> float:
        if not deadline:
            return 0.0
        return min(1.0, (time.perf_counter() - t1) / max(deadline - t1, 1e-9))

    head_loss = HeadLoss(target.lm_head.weight, cfg.decay,
                         compiled=cfg.compile_loss and dev.type == "cuda", log=progress)
    params = [prm for prm in net.parameters() if prm.requires_grad]
    dist.broadcast_params(net)
    lr, frac = cfg.lr, 0.0
    if vp is not None and cfg.val_every and (cfg.resume or cfg.init_from_weights):
        # the weights it starts from, on this run's validation: the run's gain is read off
        # its own log, and a run that only makes them worse keeps them (step 0)
        check(0)
    timer = StepTimer(dev, cfg.time_steps)
    for step in range(cfg.steps):
        lr = _lr(step, cfg, frac)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = tr[torch.randint(len(tr), (min(cfg.batch, len(tr)),), generator=gen)]
        timer.start(step)
        with autocast:
            loss, acc = block_loss(net, target, data, feats, idx, gen, cfg.anchors, cfg.decay,
                                   head_loss, timer.mark)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        timer.mark("backward")
        dist.mean_grads(params)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        timer.mark("optimizer")
        losses.append(float(loss.detach()))
        timer.end()
        if cfg.time_steps and len(timer.walls) == timer.skip + cfg.time_steps + 20:
            progress("  " + timer.line())
        steps_done = step + 1
        if dist.main and (step % max(cfg.steps // 20, 1) == 0 or step == cfg.steps - 1):
            progress(f"  step {step:5d}  loss {losses[-1]:.4f}  block acc-len {acc:.2f}  "
                     f"lr {lr:.2e}  {time.perf_counter() - t1:.1f}s")
        why = ""
        if vp is not None and cfg.val_every and steps_done % cfg.val_every == 0:
            check(steps_done)
            if cfg.patience and since_best >= cfg.patience:
                why = (f"  stopped at step {steps_done}: no better validation in "
                       f"{cfg.patience} checks (--patience)")
        if not why and cfg.max_seconds and time.perf_counter() - t1 > cfg.max_seconds:
            why = f"  stopped at step {step + 1}: --max-seconds {cfg.max_seconds}"
        if (not why and cfg.total_seconds
                and time.perf_counter() - started > cfg.total_seconds - 30):
            why = (f"  stopped at step {step + 1}: --total-seconds {cfg.total_seconds} "
                   "(30 s kept for validation and saving)")
        stop, frac = dist.agree(bool(why), time_frac(), dev)
        if stop:
            progress(why or f"  stopped at step {step + 1}: rank 0 stopped")
            break
    if vp is not None and cfg.val_every and (not history or history[-1]["step"] != steps_done):
        check(steps_done)
    ranks_agree = dist.same_weights(net)  # before rank 0 loads its kept checkpoint
    if not ranks_agree:
        progress("warning: the ranks' drafter weights differ after training")
    kept = steps_done
    if state_out is not None:   # what the next run resumes from: this last step, not the kept
        state_out.update(weights={k: v.detach().clone() for k, v in net.state_dict().items()},
                         optimizer=opt, steps=before + steps_done)
    if best is not None:
        net.load_state_dict(best["state"])
        kept = best["step"]
        progress(f"kept the checkpoint of step {kept} (validation τ {best['val_tau']:.3f}, "
                 f"block acc-len {best['val_acc_len']:.3f}, loss {best['val_loss']:.4f})")
    train_s = time.perf_counter() - t1
    stats = {"steps": steps_done, "stopped_early": steps_done < cfg.steps, "first_loss": round(losses[0], 4),
             "last_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
             "gen_s": round(gen_s, 1), "features_s": round(feat_s, 1),
             "train_s": round(train_s, 1), "answers": len(keep), "answer_tokens": answer_tokens,
             "kept_step": kept, "val_history": history, "init": init, "last_lr": lr,
             "compiled_loss": head_loss.compiled, "ranks": dist.world,
             "features_used": features, "resumed_from_state": resumed,
             "steps_before": before,
             **({"step_time": timer.summary()} if timer.timed else {}),
             **({"ranks_agree": ranks_agree} if dist.on else {}),
             **(data_stats or {})}
    if len(val):
        vgen = torch.Generator().manual_seed(cfg.seed + 1)
        vl, va = [], []
        with torch.no_grad(), autocast:
            for v0 in range(0, len(val), cfg.batch):
                lo, ac = block_loss(net, target, data, feats, val[v0:v0 + cfg.batch], vgen,
                                    cfg.anchors, cfg.decay)
                vl.append(float(lo))
                va.append(ac)
        stats["val_loss"] = round(sum(vl) / len(vl), 4)
        stats["val_block_accept_len"] = round(sum(va) / len(va), 3)
        # at most 8 checks' worth of answers: the run keeps 30 s for this and saving
        stats["val_tau"] = round(walk_tau(net.eval(), target, data, feats,
                                          val[: 8 * cfg.val_seqs], net.cfg.block_size - 1,
                                          cfg.batch, cfg.anchors, autocast), 3)
        progress(f"validation: loss {stats['val_loss']}  block acc-len "
                 f"{stats['val_block_accept_len']} (1 + accepted of full blocks at uniform "
                 f"anchors)  τ {stats['val_tau']} (the engine's, decoding these answers)")
    return net.eval(), stats, losses


def init_net(target, bcfg: BlockConfig, cfg: TrainConfig) -> tuple[BlockNet, str]:
    """The drafter to train (on the target's device) and how it was initialised: seeded
    random weights with the target's final norm, then --init-from-target layers or the
    tensors of --init-from-weights DIR (whose config must equal `bcfg`)."""
    net = BlockNet(bcfg).to(target.device).init_weights(cfg.seed)
    with torch.no_grad():  # start in the scale the target's head expects
        net.norm.weight.copy_(target.model.norm.weight.float())
    init = "random (seeded normal, std 0.02)"
    if cfg.resume:
        if cfg.init_from_target or cfg.init_from_weights not in ("", cfg.resume):
            raise ValueError("--resume starts from its folder's weights: no --init-from-target "
                             "or other --init-from-weights with it")
        cfg = dataclasses.replace(cfg, init_from_weights=cfg.resume)
    if cfg.init_from_target and cfg.init_from_weights:
        raise ValueError("--init-from-target and --init-from-weights: give one")
    if cfg.init_from_target:
        layers = init_layers(cfg.init_from_target, target.cfg.num_layers, cfg.num_layers)
        net.init_from_target(target, layers)
        init = f"target layers {list(layers)} (fc selects target layer {max(bcfg.target_layers)})"
    elif cfg.init_from_weights:
        have = read_manifest(Path(cfg.init_from_weights)).config
        grow = grows(have, bcfg)
        if have != bcfg and not grow:
            mine = bcfg.model_dump()
            diff = {k: (v, mine[k]) for k, v in have.model_dump().items() if v != mine[k]}
            raise BlockDrafterError(
                f"--init-from-weights {cfg.init_from_weights}: its config does not match this "
                f"run's (field: theirs, this run's): {diff}; set --num-layers, --block-size, "
                "--num-target-layers to the weights' values (a larger --num-layers grows it)")
        src, man = load_block(Path(cfg.init_from_weights), target)
        with torch.no_grad():
            net.load_state_dict({k: v.to(target.device) for k, v in src.state_dict().items()},
                                strict=not grow)
            for layer in net.layers[have.num_layers:]:   # new layers add nothing at first
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        init = (f"weights {cfg.init_from_weights} (seed {man.seed}, "
                f"{(man.training or {}).get('steps', '?')} steps)")
        if grow:
            init += (f", grown from {have.num_layers} to {bcfg.num_layers} layers (layers "
                     f"{have.num_layers}-{bcfg.num_layers - 1} seeded, their o_proj and "
                     "down_proj zero: the same drafts at the start)")
    return net, init


def grows(have: BlockConfig, want: BlockConfig) -> bool:
    """Whether a drafter of config `have` can start one of config `want` by appending
    layers: every field equal but num_layers, which `want` has more of."""
    return (want.num_layers > have.num_layers
            and have.model_copy(update={"num_layers": want.num_layers}) == want)


def init_layers(spec: str, num_target: int, num_layers: int) -> tuple[int, ...]:
    """--init-from-target: "last" (the last num_layers target layers) or indices "27,28,29"."""
    if spec == "last":
        return tuple(range(num_target - num_layers, num_target))
    try:
        layers = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"--init-from-target {spec!r}: 'last' or comma-separated layer "
                         "indices") from None
    if len(layers) != num_layers or any(not 0 <= i < num_target for i in layers):
        raise ValueError(f"--init-from-target {spec!r}: need {num_layers} indices in "
                         f"0..{num_target - 1}")
    return layers

