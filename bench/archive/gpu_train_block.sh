#!/bin/bash
# H200, one device call: train the block drafter for the embedded model, then read τ on one
# dev request per category. Stage the GGUF first as bench/NOTES.md "Running on the H200"
# says: earlier calls on the same machine carry the first parts (.gpu0, ...) and park them
# in /tmp (bench/gpu_lib.sh gguf_assemble); this call carries .whl and the last part.
#   bash bench/gpu_train_block.sh [SEED]     # weights -> $OUT/block, logs -> $OUT
# Copy $OUT/block/* to stock/drafters/weights/embedded/ and commit to ship them.
set -u
seed=${1:-0}
source bench/gpu_setup.sh || exit 1
OUT=${OUT:-.out}
mkdir -p "$OUT/block"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start=$(date +%s)
# --total-seconds bounds the whole training command (setup, data, training, saving).
# Drafter layers start as the target's last three; 24000 prompts (about 22,700 distinct) are
# answered 2048 at a time, then 2048 prompts summarising the target's own prose answers; the
# learning-rate schedule follows the clock (bench/NOTES.md "Block drafter after run 3").
python3 -m training.block --out "$OUT/block" --seed "$seed" --device cuda \
    --init-from-target last --prompts 24000 --summaries 2048 --max-new 192 --gen-batch 2048 \
    --feat-batch 512 --steps 8000 --batch 64 --anchors 16 --gen-seconds 150 \
    --total-seconds 420 --val-every 500 2>&1 | grep -v Warning | tee "$OUT/train_block.log"
echo "train rc=${PIPESTATUS[0]} in $(( $(date +%s) - start ))s"
if [ -f "$OUT/block/manifest.json" ]; then
    timeout $(( 560 - ($(date +%s) - start) )) python3 bench/gpu_block.py --weights "$OUT/block" \
        --per-category 1 --max-new 192 --also ngram,block-eager --no-force --out "$OUT" \
        2>&1 | tail -24
    echo "tau check rc=$? at $(( $(date +%s) - start ))s"
fi
