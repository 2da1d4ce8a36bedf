"""Two `specpilot run` at once on a small CPU machine, against one alone (issue 30: torch's
default threads, one per core in every process, made two concurrent runs take 92 s each
against 7 s alone on 2 cores).

Runs the same AR generation of the embedded default as separate `specpilot` processes:
one alone, then N started together, with the threads the command chooses (the cores free
when it starts, specpilot/threads.py), and N together with every process forced to all
cores (OMP_NUM_THREADS = the core count: torch's default behaviour). Prints one table:
per case the median process wall time, the median decode tokens/s and the ratio to the
run alone. Goal: N = 2 with the chosen threads within 1.5x of one alone.

    python bench/concurrent_runs.py                 # N = 2, 64 new tokens
    python bench/concurrent_runs.py --smoke         # CPU, 2 new tokens: the machinery

Writes concurrent_runs.json to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import common  # noqa: F401  (the repository on sys.path)
from common import ROOT, log, print_table, write_json

PROMPT = "Write a Python function that merges two sorted lists."


def start(max_new: int, threads: int | None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("OMP_NUM_THREADS", "SPECPILOT_THREADS"):
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return time.perf_counter(), subprocess.Popen(
        [sys.executable, "-m", "specpilot", "run", PROMPT, "--ar", "--max-new", str(max_new),
         "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def together(n: int, max_new: int, threads: int | None) -> list[dict]:
    procs = [start(max_new, threads) for _ in range(n)]
    out = []
    for t0, p in procs:
        stdout, stderr = p.communicate()
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"specpilot run failed ({p.returncode}): {stderr.strip()[-300:]}")
        rep = json.loads(stdout)
        out.append({"wall_s": wall, "tok_s": rep["tokens_per_s"], "threads": rep["threads"],
                    "busy_note": "warning" in stderr})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2, help="processes started together")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="times each case runs")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--smoke", action="store_true", help="2 new tokens, one repeat")
    args = ap.parse_args()
    if args.smoke:
        args.max_new, args.repeats = 2, 1
    cores = len(os.sched_getaffinity(0))
    cases = [("one alone, chosen threads", 1, None),
             (f"{args.n} together, chosen threads", args.n, None),
             (f"{args.n} together, {cores} threads each (torch's default)", args.n, cores)]
    result, rows = {"cores": cores, "max_new": args.max_new, "cases": {}}, []
    for name, n, threads in cases:
        runs = []
        for r in range(args.repeats):
            log(f"{name}: repeat {r + 1}/{args.repeats}")
            runs += together(n, args.max_new, threads)
        result["cases"][name] = runs
    alone = statistics.median(r["wall_s"] for r in result["cases"][cases[0][0]])
    for name, _n, _t in cases:
        runs = result["cases"][name]
        wall = statistics.median(r["wall_s"] for r in runs)
        rates = [r["tok_s"] for r in runs if r["tok_s"]]
        rows.append([name, len(runs), "/".join(str(r["threads"]) for r in runs), f"{wall:.1f}",
                     f"{min(r['wall_s'] for r in runs):.1f}-{max(r['wall_s'] for r in runs):.1f}",
                     f"{statistics.median(rates):.2f}" if rates else "-",
                     f"{wall / alone:.2f}", sum(r["busy_note"] for r in runs)])
    print_table(["case", "processes", "torch threads", "median wall s", "range",
                 "median decode tok/s",
                 "x alone", "busy warnings"], rows,
                f"`specpilot run --ar --max-new {args.max_new}` on {cores} cores")
    write_json(args.out, "concurrent_runs.json", result)


if __name__ == "__main__":
    main()
