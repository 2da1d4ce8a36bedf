"""Host time of the n-gram drafter per speculative step: the indexed drafter against its
plain reference, on the embedded model's own outputs, with identical lattices checked.

The drafter runs on the host inside every speculative step while the GPU waits (on the H200
it took 0.27-0.45 ms a step against a 1.1 ms verify step of the embedded model: bench/NOTES.md,
gpu_block.py's draft_ms). This script needs no GPU: it generates the embedded default's greedy
output for one dev request per category (CPU, AR), then replays the engine's n-gram schedule
over each: draft at the current context, accept the chain's longest prefix that equals the
output plus the bonus token, repeat. Both drafters see the same calls; every lattice is
compared bit for bit; per call: median and mean µs, calls, τ of the schedule.

    python bench/ngram_draft_cost.py                    # about 1-2 min on this 2-core CPU
    python bench/ngram_draft_cost.py --max-new 256 --per-category 2 --out /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from stock.drafters.base import DraftContext  # noqa: E402
from stock.drafters.ngram import NGramDrafter  # noqa: E402
from stock.drafters.ngram_reference import ReferenceNGramDrafter  # noqa: E402


def schedule(drafter, prompt: list[int], output: list[int], k: int):
    """The engine's calls for one request: (µs per call, lattices, accepted per step)."""
    drafter.reset()
    tokens = prompt + output[:1]  # the prefill's token is pending
    done, times, lattices, accepted = 1, [], [], []
    while done < len(output):
        ctx = DraftContext(list(tokens))
        t0 = time.perf_counter_ns()
        lat = drafter.draft(ctx, min(k, len(output) - done))
        times.append((time.perf_counter_ns() - t0) / 1e3)
        lattices.append(lat)
        n = 0
        for tok in lat.chain:
            if done + n < len(output) and tok == output[done + n]:
                n += 1
            else:
                break
        step = output[done:done + n + 1]
        tokens += step
        done += len(step)
        accepted.append(len(step))
    return times, lattices, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--draft-len", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5, help="schedules timed per drafter")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args()
    from specpilot.requests import load_dev, select
    from stock.system import load_system

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    system = load_system("embedded", device="cpu")
    reqs = select(load_dev(), None, args.per_category)
    rows, all_ref, all_fast = [], [], []
    for r in reqs:
        prompt = system.tokenizer.chat(r.prompt)
        t0 = time.perf_counter()
        out = system.engine.generate(prompt, args.max_new).tokens
        gen_s = time.perf_counter() - t0
        ref_t, fast_t = [], []
        for i in range(args.repeats):  # alternate, so drift hits both
            for name, d in (("ref", ReferenceNGramDrafter()), ("fast", NGramDrafter())):
                times, lats, acc = schedule(d, prompt, out, args.draft_len)
                (ref_t if name == "ref" else fast_t).append(times)
                if i == 0:
                    if name == "ref":
                        want, tau = lats, sum(acc) / len(acc)
                    elif any(not (torch.equal(a.ids, b.ids) and torch.equal(a.logprobs,
                                                                           b.logprobs))
                             for a, b in zip(lats, want)) or len(lats) != len(want):
                        raise SystemExit(f"{r.id}: the indexed drafter's lattices differ")
        ref_us = [statistics.median(x) for x in zip(*ref_t)]
        fast_us = [statistics.median(x) for x in zip(*fast_t)]
        all_ref += ref_us
        all_fast += fast_us
        rows.append({"request": r.id, "prompt": len(prompt), "new": len(out),
                     "calls": len(ref_us), "tau": round(tau, 3), "gen_s": round(gen_s, 1),
                     "ref_median_us": statistics.median(ref_us),
                     "fast_median_us": statistics.median(fast_us),
                     "ref_mean_us": statistics.fmean(ref_us),
                     "fast_mean_us": statistics.fmean(fast_us)})
        print(f"{r.id}: prompt {len(prompt)}, {len(out)} new, {len(ref_us)} calls, tau {tau:.3f}",
              flush=True)
    print(f"\n{'request':<20}{'prompt':>7}{'calls':>7}{'tau':>7}{'ref µs':>10}{'index µs':>10}"
          f"{'ref/index':>11}{'ref mean':>10}{'idx mean':>10}")
    for x in rows:
        print(f"{x['request']:<20}{x['prompt']:>7}{x['calls']:>7}{x['tau']:>7.3f}"
              f"{x['ref_median_us']:>10.1f}{x['fast_median_us']:>10.1f}"
              f"{x['ref_median_us'] / x['fast_median_us']:>11.2f}{x['ref_mean_us']:>10.1f}"
              f"{x['fast_mean_us']:>10.1f}")
    med_r, med_f = statistics.median(all_ref), statistics.median(all_fast)
    print(f"{'all':<20}{'':>7}{len(all_ref):>7}{'':>7}{med_r:>10.1f}{med_f:>10.1f}"
          f"{med_r / med_f:>11.2f}{statistics.fmean(all_ref):>10.1f}"
          f"{statistics.fmean(all_fast):>10.1f}")
    print("identical lattices on every call; times are medians over "
          f"{args.repeats} replays of each call")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "ngram_draft_cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
