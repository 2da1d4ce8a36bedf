"""Requests the embedded target writes itself (training --self-prompts): how many a draw
keeps, how fast, and whether they stay clear of the held-out check.

training/self_prompts.py samples the target from its chat template's user turn. The
held-out τ (bench/drafter_tau.py --sets heldout) draws the sealed generator's templates
with a public seed; training must not have seen them, which the wide corpus's test checks
as "no prompt opens with the same six words as a sealed draw"
(tests/test_training_block.py). This draws --n requests and looks their six-word openings
up among those of --sealed-draws draws of each public seed, and among the dev prompts'
(excluded from training by exact text only). One table; the requests in the JSON.

    python bench/self_requests.py --n 400 --seed 21 --max-new 160     # CPU, about 5 min
    python3 bench/self_requests.py --n 20000 --batch 4096             # GPU: the sampling's rate
    python bench/self_requests.py --smoke
"""

from __future__ import annotations

import argparse
import os

from common import log, print_table, smoke_device, write_json  # noqa: E402 - sets sys.path first

from specpilot.requests import load_dev  # noqa: E402
from specpilot.requests.sealed import generate_sealed  # noqa: E402
from stock.system import load_system  # noqa: E402
from training.self_prompts import sample_requests  # noqa: E402

WORDS = 6   # the opening tests/test_training_block.py compares
PUBLIC_SEEDS = (20261204, 1, 2)   # 20261204: bench/drafter_tau.py's held-out draw


def opening(text: str) -> str:
    return " ".join(text.split()[:WORDS])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="requests to keep")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--max-new", type=int, default=160, help="tokens a request may take")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--sealed-draws", type=int, default=2000, help="draws of each public seed")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="CPU: 2 requests of 16 tokens")
    args = ap.parse_args()
    if args.smoke:
        # 2 kept of one batch of 8 (seed 21: the first batch keeps 2, unfinished ones counted)
        args.n, args.batch, args.max_new, args.sealed_draws = 2, 8, 16, 200
    args.device = smoke_device(args)
    system = load_system("embedded", device=args.device, max_context=1024)
    texts, counts = sample_requests(system.engine.model, system.tokenizer, args.n, args.seed,
                                    args.batch, args.max_new, set(system.engine.stop_ids),
                                    args.temperature, progress=log)
    sealed = {opening(r.prompt) for s in PUBLIC_SEEDS
              for r in generate_sealed(s, args.sealed_draws)}
    dev = {opening(r.prompt) for r in load_dev()}
    on_sealed = [t for t in texts if opening(t) in sealed]
    on_dev = [t for t in texts if opening(t) in dev]
    rate = counts["sampled"] / counts["seconds"] if counts["seconds"] else float("nan")
    print_table(["kept", "sampled", "unfinished or short", "repeats", "s", "sampled / s",
                 f"a sealed draw's opening ({len(sealed)} openings)",
                 f"a dev prompt's opening ({len(dev)})"],
                [[counts["kept"], counts["sampled"], counts["unfinished"], counts["duplicates"],
                  counts["seconds"], f"{rate:.1f}", len(on_sealed), len(on_dev)]],
                f"self-written requests: {args.device}, seed {args.seed}, temperature "
                f"{args.temperature}, {args.max_new} tokens at most; openings of {WORDS} "
                f"words, sealed draws of seeds {', '.join(map(str, PUBLIC_SEEDS))}")
    for t in (on_sealed + on_dev)[:10]:
        log(f"  shares an opening: {t[:100]!r}")
    write_json(args.out, "self_requests.json",
               {"args": vars(args), "counts": counts, "on_sealed": on_sealed, "on_dev": on_dev,
                "requests": texts})


if __name__ == "__main__":
    main()
