"""How many distinct training prompts each corpus of training/prompts.py gives (CPU).

Issue 24 asks for at least 5x the shipped drafter's 53k answered rows, drawn from the
offline prompt corpus (dev prompts excluded, the sealed generator's templates never used).
For each corpus (`base`, what the shipped drafter trained on; `wide`, `--corpus wide`) this
asks build_prompts for --n prompts from one seed, the dev prompts excluded, and prints per
source how many distinct prompts it gave against what the mix asked for (a source whose
templates run out gives fewer), and the seconds it took. The stdlib sources are the running
interpreter's, so the counts depend on the Python that runs it.

    python bench/corpus_size.py                      # n 300000, seed 0
    python bench/corpus_size.py --smoke              # n 20000, 30 stdlib files: seconds
"""

from __future__ import annotations

import argparse
import platform
import time

import common  # noqa: F401 (the repository on sys.path)
from common import log, print_table, write_json

from training.prompts import MIX, W, build_prompts, dev_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None,
                    help="prompts asked of each corpus (300000; --smoke: 20000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="30 stdlib files only (seconds)")
    ap.add_argument("--out", default="", help="folder for corpus_size.json")
    args = ap.parse_args()
    args.n = args.n or (20_000 if args.smoke else 300_000)
    dev = dev_prompts()
    rows, res = [], {}
    for corpus, mix in (("base", MIX), ("wide", W.wide_mix)):
        t0 = time.perf_counter()
        got = build_prompts(args.seed, args.n, exclude=dev, corpus=corpus,
                            limit_files=30 if args.smoke else None)
        secs = time.perf_counter() - t0
        texts = [t for _, t in got]
        assert len(set(texts)) == len(texts) and not dev.intersection(texts)
        total = sum(mix.values())
        counts = {c: sum(1 for k, _ in got if k == c) for c in mix}
        res[corpus] = {"prompts": len(got), "seconds": round(secs, 1), "by_source": counts}
        log(f"{corpus}: {len(got)} distinct prompts in {secs:.1f} s")
        for c, share in mix.items():
            rows.append([corpus, c, round(args.n * share / total), counts[c]])
        rows.append([corpus, "all", args.n, len(got)])
    print_table(["corpus", "source", "asked", "distinct prompts"], rows,
                f"seed {args.seed}, dev prompts excluded, Python {platform.python_version()}'s "
                f"stdlib" + (" (30 files)" if args.smoke else ""))
    write_json(args.out, "corpus_size.json", {"n": args.n, "seed": args.seed,
                                              "python": platform.python_version(), **res})


if __name__ == "__main__":
    main()
