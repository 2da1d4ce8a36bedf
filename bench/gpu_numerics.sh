#!/bin/bash
# H200: bench/gpu_numerics.py on the w12-weights entry's tree (stock's own margin noise against
# W12's, 27B-class random target). Carry .whl (pydantic for specpilot's imports).
#   bash bench/gpu_numerics.sh [--prompts 8 --max-new 32]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
rm -rf /tmp/w12t && mkdir -p /tmp/w12t && cp -a . /tmp/w12t/ && cd /tmp/w12t || exit 1
rm -rf .whl .git && git apply memory/w12-weights.patch || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
PYTHONUNBUFFERED=1 python3 bench/gpu_numerics.py "$@" 2>&1 | tee "$OUT/numerics.txt" | grep -v Warning
