#!/bin/bash
# One H200 call (issue 7): the M = 1 W12 GEMV on the 27B-class layer shapes, with the shipped
# candidates under register caps (more programs an SM) and the tensor-core candidates of the
# larger buckets (x padded to 16 rows), against cuBLAS (SWEEP=1); the M = 1 GPU tests; then
# the 27B-class compiled step, tuned twice from scratch (do the tuner's picks hold?).
#   run (carry .whl): SWEEP=1 bash bench/gpu_w12_m1.sh 560
source bench/gpu_lib.sh
gpu_begin "${1:-560}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -n "$SWEEP" ] && TAIL=30 step sweep 260 python3 bench/gpu_w12_sweep.py --ms 1 --m1-dot \
    --maxnreg 64,80,96,128 --shapes qkv,o,gate_up,down,head --budget-s 250 --out "$OUT"
T=tests/gpu/test_gpu_w12.py::test_gemv_bf16_every_config_of_each_bucket
step tests 120 python3 -m pytest -q -p no:logging -p no:cacheprovider "$T[w12-1]" "$T[w8-1]" \
    tests/gpu/test_gpu_w12.py::test_grouped_w12_in_the_compiled_step_matches_one_by_one
TAIL=30 step e2e 330 python3 bench/gpu_27b.py --compile on --ts 1,16 --iters 20 \
    --variants fused_attn --w12 --w12-kernels gemv --w12-compiled --w12-retune --out "$OUT"
