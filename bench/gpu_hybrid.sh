#!/bin/bash
# H200: the hybrid GDN target (issue "hybrid targets"), in one call (carry .whl: it holds
# fla_core and einops, py3-none-any wheels of flash-linear-attention's kernels):
#
#   bash bench/gpu_hybrid.sh          # tests/gpu/test_gpu_hybrid.py (fla against the
#                                     # reference, captured steps against eager ones, compiled
#                                     # steps against the fp32 truth) and
#                                     # tests/gpu/test_gpu_batch_hybrid.py (batched rows, graphs
#                                     # against eager), bench/compiled_numerics.py, then
#                                     # bench/step_hybrid.py on hybrid-27b (random weights)
#   bash bench/gpu_hybrid.sh tree [ARGS]  # entries tree-verify + tree-verify-gdn applied in
#                                     # a copy: tests/test_gdn_tree_kernel.py on CUDA and
#                                     # tests/gpu/test_gpu_tree_gdn.py (captured tree slots), then
#                                     # bench/gdn_tree.py ARGS (WY kernel, per-path, chain;
#                                     # steps), e.g. --parts 3 --step-budgets 64,32,16
#   bash bench/gpu_hybrid.sh probe    # the same copy: bench/gdn_tree_probe.py (the WY kernel's
#                                     # launch variants, one process each: a fault stays there)
#   bash bench/gpu_hybrid.sh --smoke  # CPU: step_hybrid.py, gdn_tree.py and gdn_tree_probe.py
#                                     # on tiny-hybrid
#
# Tables on stdout; JSON and the tests' log in $OUT.
set -u
cd "$(dirname "$0")/.." || exit 1
source bench/stage.sh
OUT=${OUT:-$PWD}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
tree_copy() {   # a copy of this tree with the entries tree-verify and tree-verify-gdn applied
    dir=$(mktemp -d /tmp/tree-gdn.XXXXXX) || exit 1
    trap 'rm -rf "$dir"' EXIT
    cp -a stock kernels specpilot training tests bench memory pyproject.toml "$dir/" && cd "$dir" \
        && git apply memory/tree-verify.patch && git apply memory/tree-verify-gdn.patch \
        || { echo "gpu_hybrid: the tree entries did not apply"; exit 1; }
    export PYTHONPATH=$dir
}
if [ "${1:-}" = "--smoke" ]; then   # both scripts on tiny-hybrid, the second in the entry tree
    python3 bench/step_hybrid.py --smoke --out "${OUT}" || exit 1
    tree_copy
    python3 bench/gdn_tree.py --smoke --out "${OUT}" || exit 1
    exec python3 bench/gdn_tree_probe.py --smoke --out "${OUT}"
fi
stage wheels || exit 1
if [ "${1:-}" = "probe" ]; then
    tree_copy
    exec python3 bench/gdn_tree_probe.py --out "$OUT"
fi
if [ "${1:-}" = "tree" ]; then
    tree_copy
    python3 -m pytest -q -p no:cacheprovider tests/test_gdn_tree_kernel.py \
        tests/gpu/test_gpu_tree_gdn.py --tb=short 2>&1 | tee "$OUT/tests_tree.txt" | tail -20
    exec python3 bench/gdn_tree.py --out "$OUT" "${@:2}"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import fla, fla.ops.gated_delta_rule; print('fla', getattr(fla, '__version__', '?'))" \
    || echo "gpu_hybrid: flash-linear-attention not importable: the reference runs on CUDA"
python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_hybrid.py \
    tests/gpu/test_gpu_batch_hybrid.py --tb=short -s 2>&1 | tee "$OUT/tests_hybrid.txt" | tail -30
python3 bench/compiled_numerics.py --out "$OUT" 2>&1 | grep -v Warning
python3 bench/step_hybrid.py --recurrent-max-t 1,64 --out "$OUT"
