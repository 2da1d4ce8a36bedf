#!/bin/bash
# One call on an `nvidia-h200-x2`: the block drafter trained on both GPUs at once
# (training/dist.py), then τ of the new and the shipped weights side by side.
#
#   bash bench/gpu_train_ddp.sh 585      # carry .whl; the embedded GGUF staged before
#                                        # (three calls carrying .gpu0, .gpu1, .gpu2 alone)
#
# 1. `torch.distributed.run --nproc_per_node 2 -m training.block`: each GPU
#    answers its half of the corpus, keeps its own rows' hidden states (cached features),
#    and the two train one drafter (mean gradient of both every step), from the shipped
#    weights, until TRAIN_S seconds before the call's end (default: all but 100 s).
#    Weights in $OUT/block, log in $OUT/train.log. If it fails, one GPU trains alone
#    (same flags, --features live) in the time left.
# 2. bench/gpu_block.py on 4 dev requests a category, ≤ 128 new tokens: the new weights
#    with AR beside them on GPU 0, the shipped ones on GPU 1, at the same time.
# 3. tests/gpu/test_gpu_train_loss.py with what time is left.
# TRAIN_ARGS overrides the training flags after --init-from-weights.
set -u
source "$(dirname "$0")/gpu_lib.sh"
gpu_begin "${1:-585}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
gguf_assemble "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
EVAL_S=${EVAL_S:-100}
T=$(( $(left) - EVAL_S ))
ARGS=${TRAIN_ARGS:---prompts 80000 --summaries 2048 --max-new 192 --gen-batch 4096 \
--gen-seconds 120 --feat-batch 512 --lr 4e-4 --warmup 200 --steps 40000 --batch 64 \
--anchors 16 --val-every 500}
TAIL=40 step train "$T" python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
    -m training.block --out "$OUT/block" --seed 0 --device cuda \
    --init-from-weights stock/drafters/weights/embedded $ARGS --total-seconds $(( T - 5 ))
if [ ! -f "$OUT/block/manifest.json" ] && [ "$(left)" -gt $(( EVAL_S + 150 )) ]; then
    T=$(( $(left) - EVAL_S ))
    echo "two-GPU training left no weights: one GPU, ${T}s"
    TAIL=40 step train1 "$T" python3 -m training.block --out "$OUT/block" \
        --seed 0 --device cuda --init-from-weights stock/drafters/weights/embedded $ARGS \
        --features live --total-seconds $(( T - 5 ))
fi
if [ -f "$OUT/block/manifest.json" ]; then
    E=$(( $(left) - 5 ))
    ( CUDA_VISIBLE_DEVICES=1 timeout "$E" python3 bench/gpu_block.py --per-category 4 \
        --max-new 128 --no-ar --out "$OUT/shipped" > "$OUT/tau_shipped.log" 2>&1 ) &
    TAIL=16 step tau_new "$E" env CUDA_VISIBLE_DEVICES=0 python3 bench/gpu_block.py \
        --weights "$OUT/block" --per-category 4 --max-new 128 --out "$OUT/new"
    wait
    echo "== shipped weights, same requests (GPU 1)"; tail -n 12 "$OUT/tau_shipped.log"
fi
TAIL=8 step gputest 60 python3 -m pytest -q -p no:logging tests/gpu/test_gpu_train_loss.py
