#!/bin/bash
# H200: the controller's verdict on the w12-weights entry (27B-class random target), through
# the judges as they are: stock's reference first, the timed outputs checked, confined workers.
# Stages everything from the working tree the device tool sends (no bundles): wheels from
# .whl/ into the image's site-packages (workers start with a clean PYTHONPATH), bubblewrap
# from .whl/deb/ where the image has none, a fresh git repository whose main is this tree and
# whose branch w12 is the entry's patch applied on it.
#   [ROUNDS=6] bash bench/gpu_verdict.sh [extra compare flags]     (carry .whl)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
if ! command -v bwrap >/dev/null; then   # never dpkg -x into /: it replaces /lib's link
    mkdir -p /tmp/bw && for f in .whl/deb/*.deb; do dpkg -x "$f" /tmp/bw; done
    export PATH="/tmp/bw/usr/bin:$PATH"
    ldd /tmp/bw/usr/bin/bwrap | grep -q "not found" \
        && export LD_LIBRARY_PATH="/tmp/bw/usr/lib/x86_64-linux-gnu:/tmp/bw/lib/x86_64-linux-gnu"
fi
echo "bwrap: $(command -v bwrap) $(bwrap --version 2>&1)"
bwrap --ro-bind / / --unshare-all --die-with-parent true && echo "bwrap works" \
    || echo "bwrap does not work here"
rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -a . /tmp/repo/ && cd /tmp/repo || exit 1
rm -rf .whl .git
G="git -c user.name=gpu -c user.email=gpu@localhost"
$G init -q -b main && $G add -A && $G commit -qm "stock (working tree)" || exit 1
$G checkout -q -b w12 && git apply memory/w12-weights.patch && $G commit -qam w12 \
    && $G checkout -q main || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
CMP="python3 -m specpilot compare main w12 --opt-b weights=w12 --model random:dense-27b \
     --devices 0 --rounds ${ROUNDS:-6} --requests 4 --max-new 32 --drafter-a ar $*"
echo "$CMP"
# One H200 holds two 27B-class workers: the pairs run one session after another.
printf '\n[controller]\nresident = 1\n' >> .specpilot/config.toml
# No widened near-tie by hand: the reference's noise pass measures stock's own bf16 noise
# and the judges widen the near-tie to gates.noise_factor times it (judges/outputs.py).
tail -6 .specpilot/config.toml
# within the device call: the summary below still prints when the comparison runs long
time timeout "${LIMIT:-540}" $CMP --json > "$OUT/w12_27b_ar.json" \
    2> >(while IFS= read -r l; do echo "$(date +%T) $l"; done > "$OUT/w12_27b_ar.err")
echo "rc=$?"
tail -3 "$OUT/w12_27b_ar.err"
tar czf "$OUT/logs.tgz" -C .specpilot runs
grep -c . .specpilot/runs/compare-*/*.log | head -8
grep -h "fell back\|Error\|error:" .specpilot/runs/compare-*/*.log | sort | uniq -c | head -12
python3 - "$OUT"/w12_27b_ar*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
  r = json.load(open(f)); e, d = r["estimate"], r["decision"]
  print(f.rsplit("/", 1)[-1])
  print(f"pairs {e['pairs']} gain {e['gain']:+.3%} lower {e['lower_bound']:+.3%} "
      f"sigma {r['sigma']:.3%} ({r['sigma_source']}) threshold {d['threshold']:.3%} "
      f"verdict {d['verdict']} diverged {r['paired']['diverged']}")
  t = r.get("tolerance") or {}
  print(f"near-tie epsilon {t.get('epsilon')} rate {t.get('rate')} (stock's noise: max "
        f"{t.get('noise_max')}, flips {t.get('noise_flip_rate')})")
  for side, rows in r["paired"]["times"].items():
    flat = sorted(x for row in rows for x in row)
    print(f"{side}: {len(flat)} requests, median {flat[len(flat) // 2]:.3f} s, "
          f"min {flat[0]:.3f}, max {flat[-1]:.3f}")
  for side, c in r.get("outputs", {}).items():
    print(f"outputs {side}: {c['requests']} requests, {c['tokens']} tokens, "
          f"{len(c['near_ties'])} near-ties (margins <= "
          f"{max([t['margin'] for t in c['near_ties']], default=0):.3f}), "
          f"{c['restarts']} continuations, faults {c['faults'][:3]}")
PY
