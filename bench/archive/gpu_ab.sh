#!/bin/bash
# Paired A/B of two checkouts of the stock system on one GPU, rounds A B B A, each run its
# own process (PYTHONPATH picks the checkout's stock/). Prints each run's summary line.
#   bench/gpu_ab.sh A_DIR B_DIR "B_OPTS" ROUNDS [gpu_stock.py args...]
# Example: bench/gpu_ab.sh . wt "--opt rmsnorm_impl=fused" 2 --prompts 8 --max-new 128
set -u
A=$(realpath "$1"); B=$(realpath "$2"); BOPTS=$3; ROUNDS=$4; shift 4; EXTRA=("$@")
here=$(dirname "$(realpath "$0")")
run() {  # name dir opts
    PYTHONPATH="$2:${PYTHONPATH:-}" python3 "$here/gpu_stock.py" $3 "${EXTRA[@]}" \
        --out "${OUT:-/tmp}/ab_$1_$r.json" > "${OUT:-/tmp}/ab_$1_$r.log" 2>&1 \
        || { echo "run $1 failed"; tail -5 "${OUT:-/tmp}/ab_$1_$r.log"; }
    echo "$1 round $r: $(grep -A3 '^mode' "${OUT:-/tmp}/ab_$1_$r.log" | tail -3 | tr -s ' ' | paste -sd'|')"
}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then run A "$A" "" "$@"; run B "$B" "$BOPTS" "$@";
    else run B "$B" "$BOPTS" "$@"; run A "$A" "" "$@"; fi
done
