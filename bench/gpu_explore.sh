#!/bin/bash
# H200: the main job, `specpilot explore` (offline: no API key, so the planner reuses and
# tunes memory entries), on the embedded default, across device calls of at most 10
# minutes. The first call stages a repository (bench/stage.sh's repo step: this tree as
# main, `specpilot init`, GPU-sized [explore] evidence below) at $XREPO, which stays on the
# warm machine; every call runs the cycle for at most LIMIT seconds and the next call
# resumes the same run (`explore --resume`), so a cycle longer than one call finishes in
# several calls made back to back (each within the machine's warm window).
#
#   bash bench/gpu_explore.sh            # carry .whl (the GGUF staged: stage.sh gguf);
#                                        # call again while it prints "not finished"
#   DIRECTIONS=1 bash bench/gpu_explore.sh   # [explore] max_directions (default 3), set
#                                        # when the first call stages the repository
#   BATCH=16 bash bench/gpu_explore.sh   # [explore] batch: the cycle judges throughput at
#                                        # concurrency 16 (set at staging, as DIRECTIONS)
#   bash bench/gpu_explore.sh --smoke    # CPU: random:tiny-qwen3, stopped before the plan
#                                        # and resumed to the explore phase
#
# Prints the end of explore's log and one table of the run (phase, each direction's status,
# gain, bound and entry, validation); the log and the run record's JSON land in $OUT.
set -u
SMOKE=""
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
cd "$(dirname "$0")/.." || exit 1
source bench/stage.sh
OUT=${OUT:-$PWD}
export PYTHONUNBUFFERED=1
if [ -n "$SMOKE" ]; then
    tmp=$(mktemp -d /tmp/explore-smoke.XXXXXX) || exit 1
    trap 'rm -rf "$tmp"' EXIT
    XREPO=$tmp/repo MODEL=random:tiny-qwen3 UNTIL="--until explore" LIMIT=${LIMIT:-300}
    rm -f "$OUT/explore.log"
    stage bwrap >/dev/null
else
    XREPO=${XREPO:-/tmp/xrepo} MODEL=${MODEL:-embedded} UNTIL=${UNTIL:-} LIMIT=${LIMIT:-540}
    stage wheels bwrap gguf || exit 1
fi
if [ ! -f "$XREPO/.specpilot/config.toml" ]; then
    stage_repo "$XREPO" || exit 1
    python3 -m specpilot init >/dev/null || { echo "gpu_explore: specpilot init failed"; exit 1; }
    python3 - "$MODEL" "$SMOKE" "${DIRECTIONS:-3}" "${BATCH:-0}" <<'EOF' || exit 1
import re, sys
model, smoke, directions, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
path = ".specpilot/config.toml"
text = re.sub(r'(?m)^path = ".*"$', f'path = "{model}"', open(path).read(), count=1)
# evidence for a GPU (the shipped [explore] defaults are sized for a 2-core CPU); the smoke
# keeps the CPU's
extra = "" if smoke else """
[explore]
backend = "offline"
max_directions = {directions}
analyze_requests = 4
analyze_max_new = 128
prescreen_requests = 2
prescreen_max_new = 64
gate_requests = 4
controller_rounds = 3
controller_requests = 4
controller_max_new = 128
validate_requests = 2
batch = {batch}
""".format(directions=int(directions), batch=batch)
open(path, "w").write(text + extra)
EOF
    echo "gpu_explore: staged $XREPO (model $MODEL)"
else
    cd "$XREPO" || exit 1
fi
command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
last_run() {   # the newest run record's id, or nothing; `open`: only while not done
    python3 -m specpilot runs list --json | python3 -c "import json, sys
r = json.load(sys.stdin)
print(r[-1]['run_id'] if r and (sys.argv[1] != 'open' or r[-1]['phase'] != 'done') else '')" "$1"
}
# the smoke stops before the plan, then resumes that run to the explore phase
for until in ${SMOKE:+"--until plan"} "$UNTIL"; do
    # the smoke's first call runs in a repository staged just now: no run to resume
    if [ -n "$SMOKE" ] && [ "$until" = "--until plan" ]; then run=""; else run=$(last_run open); fi
    # shellcheck disable=SC2086
    timeout "$LIMIT" python3 -m specpilot explore ${run:+--resume "$run"} $until \
        >> "$OUT/explore.log" 2>&1
    rc=$?
    echo "gpu_explore: explore ${run:+--resume $run }$until: exit $rc"
done
# the smoke's second call resumed the first's run: that is the newest (else: look it up)
if [ -z "$SMOKE" ] || [ -z "$run" ]; then run=$(last_run any); fi
tail -25 "$OUT/explore.log"
if [ -z "$run" ]; then echo "gpu_explore: no run record (rc $rc)"; exit 1; fi
python3 -m specpilot runs show "$run" --json > "$OUT/explore_run.json" 2>/dev/null
python3 - "$OUT/explore_run.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
a = r.get("analysis") or {}
pct = lambda x: "" if x is None else f"{x:+.2%}"   # noqa: E731
print(f"\n{r['run_id']}: phase {r['phase']}, {r['wall_s']:.0f} s, drafter "
      f"{a.get('drafter', '?')}\n")
print("| direction | status | gain | lower bound | entry | reason |")
print("|---|---|---|---|---|---|")
for d in r["directions"]:
    print(f"| {d['direction']['id']} | {d['status']} | {pct(d['gain'])} "
          f"| {pct(d['lower_bound'])} | {d['entry'] or ''} | {'; '.join(d['reasons'])[:120]} |")
v = r.get("validation") or {}
print(f"\nvalidation passed: {v.get('passed', 'not run')}; entries: {r['entries']}")
EOF
case $rc in
124|137) echo "gpu_explore: not finished after ${LIMIT}s: call again to resume $run" ;;
*) echo "gpu_explore: $run ended with exit $rc" ;;
esac
