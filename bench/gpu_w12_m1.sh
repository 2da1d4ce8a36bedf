#!/bin/bash
# One H200 call (issue 7): the M = 1 W12 GEMV on the 27B-class layer shapes, with the shipped
# candidates under register caps (more programs an SM) and the tensor-core candidates of the
# larger buckets (x padded to 16 rows), against cuBLAS; then, with E2E=1, the 27B-class
# compiled step with those tensor-core candidates offered to the M = 1 tuner.
#   run (carry .whl): bash bench/gpu_w12_m1.sh 560
source bench/gpu_lib.sh
gpu_begin "${1:-560}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
TAIL=30 step sweep 260 python3 bench/gpu_w12_sweep.py --ms 1 --m1-dot --maxnreg 64,80,96,128 \
    --shapes qkv,o,gate_up,down,head --budget-s 250 --out "$OUT"
[ -n "$E2E" ] && TAIL=30 step e2e 280 python3 bench/gpu_27b.py --compile on --ts 1,16 \
    --iters 20 --variants fused_attn --w12 --w12-kernels gemv --w12-compiled \
    --w12-extra "1=4,16,64" --out "$OUT"
