#!/bin/bash
# H200: bench/gpu_numerics.py on the w12-weights entry's tree (stock's own margin noise against
# W12's, 27B-class random target). Stages with bench/stage.sh (wheels from .whl/: pydantic for
# specpilot's imports), then runs in a copy of this tree with memory/w12-weights.patch applied.
#
#   bash bench/gpu_numerics.sh [--prompts 8 --max-new 32]      # device tool, carry .whl
#   bash bench/gpu_numerics.sh --smoke                         # CPU: tiny-qwen3, fp32
#
# Prints one table; the whole output also lands in $OUT/numerics.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
source bench/stage.sh
tmp=$(mktemp -d /tmp/numerics.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
OUT=${OUT:-$tmp}
# the smoke runs where the project is installed: no wheels (.whl/ holds the device's)
case " $* " in *" --smoke "*) ;; *) stage wheels || exit 1 ;; esac
stage_repo "$tmp/w12t" w12=w12-weights && git checkout -q w12 || exit 1
command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
# this copy first, whatever PYTHONPATH the caller had (a checkout without the entry)
PYTHONPATH=$PWD python3 bench/gpu_numerics.py "$@" 2>&1 | tee "$OUT/numerics.txt" | grep -v Warning
exit "${PIPESTATUS[0]}"
