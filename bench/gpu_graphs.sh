#!/bin/sh
# Issue 6 on the H200, one device call: the CUDA-graph GPU tests, then the 27B-class bench
# (bf16 and, when kernels.w12.linear imports, W12 side by side). Each part runs even if the
# one before failed. Output: $OUT/graphs_tests.txt, $OUT/gpu_27b.json, and the printed tables.
#
#     sh bench/gpu_graphs.sh            # about 1.5-3 min on an H200 (estimate; not yet run)
OUT="${OUT:-.}"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
echo "== tests/gpu/test_graphs.py"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graphs.py 2>&1 \
    | tee "$OUT/graphs_tests.txt" | tail -25
echo "== bench/gpu_27b.py"
W12=""
python3 -c "import kernels.w12.linear" 2>/dev/null && W12="--w12"
timeout 300 python3 bench/gpu_27b.py --out "$OUT" $W12
