#!/bin/bash
# One H200 call for the W12 GEMV's register prefetch (GemvConfig.prefetch) and programmatic
# dependent launch (kernels.w12.gemv.PDL, issue 7): the GPU tests of both (bit-identical
# results), the group shapes swept at M = 1 and 16 with and without the prefetch (SWEEP=1;
# no PDL there: do_bench runs no graph), then the 27B-class step with every M <= 16
# candidate offered with and without the prefetch (the tuner picks; gpu_27b.json lists the
# picks), compiled, without and with PDL.
#   run (carry .whl): bash bench/gpu_w12_prefetch.sh 560
source bench/gpu_lib.sh
gpu_begin "${1:-560}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
step tests 150 python3 -m pytest -q -p no:logging -p no:cacheprovider tests/gpu/test_gpu_w12.py \
    -k "prefetch or pdl"
[ -n "$SWEEP" ] && step sweep 190 python3 bench/gpu_w12_sweep.py --prefetch --ms 1,16 \
    --shapes qkv,o,gate_up,down --budget-s 180 --out "$OUT"
TAIL=45 step e2e 330 python3 bench/gpu_27b.py --compile on --ts 1,16 --iters 20 \
    --variants fused_attn --w12 --w12-kernels gemv --w12-compiled --w12-prefetch twins \
    --w12-pdl --out "$OUT"
