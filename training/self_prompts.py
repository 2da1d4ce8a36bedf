"""Prompts the target writes itself: the chat template up to the user's turn, continued by
the target with sampling until its end-of-turn token, is a user's request as the target's
own training taught it to expect one (the "Magpie" method, Xu et al. 2024: aligned chat
models regenerate their instruction data from the pre-query template alone).

Issue 24's templated corpus trains a drafter whose validation τ (2.97, on held-out prompts
of the same templates) stands far above its τ on the dev requests (2.25) and on requests of
templates it never saw (2.04): the drafter learns the templates' answers. Requests the
target writes are as varied as its sampling; nothing is downloaded, and the dev prompts are
excluded by exact text like the rest of the corpus.

A share of the rows start the user's turn with an opener (W.self_openers: "Write", "Solve",
"Summarize the following", ...) so that every request category is asked for; the rest are
free. Kept: requests that end at a stop token within `max_new` tokens, hold at least
MIN_TOKENS sampled tokens and no special token, and are new (exact text, after strip).
"""

from __future__ import annotations

import random
import time

import torch

from training.data import answer_batch
from training.prompts import W

TOP_P = 0.95          # nucleus sampling: the smallest set of tokens holding this much probability
TOP_K = 64            # ... among the TOP_K likeliest (a full sort of 49,152 logits a row
                      # each step made sampling 53,248 requests take 160 s on the H100)
MIN_TOKENS = 4        # sampled tokens a kept request holds at least (its opener not counted)
FREE_SHARE = 0.5      # rows with no opener: the target's own choice of request
MARKER = "\u241eQUERY\u241e"


def query_prefix(tok) -> str:
    """The chat template's text before the user's content (system turn included)."""
    ids = tok.chat(MARKER)
    text = tok.decode(ids, skip_special=False)
    at = text.find(MARKER)
    if at < 0:
        raise ValueError("the tokenizer's chat template does not keep the user's text whole")
    return text[:at]


def openers(rng: random.Random, n: int) -> list[str]:
    """Each row's opener: "" (free) for FREE_SHARE of the rows, else one of W.self_openers."""
    return ["" if rng.random() < FREE_SHARE else rng.choice(W.self_openers) for _ in range(n)]


def nucleus(temperature: float, generator: torch.Generator):
    """pick(logits [n, vocab]) -> [n]: a token sampled from each row's top-p set (within
    its TOP_K likeliest)."""
    def pick(logits: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(logits.float() / temperature, -1)
        sp, si = p.topk(min(TOP_K, p.shape[-1]), -1)   # sorted, largest first
        sp = sp * ((sp.cumsum(-1) - sp) < TOP_P)
        return si.gather(1, torch.multinomial(sp, 1, generator=generator)).squeeze(1)
    return pick


def kept_request(opener: str, sampled: list[int], stops: set[int], tok) -> str | None:
    """The request a row wrote (opener + its sampled text up to the stop token), or None:
    no stop within the row, fewer than MIN_TOKENS tokens before it, a special token among
    them, or nothing but blanks."""
    end = next((i for i, t in enumerate(sampled) if t in stops), None)
    if end is None or end < MIN_TOKENS:
        return None
    body = sampled[:end]
    text = tok.decode(body, skip_special=True)
    if text != tok.decode(body, skip_special=False):
        return None
    text = (opener + text).strip()
    return text or None


@torch.inference_mode()
def sample_requests(target, tok, n: int, seed: int, batch: int, max_new: int, stops,
                    temperature: float = 1.0, exclude: set[str] = frozenset(),
                    progress=print, max_seconds: float = 0.0) -> tuple[list[str], dict]:
    """Up to `n` distinct requests written by `target` (batched sampling, fixed by `seed`),
    none in `exclude`; and counts {sampled, kept, unfinished, duplicates, seconds}."""
    rng = random.Random(seed)
    gen = torch.Generator(device=target.device).manual_seed(seed)
    pick = nucleus(temperature, gen)
    prefix = query_prefix(tok)
    stop_set = set(stops)
    stop_t = torch.tensor(sorted(stop_set) or [-1], device=target.device)
    kept: list[str] = []
    seen: set[str] = set(exclude)
    counts = {"sampled": 0, "unfinished": 0, "duplicates": 0}
    t0 = time.perf_counter()
    while len(kept) < n:
        if max_seconds and counts["sampled"] and time.perf_counter() - t0 > max_seconds:
            progress(f"  stopped sampling requests after {max_seconds:.0f}s")
            break
        rows = openers(rng, min(batch, 2 * (n - len(kept)) + 8))
        prompts = [tok.tok.encode(prefix + o, add_special_tokens=False).ids for o in rows]
        ids, _, width = answer_batch(target, prompts, max_new, stop_t, pick)
        for opener, row in zip(rows, ids[:, width:].tolist()):
            text = kept_request(opener, row, stop_set, tok)
            if text is None:
                counts["unfinished"] += 1
            elif text in seen:
                counts["duplicates"] += 1
            else:
                seen.add(text)
                kept.append(text)
        counts["sampled"] += len(rows)
        progress(f"  sampled {counts['sampled']} requests, kept {min(len(kept), n)}/{n} "
                 f"({time.perf_counter() - t0:.1f}s)")
    kept = kept[:n]
    return kept, {**counts, "kept": len(kept), "seconds": round(time.perf_counter() - t0, 1)}


def interleave(a: list, b: list) -> list:
    """a's and b's items in one list, each list's order kept, b spread evenly through a (so
    that a prefix of the result, as --gen-seconds answers, holds both in proportion)."""
    keyed = [((i + 0.5) / len(a), 0, x) for i, x in enumerate(a)]
    keyed += [((j + 0.5) / len(b), 1, x) for j, x in enumerate(b)]
    return [x for _, _, x in sorted(keyed, key=lambda k: (k[0], k[1]))]
