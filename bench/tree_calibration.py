"""Draft trees built from calibrated acceptance instead of the drafter's own log-probs: τ on
held-out requests, simulated exactly over teacher-forced lattices (CPU; τ is
hardware-independent).

A best-first tree spends its node budget on the paths the drafter finds most probable. The
block drafter predicts every block position at once, so a node's log-probability is the
drafter's marginal at its depth, not the chance the target accepts it given its parent.
Here a per-depth calibration maps the drafter's log-probability at depth d to the measured
rate at which such a token is the greedy output's next token where the output's earlier
tokens are all in the lattice (so the tree can hold the output's path up to the parent):
fitted on the dev requests, binned by log-probability, pulled toward the drafter's own
value where a bin holds few tokens. The trees are then built over the calibrated lattices
and the whole greedy loop is simulated (specpilot/judges/tau.py: exact for this drafter up
to fp32 rounding) on held-out requests (the sealed generator's templates drawn with a
public seed; bench/drafter_tau.py), at several budgets, raw against calibrated.

    python bench/tree_calibration.py --per-category 4 --max-new 128
    python bench/tree_calibration.py --smoke      # 2 dev, 1 held-out request, 8 tokens, budget 8

Prints one table; writes tree_calibration.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import math
import os
import time

from common import log, print_table, smoke_device, write_json  # noqa: E402 - sets sys.path first

from drafter_tau import HELDOUT_SEED, request_set  # noqa: E402
from specpilot.judges.tau import simulate_requests  # noqa: E402
from specpilot.judges.worker_main import teacher_forced  # noqa: E402
from stock.engine import Engine  # noqa: E402
from stock.options import Options  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402

EDGES = (-8.0, -6.0, -5.0, -4.0, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, -0.25, -0.1)  # log q bins
PRIOR = 5.0   # tokens' worth of the drafter's own probability in each bin


def _bin(lp: float) -> int:
    return sum(lp > e for e in EDGES)


def fit(forced, depth: int) -> list[list[float]]:
    """Per depth d (1..depth) and log-prob bin: log of (accepted + PRIOR * mean q) /
    (count + PRIOR), over every lattice token at depth d where the output's tokens at depths
    1..d-1 each appear in their lattice row."""
    acc = [[0.0] * (len(EDGES) + 1) for _ in range(depth)]
    cnt = [[0.0] * (len(EDGES) + 1) for _ in range(depth)]
    qs = [[0.0] * (len(EDGES) + 1) for _ in range(depth)]
    for lattices, output in forced:
        for p, lat in enumerate(lattices):
            for d in range(1, depth + 1):
                if p + d >= len(output) or d > len(lat["ids"]):
                    break
                ids, lps = lat["ids"][d - 1], lat["logprobs"][d - 1]
                for tok, lp in zip(ids, lps):
                    if tok < 0 or lp == float("-inf"):
                        continue
                    b = _bin(lp)
                    cnt[d - 1][b] += 1
                    qs[d - 1][b] += math.exp(min(lp, 0.0))
                    acc[d - 1][b] += tok == output[p + d]
                if output[p + d] not in ids:   # the output's path leaves the lattice here
                    break
    table = []
    for d in range(depth):
        row = []
        for b in range(len(EDGES) + 1):
            mean_q = qs[d][b] / cnt[d][b] if cnt[d][b] else math.exp(
                EDGES[b - 1] if b else EDGES[0] - 1)
            rate = (acc[d][b] + PRIOR * mean_q) / (cnt[d][b] + PRIOR)
            row.append(math.log(max(rate, 1e-9)))
        table.append(row)
    return table


def calibrated(forced, table):
    """The same requests with every lattice log-prob replaced by its depth's calibrated one
    (rank order within a depth kept where the bins are monotone; ties broken by rank)."""
    out = []
    for lattices, output in forced:
        new = []
        for lat in lattices:
            lps = [[table[d][_bin(lp)] if lp != float("-inf") else lp for lp in row]
                   for d, row in enumerate(lat["logprobs"][:len(table)])]
            new.append({"ids": lat["ids"][:len(table)], "logprobs": lps})
        out.append((new, output))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--budgets", default="8,16,32")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--heldout-seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true",
                    help="2 dev requests, 1 held-out, 8 tokens, budget 8")
    args = ap.parse_args()
    if args.smoke:
        args.per_category, args.max_new, args.budgets = 1, 8, "8"
    args.device = smoke_device(args)
    depth = args.block_size - 1
    system = load_system("embedded", Options(), device=args.device, max_context=4096)
    tok, model = system.tokenizer, system.engine.model
    eng = Engine(model, Options({"block_size": args.block_size, "draft_len": depth}), 4096,
                 set(system.engine.stop_ids))
    drafter = make_drafter("block", eng)
    forced, t0 = {}, time.perf_counter()
    for name in ("dev", "heldout"):
        reqs = request_set(name, args.per_category, args.heldout_seed)
        if args.smoke:   # a fit over two requests, judged on one held-out: CI time kept
            reqs = reqs[:2 if name == "dev" else 1]
        forced[name] = []
        for i, r in enumerate(reqs):
            rec = teacher_forced(eng, drafter, tok.chat(r.prompt),
                                 min(args.max_new, r.max_new_tokens), depth)
            forced[name].append((rec["lattices"], rec["output"]))
            log(f"{name} {i + 1}/{len(reqs)} {r.id}: {len(rec['output'])} tokens "
                f"({time.perf_counter() - t0:.0f} s)")
    table = fit(forced["dev"], depth)
    budgets = [None] + [int(b) for b in args.budgets.split(",") if b]
    rows, result = [], {"table": table, "edges": EDGES, "prior": PRIOR, "sets": {}}
    for name in ("dev", "heldout"):
        cal = calibrated(forced[name], table)
        for b in budgets:
            raw = simulate_requests(forced[name], b, depth)
            new = simulate_requests(cal, b, depth)
            result["sets"].setdefault(name, {})[str(b)] = {"raw": raw.tau, "calibrated": new.tau}
            rows.append([name + (" (fit here)" if name == "dev" else ""), len(forced[name]),
                         "chain" if b is None else b, f"{raw.tau:.3f}", f"{new.tau:.3f}",
                         f"{new.tau / raw.tau:.3f}"])
    write_json(args.out, "tree_calibration.json", result)
    print_table(["requests", "n", "budget", "τ raw log-probs", "τ calibrated", "× raw"], rows,
                f"best-first trees over raw and calibrated block-drafter lattices (block "
                f"{args.block_size}), {args.device}, {args.max_new} new tokens at most, "
                f"simulated over teacher-forced lattices")


if __name__ == "__main__":
    main()
