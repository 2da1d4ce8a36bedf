"""Training data of the block drafter: the target's greedy answers, sharded, saved, merged.

`Data` holds the answers as one padded tensor (prompts right-aligned to column P, answers
from P); `generate_data` makes it (many prompts at once, left-padded, per-row positions and
masks). `shard` picks the prompts of one --prompt-shard I/N; `save_data` / `load_data` write
and read a data file (--data-out / --data-in: a torch.save of plain tensors and lists under a
checked `DataHeader`, refused for another target); `merge_data` joins two Data.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from training.prompts import prose_summary_prompt

DATA_FORMAT = "specpilot-block-data/1"


def log(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class Data:
    tokens: torch.Tensor  # [N, S] int64; prompt right-aligned to column P, answer from P
    pad: torch.Tensor  # [N] first real column
    end: torch.Tensor  # [N] one past the last real column (answer ends at its stop token)
    prompt_cols: int  # P


def _mask(valid_from: torch.Tensor, q_cols: torch.Tensor, k_len: int) -> torch.Tensor:
    """[B, 1, Tq, k_len]: causal, real keys only; a padding query sees itself (no NaN rows)."""
    k = torch.arange(k_len, device=q_cols.device)
    m = (k[None, None, :] <= q_cols[:, :, None]) & (k[None, None, :] >= valid_from[:, None, None])
    m |= k[None, None, :] == q_cols[:, :, None]
    return m.unsqueeze(1)


# Batches answered as one group: their prompts sorted by length together, so that each
# batch pads only to its own longest prompt. The wide corpus' chat prompts (max_prompt 256)
# run from 34 to 256 tokens, median 64, p75 117, mean 98.6 (30,001 drawn, 2026-12-05):
# padded to the longest, a batch prefilled 2.6 times its real prompt tokens and every decode
# step attended over the padding. A group is also the unit of --gen-seconds (whole groups,
# in order).
SORT_GROUP = 4


@torch.inference_mode()
def generate_data(target, prompts: list[list[int]], max_new: int, batch: int,
                  stop_ids, progress=log, max_seconds: float = 0.0) -> Data:
    """Greedy answers of `target` to every prompt, batched; one padded tensor, rows in the
    prompts' order. The prompts are answered SORT_GROUP batches at a time, sorted by length
    within that group, each batch left-padded only to its own longest prompt. With
    `max_seconds`, groups after that time are not started (the data then has the rows of
    the groups answered: a prefix of the prompts)."""
    dev = target.device
    p_cols = max(len(p) for p in prompts)
    s = p_cols + max_new
    tokens = torch.zeros(len(prompts), s, dtype=torch.long)
    pad = torch.tensor([p_cols - len(p) for p in prompts])
    end = torch.full((len(prompts),), s)
    stops = torch.tensor(sorted(stop_ids) or [-1], device=dev)
    t0 = time.perf_counter()
    group = batch * SORT_GROUP
    for g0 in range(0, len(prompts), group):
        if max_seconds and g0 and time.perf_counter() - t0 > max_seconds:
            progress(f"  stopped answering after {g0} prompts: --gen-seconds {max_seconds}")
            tokens, pad, end = tokens[:g0], pad[:g0], end[:g0]
            break
        order = sorted(range(g0, min(g0 + group, len(prompts))), key=lambda i: len(prompts[i]))
        for b0 in range(0, len(order), batch):
            idx = order[b0:b0 + batch]
            ids, stop_at, width = answer_batch(target, [prompts[i] for i in idx], max_new, stops)
            tokens[idx, p_cols - width:] = ids.cpu()   # right-aligned to column p_cols
            end[idx] = stop_at.cpu() + (p_cols - width)
        progress(f"  generated {min(g0 + group, len(prompts))}/{len(prompts)} answers "
                 f"({time.perf_counter() - t0:.1f}s)")
    for i in range(len(tokens)):  # zero what follows each stop (never read, but tidy)
        tokens[i, int(end[i]):] = 0
    return Data(tokens, pad, end, p_cols)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


def answer_batch(target, part: list[list[int]], max_new: int, stops: torch.Tensor, pick=greedy):
    """One batch's answers, each next token `pick(logits [n, vocab])` (greedy: argmax):
    (ids [n, width + max_new] on the device, prompts right-aligned to column `width` (the
    batch's longest prompt), answers after; each row's end [n] (one past its stop token,
    else width + max_new); width)."""
    dev = target.device
    n, width = len(part), max(len(p) for p in part)
    s = width + max_new
    ids = torch.zeros(n, s, dtype=torch.long, device=dev)
    for i, p in enumerate(part):
        ids[i, width - len(p):width] = torch.tensor(p)
    vfrom = torch.tensor([width - len(p) for p in part], device=dev)
    cache = target.new_cache(s, n)
    cols = torch.arange(width, device=dev).expand(n, width)
    pos = (cols - vfrom[:, None]).clamp(min=0)
    out = target(ids[:, :width], cache, 0, positions=pos, mask=_mask(vfrom, cols, width),
                 logits="last")
    nxt = pick(out.logits[:, -1])
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    stop_at = torch.full((n,), s, device=dev)
    for j in range(max_new):
        col = width + j
        ids[:, col] = nxt
        hit = torch.isin(nxt, stops) & ~done
        stop_at = torch.where(hit, torch.full_like(stop_at, col + 1), stop_at)
        done |= hit
        if j == max_new - 1 or (j % 16 == 15 and bool(done.all())):
            break
        c = torch.full((n, 1), col, device=dev)
        out = target(ids[:, col:col + 1], cache, col, positions=c - vfrom[:, None],
                     mask=_mask(vfrom, c, col + 1), logits="last")
        nxt = pick(out.logits[:, -1])
    return ids, stop_at, width


def merge_data(a: Data, b: Data) -> Data:
    """One Data of a's rows then b's, both right-aligned to the larger prompt width (the
    narrower one shifted right, its padding widened) and padded to the wider answer span."""
    p = max(a.prompt_cols, b.prompt_cols)
    span = max(a.tokens.shape[1] - a.prompt_cols, b.tokens.shape[1] - b.prompt_cols)

    def widen(d: Data):
        shift = p - d.prompt_cols
        t = torch.zeros(len(d.tokens), p + span, dtype=torch.long)
        t[:, shift:shift + d.tokens.shape[1]] = d.tokens
        return t, d.pad + shift, d.end + shift

    (ta, pa, ea), (tb, pb, eb) = widen(a), widen(b)
    return Data(torch.cat([ta, tb]), torch.cat([pa, pb]), torch.cat([ea, eb]), p)


def parse_shard(spec: str) -> tuple[int, int]:
    """--prompt-shard "I/N" -> (I, N), 0 <= I < N; "" -> (0, 1)."""
    if not spec:
        return 0, 1
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--prompt-shard {spec!r}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--prompt-shard {spec!r}: need 0 <= I < N")
    return i, n


def shard(items: list, spec: str) -> list:
    """The items i with i % N == I of --prompt-shard I/N (all for ""): the shards of one
    corpus are disjoint and together cover it."""
    i, n = parse_shard(spec)
    return items[i::n]


class DataHeader(BaseModel):
    """What a data file (--data-out) holds and for which target; checked on loading."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["specpilot-block-data/1"] = DATA_FORMAT
    target_fingerprint: str  # block_weights.target_fingerprint of the target that answered
    target_name: str = ""
    vocab_size: int
    seed: int
    prompt_shard: str = ""  # "I/N" or "" (the whole corpus)
    corpus_prompts: int  # prompts of the whole corpus before sharding
    prompts: int  # prompts of this shard given to stage 1
    rows: int
    answer_tokens: int
    prompt_cols: int
    max_new: int
    max_prompt: int
    categories: dict[str, int]
    gen_s: float
    stats: dict = {}  # gen_stage2_s, stage2_summaries, ...
    command: str = ""


class DataFileError(ValueError):
    """A data file that is missing, unreadable, of another format or of another target."""


def save_data(path: Path | str, data: Data, header: DataHeader, groups: list | None) -> None:
    """torch.save of plain tensors (tokens as int32) and lists under the header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if groups is not None and len(groups) != len(data.end):
        raise ValueError(f"{len(groups)} groups for {len(data.end)} rows")
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"header": header.model_dump(), "tokens": data.tokens.to(torch.int32),
                "pad": data.pad.clone(), "end": data.end.clone(),
                "groups": list(groups) if groups is not None else None}, tmp)
    tmp.replace(path)


def load_data(path: Path | str, fingerprint: str | None = None
              ) -> tuple[Data, DataHeader, list | None]:
    """(data, header, groups) of a file written by save_data; DataFileError when it is
    missing, not such a file, or (with `fingerprint`) answered by another target."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"--data-in {path}: no such file (write it with --data-out)")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        header = DataHeader.model_validate(raw["header"])
    except Exception as exc:  # unpickling errors of any kind, a missing or invalid header
        raise DataFileError(f"--data-in {path}: not a {DATA_FORMAT} data file "
                            f"({exc.__class__.__name__}: {str(exc)[:200]})") from None
    if fingerprint is not None and header.target_fingerprint != fingerprint:
        raise DataFileError(
            f"--data-in {path}: answered by another target ({header.target_name or '?'}, "
            f"fingerprint {header.target_fingerprint}; this target {fingerprint})")
    tokens, pad, end = raw["tokens"].long(), raw["pad"].long(), raw["end"].long()
    if tokens.shape[0] != header.rows or len(pad) != header.rows or len(end) != header.rows:
        raise DataFileError(f"--data-in {path}: {tokens.shape[0]} rows, header says "
                            f"{header.rows}")
    return Data(tokens, pad, end, header.prompt_cols), header, raw["groups"]


def load_merged(paths: list[str], fingerprint: str | None
                ) -> tuple[Data, list | None, dict[str, int], list[dict], list[DataHeader]]:
    """(data, groups, categories, per-file descriptions, headers) of several data files,
    merged in the order given; category counts summed, groups concatenated."""
    if not paths:
        raise DataFileError("--data-in: no files given")
    data, groups, cats, files, headers = None, [], {}, [], []
    for p in paths:
        d, h, g = load_data(p, fingerprint)
        if headers and (h.max_new, h.seed) != (headers[0].max_new, headers[0].seed):
            log(f"note: {p} has max_new {h.max_new}, seed {h.seed}; the first file "
                f"{headers[0].max_new}, {headers[0].seed}")
        data = d if data is None else merge_data(data, d)
        groups = None if groups is None or g is None else groups + list(g)
        for k, v in h.categories.items():
            cats[k] = cats.get(k, 0) + v
        files.append({"file": str(p), "rows": h.rows, "answer_tokens": h.answer_tokens,
                      "prompt_shard": h.prompt_shard, "corpus_prompts": h.corpus_prompts,
                      "gen_s": h.gen_s})
        headers.append(h)
    return data, groups, cats, files, headers


def prose_rows(data: Data, sources: list[str], n: int, seed: int, min_tokens: int = 96,
               kinds: tuple[str, ...] = ("long-form", "chat")) -> list[int]:
    """Up to n rows (seeded choice) whose answers are prose of at least min_tokens: the
    passages of the second-stage summarisation prompts."""
    ok = [i for i in range(len(data.end)) if sources[i] in kinds
          and int(data.end[i]) - data.prompt_cols >= min_tokens]
    order = torch.randperm(len(ok), generator=torch.Generator().manual_seed(seed + 5)).tolist()
    return sorted(ok[j] for j in order[:n])


def summary_prompts(tok, data: Data, rows: list[int], stop_ids, seed: int, max_prompt: int,
                    max_passage: int = 180) -> list[list[int]]:
    """Chat prompts asking to summarise the target's own answers of `rows` (their first
    `max_passage` tokens, stop tokens dropped)."""
    rng = random.Random(seed + 7)
    out = []
    for i in rows:
        ids = data.tokens[i, data.prompt_cols:int(data.end[i])].tolist()
        ids = [t for t in ids if t not in stop_ids][:max_passage]
        out.append(tok.chat(prose_summary_prompt(rng, tok.decode(ids)))[-max_prompt:])
    return out
