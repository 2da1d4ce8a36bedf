"""False adoption of the controller's rule by simulation through the real code (issue 20).

Synthetic worker processes (per-process offsets, per-request noise, drift, stale σ, heavy
tails: specpilot/judges/simulate.py) are timed by the controller's own round loop and
judged by `stats.judge`, the function `specpilot compare` calls. One table (Markdown): per
noise model, the new rule's false adoption (true gain 0), its adoption of an honest
candidate (true gain --gain) and the old rule's false adoption (one process per side, σ
from a separate A/A run).

    python bench/judges_false_adoption.py                 # 1000 trials per cell, ~1 min
    python bench/judges_false_adoption.py --smoke         # 40 trials, a few seconds
    python bench/judges_false_adoption.py --processes 3 --family 1
"""

from __future__ import annotations

import argparse
import sys
import time

from common import print_table  # noqa: F401 - sets sys.path first

from specpilot.judges import simulate  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials per cell (>= 200)")
    ap.add_argument("--smoke", action="store_true", help="40 trials per cell: a quick check")
    ap.add_argument("--processes", type=int, default=2, help="worker processes per side")
    ap.add_argument("--family", type=int, default=3, help="directions judged together")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--gain", type=float, default=0.10, help="the honest candidate's gain")
    ap.add_argument("--no-old", action="store_true", help="skip the old rule's column")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    trials = 40 if args.smoke else args.trials
    t0 = time.perf_counter()
    rows = simulate.table(trials=trials, family=args.family, processes=args.processes,
                          rounds=args.rounds, requests=args.requests, honest_gain=args.gain,
                          old=not args.no_old, seed=args.seed)
    print_table(["noise model", "trials", "false adoption", f"+{args.gain:.0%} adopted",
                 "old rule false"],
                [[r.model, r.trials, f"{r.false_adoption:.1%}", f"{r.honest_adoption:.1%}",
                  "-" if r.old_false_adoption is None else f"{r.old_false_adoption:.1%}"]
                 for r in rows],
                f"processes {args.processes} per side, {args.rounds} rounds x {args.requests} "
                f"requests, family {args.family}, rule: lower bound > 1% + 2σ (σ from the "
                "same run)")
    print(f"({trials} trials per cell, seed {args.seed}, {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
