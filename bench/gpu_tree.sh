#!/bin/bash
# H200: memory entry tree-verify measured, in a copy of this tree with memory/tree-verify.patch
# applied (the entry's default, tree_budget 0, is stock: its chain steps are stock's).
#
#   bash bench/gpu_tree.sh step      # 27B-class random target: AR and chain verify steps
#                                    # (stock's default layers) beside tree verify steps of
#                                    # budgets 8-64, compiled, from CUDA graphs (carry .whl);
#                                    # flags after `step` go to bench/step_27b.py (last wins:
#                                    # `step --preset smollm2-135m --ts 1,16,32` = the
#                                    # embedded default's shapes, random weights)
#   bash bench/gpu_tree.sh tests     # tests/gpu: the tree slot, graphs, compiled layers
#   bash bench/gpu_tree.sh tokens    # embedded default: AR, block chain and block trees of
#                                    # budgets 16 and 32, built on the device and on the host
#                                    # (-host), side by side, 20 dev requests x 128 tokens
#                                    # (MODES=... for others)
#                                    # (the GGUF staged: bench/stage.sh gguf; carry .whl)
#   bash bench/gpu_tree.sh --smoke   # CPU: the same staging, step_27b --smoke with trees
#
# Each part prints its table; JSON lands in $OUT.
set -u
cd "$(dirname "$0")/.." || exit 1
source bench/stage.sh
part=${1:-step}
OUT=${OUT:-$PWD}
[ "$part" = "--smoke" ] && [ "$OUT" = "$PWD" ] && OUT=$(mktemp -d /tmp/gpu-tree-smoke.XXXXXX)
if [ "$part" = "--smoke" ]; then stage bwrap >/dev/null; else stage wheels bwrap gguf || exit 1; fi
dir=$(mktemp -d /tmp/tree-verify.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
cp -a stock kernels specpilot training tests bench memory pyproject.toml "$dir/" \
    && cd "$dir" && git apply memory/tree-verify.patch \
    || { echo "gpu_tree: memory/tree-verify.patch did not apply"; exit 1; }
echo "gpu_tree: tree-verify applied in $dir"
export PYTHONPATH=$dir PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
case "$part" in
--smoke) python3 bench/step_27b.py --smoke --trees 8,16 --out "$OUT" ;;
step) python3 bench/step_27b.py --compile on --ts 1,8,16,32,64 --iters 20 \
          --variants fused_attn --trees 8,16,32,64 --out "$OUT" "${@:2}" ;;
tests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_tree.py \
           tests/gpu/test_graphs.py tests/gpu/test_compiled.py --tb=short 2>&1 \
           | tee "$OUT/tests.txt" | tail -60
       # the device tree build's kernel on CUDA (not the interpreter its file defaults to)
       TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider tests/test_tree_build.py \
           --tb=short 2>&1 | tee -a "$OUT/tests.txt" | tail -20 ;;
tokens) python3 bench/engine_tokens.py --per-category 4 --max-new 128 --out "$OUT" \
            --modes ${MODES:-ar,block,block-tree16,block-tree32,block-tree16-host,block-tree32-host} ;;
*) echo "gpu_tree: unknown part $part (step tests tokens --smoke)"; exit 2 ;;
esac
