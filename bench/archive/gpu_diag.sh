#!/bin/bash
# One call, no embedded model needed (nvidia-h200-x2; carry .whl .gpub, and .gpu0 when an
# embedded call follows on the same machine): where the W12 GEMV and the 27B step lose time.
#   GPU 0   bench/gpu_w12_sweep.py: a wide configuration sweep per layer shape and M
#   GPU 1   ncu of the slow tall shape (17408x5120, M = 1); bench/gpu_27b.py --profile
#           (GPU time by kernel, bf16 and W12 gemv, T = 1 and 16); bench/gpu_block_step.py
#           (block-drafter step split on a random target of the embedded shape)
#   bash bench/gpu_diag.sh SECONDS
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/bench/gpu_lib.sh"
gpu_begin "${1:-420}"
export LOGDIR=/tmp/steplogs-diag-$(date +%H%M%S); mkdir -p "$LOGDIR"
cd "$here" && gpu_repo || exit 1
ngpu=$(nvidia-smi -L | wc -l); g1=$(( ngpu > 1 ? 1 : 0 ))
( export CUDA_VISIBLE_DEVICES=$g1
  TAIL=70 step ncu 100 ncu --clock-control none --launch-skip 2 --launch-count 1 \
      -k regex:_w12_gemv_kernel --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
      python3 bench/w12_one_call.py --k 17408 --n 5120 --m 1 --cfg 16,512,4,2,auto
  TAIL=70 step p27 220 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv \
      --ts 1,16 --iters 10 --profile
  TAIL=90 step blockstep 100 python3 bench/gpu_block_step.py --out "$OUT"
) > "$LOGDIR/gpu1.txt" 2>&1 &
[ "$ngpu" -gt 1 ] || wait
export CUDA_VISIBLE_DEVICES=0
TAIL=80 step sweep 340 python3 bench/gpu_w12_sweep.py --out "$OUT" --budget-s 320
wait; cat "$LOGDIR/gpu1.txt"
tar czf "$OUT/logs.tgz" -C "$LOGDIR" .
