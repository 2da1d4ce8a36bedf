#!/bin/bash
# H200: the controller's verdict on a memory entry, through the judges as they are: stock's
# reference first, the timed outputs checked, confined workers. Default: w12-weights on the
# 27B-class random target, AR serving. Staging (bench/stage.sh): wheels from .whl/ into the
# image's site-packages (workers start with a clean PYTHONPATH), bubblewrap from .whl/deb/
# where the image has none, and a fresh git repository whose main is this tree and whose
# branch `cand` is the entry's patch on it.
#
#   [ROUNDS=6] [LIMIT=540] bash bench/gpu_verdict.sh [extra compare flags]   # carry .whl
#     (ROUNDS defaults to 8 with --batch: a throughput round is one pair a process)
#   ENTRY=tree-verify OPT_B=tree_budget=32 MODEL=embedded DRAFTER=block \
#     bash bench/gpu_verdict.sh --opt-a draft_len=15 --opt-b draft_len=15 \
#     --requests 8 --max-new 128       # carry .whl; the embedded GGUF staged (stage.sh gguf)
#   bash bench/gpu_verdict.sh --smoke     # CPU: the same staging and comparison on
#                                         # random:tiny-qwen3, 2 rounds x 4 requests x 4 tokens
#   ENTRY="prefill-buckets prompt-admission" MODEL=embedded DRAFTER=block \
#     bash bench/gpu_verdict.sh --batch 16 --opt-a draft_len=15 --opt-b draft_len=15 \
#     --opt-of prefill-buckets prefill_tokens=256 --opt-of prompt-admission admit_chunk=64
#       # several entries judged in one run (`specpilot compare main E1 E2 ..`: one stock
#       # reference and one A side; each entry staged as a branch of its own name, its
#       # options given with --opt-of; OPT_B, if set, goes to every candidate)
#
# Prints one table (per side: median request time, range, near-ties, faults) and the
# estimate; the controller's JSON and the workers' logs land in $OUT.
set -u
SMOKE=""
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
cd "$(dirname "$0")/.." || exit 1
source bench/stage.sh
if [ -n "$SMOKE" ]; then
    tmp=$(mktemp -d /tmp/verdict-smoke.XXXXXX) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    OUT=${OUT:-$tmp/out}; mkdir -p "$OUT"
    REPO=$tmp/repo MODEL=random:tiny-qwen3 LIMIT=${LIMIT:-240}
    set -- --requests 4 --max-new 4 "$@"   # 8 pairs: controller.min_pairs
else
    REPO=${STAGE_REPO:-/tmp/repo} MODEL=${MODEL:-random:dense-27b}
    OUT=${OUT:-.}
    [ -z "${ENTRY:-}" ] && set -- --requests 4 --max-new 32 "$@"
fi
ENTRY=${ENTRY:-w12-weights} DRAFTER=${DRAFTER:-ar}
read -r -a ENTRIES <<< "$ENTRY"
if [ "${#ENTRIES[@]}" -gt 1 ]; then   # several: branches named after the entries
    CANDS=("${ENTRIES[@]}"); STAGED=("${ENTRIES[@]}"); OPT_B=${OPT_B:-}
    NAME=several_$(echo "$MODEL" | tr ':' '-')
else
    CANDS=(cand); STAGED=(cand="$ENTRY"); OPT_B=${OPT_B-weights=w12}
    NAME=${ENTRY}_$(echo "$MODEL" | tr ':' '-')
fi
# the smoke runs where the project is installed: no wheels (.whl/ holds the device's)
if [ -n "$SMOKE" ]; then stage bwrap || exit 1; else stage wheels bwrap gguf || exit 1; fi
stage_repo "$REPO" "${STAGED[@]}" || exit 1
command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
# a throughput round (--batch) is one cell a process: controller.min_pairs (8) rounds
# (the smoke's single requests: 2 rounds x 4 requests)
case " $* " in *" --batch "*) ROUNDS_DEFAULT=8 ;; *) ROUNDS_DEFAULT=${SMOKE:+2} ;; esac
ROUNDS_DEFAULT=${ROUNDS_DEFAULT:-6}
CMP="python3 -m specpilot compare main ${CANDS[*]} ${OPT_B:+--opt-b $OPT_B} --model $MODEL \
     --devices 0 --rounds ${ROUNDS:-$ROUNDS_DEFAULT} --drafter-a $DRAFTER $*"
echo "$CMP"
# One H200 holds two 27B-class workers: the pairs run one session after another (not in the
# smoke: one session of four tiny workers saves a second round of process starts).
# A small target (the embedded default) computes stock's references in REF_PROCS processes
# (default 2), and every side's workers prepare beside them (AHEAD=1, the default).
if [ -z "$SMOKE" ] && [ "${MODEL#random:dense}" != "$MODEL" ]; then
    printf '\n[controller]\nresident = 1\n' >> .specpilot/config.toml
