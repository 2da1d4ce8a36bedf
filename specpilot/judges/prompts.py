"""The controller's requests: fresh for every round, never seen before by the process.

A candidate that memoizes outputs by prompt, or precomputes them for the prompts a judge
always picks, is only as fast as its cache. So every round of a comparison gets prompts of
its own, drawn with a secret seed the parent keeps (`secrets.randbits`), and the warm-up
rounds get others; no prompt is timed twice in one comparison.

Sources:
- `fresh` (default): the sealed generator's templates (`specpilot.requests.sealed`) with a
  new secret seed per comparison: an unbounded space the candidate cannot enumerate;
- `dev`, `sealed` or a JSONL file: a pool sampled without replacement with that seed (the
  pool must hold every round's requests, warm-up included);
- models without a tokenizer (`random:...`) get random token ids from the same seed.
"""

from __future__ import annotations

import random
import secrets

from specpilot.errors import SpecPilotError
from specpilot.requests import load_dev, load_jsonl, spread
from specpilot.requests.sealed import ensure_sealed, generate_sealed

# (request id, prompt text or None, prompt ids or None)
Req = tuple[str, str | None, list[int] | None]


def draw(model: str, source: str, rounds: int, per_round: int,
         seed: int | None = None) -> list[list[Req]]:
    """`rounds` lists of `per_round` requests, all different from one another."""
    seed = secrets.randbits(64) if seed is None else seed
    rng = random.Random(seed)
    if model.startswith("random:"):
        return [[(f"rand-{r}-{i}", None, [rng.randrange(1, 256) for _ in range(16)])
                 for i in range(per_round)] for r in range(rounds)]
    if source == "fresh":
        out: list[list[Req]] = []
        seen: set[str] = set()
        for r in range(rounds):
            for _ in range(100):   # a repeat (about 1e-9 a prompt) redraws the round
                reqs = generate_sealed(rng.randrange(2 ** 63), per_round)
                if not seen & {q.prompt for q in reqs}:
                    break
            else:
                raise SpecPilotError("the fresh-prompt generator keeps repeating prompts")
            seen.update(q.prompt for q in reqs)
            row = [(q.id.replace("sealed-", f"fresh{r}-", 1), q.prompt, None) for q in reqs]
            rng.shuffle(row)
            out.append(row)
        return out
    pool = _pool(source)
    need = rounds * per_round
    if len({r.prompt for r in pool}) < need:
        raise SpecPilotError(f"request set {source!r} has {len(pool)} requests; "
                             f"{rounds} rounds x {per_round} need {need} different ones "
                             f"(use the default fresh prompts, or fewer rounds/requests)")
    picked, seen = [], set()
    for r in rng.sample(pool, len(pool)):
        if r.prompt not in seen:
            seen.add(r.prompt)
            picked.append((r.id, r.prompt, None))
    return [picked[k * per_round:(k + 1) * per_round] for k in range(rounds)]


def _pool(source: str):
    try:
        if source == "dev":
            return load_dev()
        if source == "sealed":
            return load_jsonl(ensure_sealed())
        return load_jsonl(source)
    except (OSError, ValueError) as exc:
        raise SpecPilotError(f"request set {source!r}: {exc}") from None


def pick_requests(model: str, count: int, source: str = "dev") -> list[Req]:
    """A fixed sample of `count` requests spread over the categories (the cost model's and
    the tuner's inputs: not a judge's timed requests, which `draw` makes fresh)."""
    if model.startswith("random:"):
        rng = random.Random(0)
        return [(f"rand-{i}", None, [rng.randrange(1, 256) for _ in range(16)])
                for i in range(count)]
    return [(r.id, r.prompt, None) for r in spread(_pool(source), count)]
