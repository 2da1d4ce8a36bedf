#!/bin/bash
# One H200 call for the 27B-class work of a session (no embedded GGUF needed):
#   1. bench/gpu_w12.py        W12 kernels against cuBLAS bf16 on 27B-class shapes
#   2. bench/gpu_27b.py --w12  27B AR step vs its weight floor, verify T=1..64 from CUDA
#                              graphs, then the same with W12 linear layers, side by side
#   3. specpilot compare stock stock --model random:dense-27b   controller A/A σ, one GPU
#   4. tests/gpu               the GPU tests, with whatever time is left
# Each step gets what is left of the deadline (seconds from now, first argument), so a slow
# step never costs the whole call; everything lands in $OUT.
#   bench/gpu_session.sh 300        (carry .whl and .gpub; .gpub/repo.bundle = git bundle --all)
set -u
deadline=$(( $(date +%s) + ${1:-300} ))
left() { echo $(( deadline - $(date +%s) )); }
step() {  # step NAME SECONDS_WANTED CMD...
    local name=$1 want=$2; shift 2
    local t=$(left); [ "$t" -gt "$want" ] && t=$want
    if [ "$t" -lt 15 ]; then echo "== $name: skipped (${t}s left)"; return; fi
    echo "== $name (limit ${t}s) $(date +%T)"
    timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1; echo "== $name rc=$? $(date +%T)"
    tail -n 40 "$OUT/$name.log"
}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
rm -rf /tmp/repo && git clone -q .gpub/repo.bundle /tmp/repo && cd /tmp/repo || exit 1
git fetch -q "$OLDPWD/.gpub/repo.bundle" 'refs/specpilot/*:refs/specpilot/*' 'refs/notes/*:refs/notes/*'
git config user.email gpu@specpilot.local; git config user.name gpu
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/repo
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
step w12 110 python3 bench/gpu_w12.py --out "$OUT" --budget-s 95
step b27 150 python3 bench/gpu_27b.py --out "$OUT" --w12
step aa27 130 bash -c "python3 -m specpilot compare stock stock --model random:dense-27b \
    --devices 0 --rounds 4 --requests 4 --max-new 32 --json > $OUT/aa_27b.json"
step gputests 90 python3 -m pytest -q tests/gpu