elif [ -z "$SMOKE" ]; then
    printf '\n[controller]\nreference_processes = %s\n' "${REF_PROCS:-2}" >> .specpilot/config.toml
    # every side's workers prepare beside stock's reference (AHEAD=0: after it, as before
    # 2026-12-06 session 30): on the embedded default they were 2 m 18 s and 2 m 45 s of a
    # three-candidate verdict's 7 m 54 s, one after the other
    if [ "${AHEAD:-1}" = 1 ]; then
        printf 'prepare_beside_reference = true\n' >> .specpilot/config.toml
    fi
fi
# No widened near-tie by hand: the reference's noise pass measures stock's own bf16 noise
# and the judges widen the near-tie to gates.noise_factor times it (judges/outputs.py).
tail -6 .specpilot/config.toml
# within the device call: the summary below still prints when the comparison runs long
time timeout "${LIMIT:-540}" $CMP --json > "$OUT/$NAME.json" \
    2> >(while IFS= read -r l; do echo "$(date +%T) $l"; done > "$OUT/$NAME.err")
rc=$?
echo "rc=$rc (0 adopted, 3 not adopted)"
tail -3 "$OUT/$NAME.err"
# the run's phase clock: its progress lines less the per-request, per-output and per-round ones
grep -v "forced through an output\|reference, request\|  round [0-9]" "$OUT/$NAME.err" | head -24
[ -d .specpilot/runs ] && tar czf "$OUT/logs.tgz" -C .specpilot runs
grep -c . .specpilot/runs/compare-*/*.log 2>/dev/null | head -8
grep -h "fell back\|Error\|error:" .specpilot/runs/compare-*/*.log 2>/dev/null | sort | uniq -c | head -12
[ -s "$OUT/$NAME.json" ] || { echo "no verdict to tabulate: $OUT/$NAME.err says why"; exit "$rc"; }
PYTHONPATH=$PWD/bench python3 - "$OUT/$NAME.json" "$ENTRY" <<'PY'
import json, sys
from common import print_table
f = sys.argv[1]
reports = json.load(open(f))
for r in reports if isinstance(reports, list) else [reports]:
    e, d = r["estimate"], r["decision"]
    times, rows = r["paired"]["times"], []
    for side, name in (("A", "stock"), ("B", sys.argv[2] if r["b"]["rev"] == "cand"
                                             else r["b"]["rev"])):
        labels = sorted(k for k in times if k.startswith(side))
        flat = sorted(x for k in labels for row in times[k] for x in row)
        meds = []
        for k in labels:
            xs = sorted(x for row in times[k] for x in row)
            meds.append(f"{xs[len(xs) // 2]:.3f}" if xs else "-")
        c = r.get("outputs", {}).get(side) or {}
        ties = c.get("near_ties", [])
        rows.append([f"{side} ({name}), {' / '.join(labels)}", len(flat),
                     f"{' / '.join(meds)} s",
                     f"{flat[0]:.3f}-{flat[-1]:.3f} s" if flat else "-",
                     f"{len(ties)} in {c.get('tokens', '?')} tokens (margins <= "
                     f"{max([t['margin'] for t in ties], default=0):.3f})",
                     f"{c.get('restarts', '')} / {c.get('forced', '')}",
                     len(c.get("faults", [])) if c else ""])
    cell = "a round (one batch)" if r.get("batch") else "a request"
    print_table(["side", "cells", f"median {cell}", "range", "near-ties",
                 "continuations / forced", "faults"], rows,
                f.rsplit("/", 1)[-1] + ("" if r["b"]["rev"] == "cand" else f": {r['b']['rev']}"))
    t = r.get("tolerance") or {}
    print(f"\npairs {e['pairs']} gain {e['gain']:+.3%} lower {e['lower_bound']:+.3%} "
          f"sigma {r['sigma']:.3%} ({r['sigma_source']}) threshold {d['threshold']:.3%} "
          f"verdict {d['verdict']} diverged {r['paired']['diverged']}")
    print(f"near-tie epsilon {t.get('epsilon')} rate {t.get('rate')} (stock's noise: max "
          f"{t.get('noise_max')}, flips {t.get('noise_flip_rate')})")
    for side, c in r.get("outputs", {}).items():
        print(f"outputs {side}: faults {c['faults'][:3]}")
clock = (reports[0] if isinstance(reports, list) else reports).get("clock_s") or {}
if clock:   # one run's phases, the same in every report of it
    print("\nthe run's clock (s): " + ", ".join(f"{k} {v:.0f}" for k, v in clock.items()))
PY
