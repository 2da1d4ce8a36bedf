#!/bin/bash
# One H200 call for the 27B-class work of a session (no embedded GGUF needed):
#   1. bench/gpu_w12.py        W12 kernels against cuBLAS bf16 on 27B-class shapes
#   2. bench/gpu_27b.py --w12  27B AR step vs its weight floor, verify T=1..64 from CUDA
#                              graphs, then the same with W12 linear layers, side by side
#   3. specpilot compare stock stock --model random:dense-27b   controller A/A σ, one GPU
#   4. tests/gpu               the GPU tests, with whatever time is left
# Each step gets what is left of the deadline (seconds from now, first argument), so a slow
# step never costs the whole call; everything lands in $OUT.
#   bench/gpu_session.sh 300        (carry .whl and .gpub; .gpub/repo.bundle = git bundle
#                                    --all ^gpu-base after a call that ran gpu_repo_base)
set -u
source "$(dirname "$0")/gpu_lib.sh"
gpu_begin "${1:-300}"
gpu_repo || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
step w12 95 python3 bench/gpu_w12.py --out "$OUT" --budget-s 80
step b27 120 python3 bench/gpu_27b.py --out "$OUT" --w12
step aa27 130 bash -c "python3 -m specpilot compare stock stock --model random:dense-27b \
    --devices 0 --rounds 4 --requests 4 --max-new 32 --json > $OUT/aa_27b.json"
step gputests 90 python3 -m pytest -q tests/gpu
