#!/bin/bash
# H200: A/A noise of stock, the cost model, the fused-rmsnorm entry through the controller,
# and tests/gpu. Wheels are installed into the image's own site-packages (controller workers
# start with a clean PYTHONPATH), the embedded GGUF is reassembled there too, and the repo
# travels as a git bundle (.gpub/repo.bundle) because the controller works from git objects.
#   bench/gpu_judges.sh embedded|27b
set -u
# The repository: gpu_repo (bench/gpu_lib.sh), after a staging call that ran gpu_repo_base
# when .gpub/repo.bundle is incremental (bench/NOTES.md "Running on the H200").
source bench/gpu_lib.sh && gpu_repo || exit 1
case "$1" in
embedded)
    python3 -c "from stock.weights import resolve; print(resolve('embedded'))" 2>&1 | tail -1
    python3 -m pytest -q tests/gpu 2>&1 | tail -3
    python3 -m specpilot compare stock stock --devices 0 --rounds 6 --requests 8 --max-new 64 \
        --json > "$OUT/aa_embedded.json"; echo "A/A embedded rc=$?"
    python3 -m specpilot compare stock refs/specpilot/entries/fused-rmsnorm --devices 0 \
        --opt-b rmsnorm_impl=fused --rounds 6 --requests 8 --max-new 64 --sigma "$(python3 -c \
        "import json; print(json.load(open('$OUT/aa_embedded.json'))['sigma'])")" \
        > "$OUT/fused_rmsnorm.txt" 2>&1; echo "fused-rmsnorm rc=$?"; cat "$OUT/fused_rmsnorm.txt"
    python3 -m specpilot analyze --device cuda --requests 4 --max-new 64 --json \
        > "$OUT/analyze_h200.json"; echo "analyze rc=$?"
    ;;
27b)
    python3 -m specpilot compare stock stock --model random:dense-27b --devices 0 --rounds 6 \
        --requests 4 --max-new 32 --json > "$OUT/aa_27b.json"; echo "A/A 27b rc=$?"
    ;;
esac
python3 - <<'PY'
import glob, json
for f in sorted(glob.glob(__import__("os").environ["OUT"] + "/aa_*.json")):
    r = json.load(open(f)); e = r["estimate"]
    print(f.split("/")[-1], "pairs", e["pairs"], "gain %+.3f%%" % (100 * e["gain"]),
          "lower %+.3f%%" % (100 * e["lower_bound"]), "sigma %.3f%%" % (100 * r["sigma"]),
          "verdict", r["decision"]["verdict"])
PY
