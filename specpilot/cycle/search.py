"""The tuner's search, pure: values to try around an option's default, and successive
halving over option configurations given a timing function. Used by the judges' adapter
(cycle/judges.tune_options), the planner and Phase 3; imports nothing of the project."""

from __future__ import annotations

import math
from typing import Callable


def default_values(name: str, default, count: int, low: int | None = None,
                   high: int | None = None) -> list[str]:
    """Values to try around `default`: at least 1 and within the option's declared range
    [low, high] when it has one."""
    if isinstance(default, bool):
        return [str(not default)]
    if isinstance(default, int):
        raw = [default // 2, default - max(1, default // 4), default + max(1, default // 2),
               default * 2, default + 1, default - 1]
        seen = []
        for v in raw:
            inside = (low is None or v >= low) and (high is None or v <= high)
            if v >= 1 and inside and v != default and v not in seen:
                seen.append(v)
        return [str(v) for v in seen[:count]]
    return []


def bucket_values(default: int, count: int, low: int | None = None,
                  high: int | None = None) -> list[str]:
    """Values v with v + 1 a power of two, nearest `default` first (by the ratio of v + 1 to
    default + 1), within [low, high], not `default`: for a draft length, whose verify step
    of draft_len + 1 tokens runs in a CUDA graph of a power-of-two token bucket
    (stock/graphs.py BUCKETS), so that a step fills its bucket. Stock's 8 runs its 9 tokens
    in the 16 bucket: on the H100 (batched block at C = 16-32, docs/results.md, 2026-12-06)
    7 made 1.04-1.08x stock's tokens/s at the same τ, and 15 gave 1.01x."""
    out = [v for v in (2 ** k - 1 for k in range(1, 11))
           if v != default and (low is None or v >= low) and (high is None or v <= high)]
    out.sort(key=lambda v: (abs(math.log2((v + 1) / (default + 1))), v))
    return [str(v) for v in out[:count]]


def halving(configs: list[dict], base_options: dict, timed: Callable[[dict, int], float],
            progress: Callable[[str], None] = lambda s: None) -> dict:
    """Successive halving of `configs` (option dicts applied over `base_options`).
    `timed(options, request_index)` -> seconds of one short generation. Returns the best
    configuration's index, its estimated gain over the base, and every score."""
    if not configs:
        raise ValueError("no configurations to tune")
    scores: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    base_times: list[float] = []
    alive = list(range(len(configs)))
    rounds = max(1, math.ceil(math.log2(max(len(configs), 1))) + 1)
    for r in range(rounds):
        base_times.append(timed(dict(base_options), r))
        for i in alive:
            t = timed({**base_options, **configs[i]}, r)
            scores[i].append(math.log(base_times[r] / t))
            progress(f"{_label(configs[i])}: gain {_gain(scores[i]):+.1%}")
        alive = sorted(alive, key=lambda i: -sum(scores[i]) / len(scores[i]))
        alive = alive[: max(1, len(alive) // 2)]
        if len(alive) == 1 and r >= 1:
            break
    best = alive[0]
    return {"best": best, "config": configs[best], "gain": _gain(scores[best]),
            "scores": [{"config": configs[i], "gain": _gain(s) if s else None,
                        "requests": len(s)} for i, s in scores.items()],
            "base_times": base_times}


def _gain(scores: list[float]) -> float:
    return math.exp(sum(scores) / len(scores)) - 1


def _label(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())
