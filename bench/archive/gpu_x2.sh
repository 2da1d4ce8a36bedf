#!/bin/bash
# The two-GPU session (nvidia-h200-x2): one mode per call, calls back to back on one warm
# machine (issues 4, 6, 7, 8). Every call carries .whl and .gpub (since run 6's weights:
# git bundle create .gpub/repo.bundle --all ^gpu-base, after committing, and a first staging
# call carrying .gpub0 that runs gpu_repo_base); the embedded GGUF travels in parts parked in
# /tmp by earlier calls on the same machine (bench/NOTES.md "Running on the H200": with the
# shipped drafter weights in the tree, three staging calls carrying .gpu0, .gpu1, .gpu2 alone).
# The carry lists below are those of the two-half days. At most 8 files come back from a
# call: step logs go to one archive, $OUT/logs.tgz.
#
#   bash bench/gpu_x2.sh 27b SECONDS        # call 1 (carry .whl .gpub .gpu0)
#     devices   bench/gpu_devices.py: copy bandwidth and bf16 GEMM rate of each GPU, alone
#               and both at once
#     GPU 0+1   controller A/A of stock on random:dense-27b, side by side with swaps
#     GPU 1     then bench/gpu_w12.py --full (W12 kernels against cuBLAS) and bench/gpu_27b.py
#               --w12 (27B-class AR and verify steps: bf16, W12 gemm, gemv, auto)
#     GPU 0     at the same time: the same A/A on one GPU (A B B A), then weights=w12 (memory
#               entry w12-weights) against stock on one GPU
#     GPU 0+1   weights=w12 against stock side by side
#   bash bench/gpu_x2.sh embedded SECONDS   # call 2 (carry .whl .gpub .gpu1)
#     GPU 1     block-drafter training (training/, python -m training.block), weights to $OUT/block
#               and /tmp/block
#     GPU 0     at the same time: embedded A/A on one GPU (A B B A), analyze on CUDA, AR and
#               n-gram with and without CUDA graphs (bench/gpu_stock.py), tests/gpu
#   bash bench/gpu_x2.sh pair SECONDS       # after `embedded` or with .gpu1 after a .gpu0 call
#     GPU 0+1   embedded A/A side by side; a known gain (n-gram drafter against AR) side by
#               side, then on one GPU (A B B A); specpilot explore, one sub-agent per GPU
#   bash bench/gpu_x2.sh embedded2 SECONDS  # like `embedded` (carry .gpu1): GPU 1 trains and
#               reads τ (block with graphs, block-eager, n-gram); GPU 0 runs explore to validation
#   bash bench/gpu_x2.sh w12 SECONDS        # W12 27B end to end, kernels, controller verdicts
#               on one GPU and on two (carry .gpu0 if an embedded call follows)
#   bash bench/gpu_x2.sh final SECONDS      # shipped drafter (default weights) and tests/gpu on
#               GPU 1, the w12-weights entry through the controller on GPU 0
#   bash bench/gpu_x2.sh 27b2 SECONDS       # the two-GPU steps of `27b` alone
#   bash bench/gpu_x2.sh train SECONDS      # block-drafter retraining experiment (GGUF staged)
#   bash bench/gpu_x2.sh w12ptx 580         # W12 with the PTX pair decode (no GGUF needed):
#     GPU 1     tests/gpu W12 and graph tests, 27B end to end with --profile, kernels --full
#     GPU 0     the GEMV sweep, then the w12-weights entry through the controller (27B)
#   bash bench/gpu_x2.sh train2 560         # block drafter on ~3x the answers (GGUF staged):
#     GPU 0+1   each answers half of the corpus (--prompt-shard 0/2, 1/2) into /tmp/data0.pt,
#               /tmp/data1.pt (--data-out), both done by ~250 s
#     GPU 0     then trains on both (--data-in, --features live) from the shipped weights
#               (--init-from-weights) until the call's deadline; weights to /tmp/block and
#               $OUT/block. GPU 1 is left free after answering. Overrides: TRAIN2_PROMPTS,
#               TRAIN2_GEN_BATCH, TRAIN2_GEN_S, TRAIN2_ARGS (training flags)
#   bash bench/gpu_x2.sh w12g 380           # W12 tuned in CUDA graphs: tests, 27B, kernels, verdict
#   bash bench/gpu_x2.sh w8tab 200          # kernel table with W8 tuned on its own; W12 GPU tests
#   bash bench/gpu_x2.sh w12tab 260         # gpu_w12.py --full alone (GPU 1); 27B --profile (GPU 0)
#   bash bench/gpu_x2.sh tau2 430           # after train2/train2w, warm: τ of /tmp/block and of
#               the shipped weights (2 dev requests a category, GPU 1); tests/gpu (GPU 0)
#   bash bench/gpu_x2.sh train2w 570        # train2, and GPU 1 after answering: the W12 27B
#               step (bench/gpu_27b.py --w12) and the w12-weights entry through the controller
#   bash bench/gpu_x2.sh compile 560        # stock compiled (27B eager vs compiled, bf16 and W12;
#               tests/gpu; the W12 verdict with both systems compiled). Modes above this one
#               predate the `compile` option (on by default since): they now compile too
#   bash bench/gpu_x2.sh compile2 330       # `compile` again after the W12 dynamic buffers
#   bash bench/gpu_x2.sh w12swap 470        # the swapped GEMV in the shared K order: W12 GPU
#               tests and the verdict (GPU 0); 27B, kernels and a sweep of M = 4, 16, 64 (GPU 1)
#   bash bench/gpu_x2.sh groups 560         # W12 groups: W12 GPU tests, 27B bf16 against W12
#               with and without groups (GPU 1); the W12 verdict serving AR, then n-gram (GPU 0)
#   bash bench/gpu_x2.sh groupsctl 560      # the two verdicts of `groups` alone
#   bash bench/gpu_x2.sh engab 460          # the verdict's two systems in one process: per
#               request prefill and decode split (bench/gpu_engine_ab.py), AR and n-gram
#   bash bench/gpu_x2.sh engabctl 580       # engab, then the two verdicts, on one GPU
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/bench/gpu_lib.sh"
mode=${1:?27b, embedded or pair}
gpu_begin "${2:-540}"
export LOGDIR=/tmp/steplogs-$mode-$(date +%H%M%S); mkdir -p "$LOGDIR"
cd "$here" && gpu_repo || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CMP="python3 -m specpilot compare"
summary() {
    python3 - "$@" <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        r = json.load(open(f))
    except (OSError, ValueError) as exc:
        print(f"{f.split('/')[-1]}: no report ({exc.__class__.__name__})"); continue
    e, d, p = r["estimate"], r["decision"], r["paired"]
    print(f"{f.split('/')[-1]}: {r['mode']} on {','.join(r['devices'])}, pairs {e['pairs']}, "
          f"gain {100 * e['gain']:+.3f}%, lower {100 * e['lower_bound']:+.3f}% ({e['method']}), "
          f"sigma {100 * r['sigma']:.3f}% ({r['sigma_source']}), se(log ratio) "
          f"{e['se_log_ratio']:.4f} ({e['df']} df), threshold {100 * d['threshold']:.2f}%, "
          f"{d['verdict']}; measured rounds {sum(p.get('round_wall_s') or [0]):.1f} s")
PY
}
train_block_here() {  # the shipped drafter's training command, weights to /tmp/block, $OUT/block
    rm -rf /tmp/block
    step train_block 445 python3 -m training.block --out /tmp/block --seed 0 \
        --device cuda --init-from-target last --prompts 24000 --summaries 2048 --max-new 192 \
        --gen-batch 2048 --feat-batch 512 --steps 8000 --batch 64 --anchors 16 \
        --gen-seconds 150 --total-seconds 420 --val-every 500
    mkdir -p "$OUT/block" && cp /tmp/block/* "$OUT/block/" 2>/dev/null
}
w12_verdict() {  # NAME SECONDS DEVICES: the w12-weights entry against stock on the 27B-class
    # random target through the controller; the report goes to $OUT/NAME.json
    step "$1" "$2" bash -c "$CMP stock refs/specpilot/entries/w12-weights --opt-b weights=w12 \
        --model random:dense-27b --devices $3 --rounds 6 --requests 4 --max-new 32 --json \
        > $OUT/$1.json"
}
explore_on() {  # DEVICES ('"0", "1"') SECONDS: specpilot explore, one sub-agent per GPU
    cat >> .specpilot/config.toml <<TOML

[explore]
devices = [$1]
max_directions = 2
analyze_requests = 2
analyze_max_new = 32
prescreen_requests = 2
prescreen_max_new = 64
gate_requests = 2
gate_length = 128
controller_rounds = 4
controller_requests = 4
controller_max_new = 64
validate_requests = 2
validate_length = 256
kernel_categories = 0
TOML
    python3 -m specpilot init > "$LOGDIR/init.log" 2>&1 || tail -5 "$LOGDIR/init.log"
    TAIL=30 step explore "$2" python3 -m specpilot explore --json
    python3 - <<'PY' 2>&1 | tee "$OUT/explore_record.txt"
import glob, json, os
runs = sorted(glob.glob(".specpilot/runs/run-*/state.json"), key=os.path.getmtime)
if not runs:
    raise SystemExit("no run record")
s = json.load(open(runs[-1]))
print(runs[-1], "phase", s["phase"], "validation", (s.get("validation") or {}).get("passed"))
t0 = min((d.get("started") or 9e18) for d in s["directions"]) if s["directions"] else 0
for d in s["directions"]:
    st, fin = d.get("started"), d.get("finished")
    span = f"{st - t0:7.1f}-{(fin or 0) - t0:7.1f} s" if st else "not started"
    print(f"{d['direction']['id']:<28} {d.get('device')} {d['status']:<18} {span}")
    for x in d.get("timeline", []):
        print(f"    {x['step']:<11} {x['start'] - t0:7.1f}-{x['end'] - t0:7.1f} s")
    print("    " + "; ".join(d.get("reasons", [])[-2:])[:300])
PY
    cp "$(ls -t .specpilot/runs/run-*/state.json | head -1)" "$OUT/explore_state.json" 2>/dev/null
}
case "$mode" in
27b)
    step devices 60 python3 bench/gpu_devices.py --out "$OUT"
    step aa27_2gpu 130 bash -c "$CMP stock stock --model random:dense-27b --devices 0,1 \
        --rounds 6 --requests 4 --max-new 32 --json > $OUT/aa27_2gpu.json"
    ( export CUDA_VISIBLE_DEVICES=1
      step w12 120 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 100
      step b27 170 python3 bench/gpu_27b.py --out "$OUT" --w12 --iters 20 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    step aa27_1gpu 130 bash -c "$CMP stock stock --model random:dense-27b --devices 0 \
        --rounds 6 --requests 4 --max-new 32 --json > $OUT/aa27_1gpu.json"
    w12_verdict w12_27b_1gpu 150 0
    wait; cat "$LOGDIR/gpu1.txt"
    w12_verdict w12_27b_2gpu 150 0,1
    summary "$OUT"/aa27_1gpu.json "$OUT"/aa27_2gpu.json "$OUT"/w12_27b_1gpu.json \
        "$OUT"/w12_27b_2gpu.json
    ;;
embedded)
    python3 -c "from stock.weights import resolve; print('embedded at', resolve('embedded'))" \
        2>&1 | tail -1
    ( export CUDA_VISIBLE_DEVICES=1
      train_block_here
      TAIL=16 step tau_check 90 python3 bench/gpu_block.py --weights /tmp/block \
        --per-category 1 --max-new 128 --no-ar --no-force --also block-eager \
        ) > "$LOGDIR/gpu1.txt" 2>&1 &
    export CUDA_VISIBLE_DEVICES=0
    step aa_emb_1gpu 110 bash -c "$CMP stock stock --devices 0 --rounds 6 --requests 8 \
        --max-new 64 --json > $OUT/aa_emb_1gpu.json"
    step analyze 90 bash -c "python3 -m specpilot analyze --device cuda --requests 4 \
        --max-new 64 --json > $OUT/analyze_h200.json; python3 -m specpilot analyze \
        --device cuda --requests 4 --max-new 64 2>&1 | tail -20"
    step stock_graphs 120 python3 bench/gpu_stock.py --graphs both --prompts 8 --max-new 128 \
        --drafters ngram --out "$OUT/gpu_stock_graphs.json"
    step gputests 120 python3 -m pytest -q -x tests/gpu
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/aa_emb_1gpu.json
    ;;
27b2)   # the two-GPU half of `27b` alone (a re-run after a fix)
    step aa27_2gpu 150 bash -c "$CMP stock stock --model random:dense-27b --devices 0,1 \
        --rounds 6 --requests 4 --max-new 32 --json > $OUT/aa27_2gpu.json"
    step aa27_1gpu 130 bash -c "$CMP stock stock --model random:dense-27b --devices 0 \
        --rounds 6 --requests 4 --max-new 32 --json > $OUT/aa27_1gpu.json"
    w12_verdict w12_27b_2gpu 170 0,1
    summary "$OUT"/aa27_2gpu.json "$OUT"/aa27_1gpu.json "$OUT"/w12_27b_2gpu.json
    ;;
pair)
    # a known real gain: the n-gram drafter against none (AR), both with CUDA graphs
    known="--drafter-a ar --drafter-b ngram"
    step aa_emb_2gpu 100 bash -c "$CMP stock stock --devices 0,1 --rounds 6 --requests 8 \
        --max-new 64 --json > $OUT/aa_emb_2gpu.json"
    step aa_emb_1gpu 100 bash -c "$CMP stock stock --devices 0 --rounds 6 --requests 8 \
        --max-new 64 --json > $OUT/aa_emb_1gpu.json"
    sigma_of() { python3 -c "import json; print(json.load(open('$OUT/$1.json'))['sigma'])" \
                 2>/dev/null || echo 0.01; }
    # σ: the A/A of stock (n-gram drafter) by the same procedure, given explicitly (the
    # cached A/A is keyed by A's drafter, here AR)
    step ngram_2gpu 100 bash -c "$CMP stock stock $known --sigma $(sigma_of aa_emb_2gpu) \
        --devices 0,1 --rounds 6 --requests 8 --max-new 64 --json > $OUT/ngram_2gpu.json"
    step ngram_1gpu 100 bash -c "$CMP stock stock $known --sigma $(sigma_of aa_emb_1gpu) \
        --devices 0 --rounds 6 --requests 8 --max-new 64 --json > $OUT/ngram_1gpu.json"
    explore_on '"0", "1"' 280
    summary "$OUT"/aa_emb_2gpu.json "$OUT"/aa_emb_1gpu.json "$OUT"/ngram_2gpu.json \
        "$OUT"/ngram_1gpu.json
    ;;
w12)  # W12 with the swept candidates: 27B end to end and kernels on GPU 1; controller verdicts
    ( export CUDA_VISIBLE_DEVICES=1
      step b27 160 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --iters 20 --profile
      step w12 140 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 120 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    w12_verdict w12_27b_1gpu 180 0
    step gputests_w12 150 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py tests/gpu/test_graphs.py
    wait; cat "$LOGDIR/gpu1.txt"
    [ "${W12_TWO_GPU:-0}" = 1 ] && w12_verdict w12_27b_2gpu 170 0,1
    summary "$OUT"/w12_27b_1gpu.json
    ;;
embedded2)  # GPU 1 trains the block drafter and reads τ (forcing check on); GPU 0: explore
    ( export CUDA_VISIBLE_DEVICES=1
      train_block_here
      TAIL=22 step tau_check 110 python3 bench/gpu_block.py --weights /tmp/block \
        --per-category 1 --max-new 128 --also block-eager,ngram --out "$OUT" \
        ) > "$LOGDIR/gpu1.txt" 2>&1 &
    export CUDA_VISIBLE_DEVICES=0
    explore_on '"0"' 450
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
final)  # after staging calls that carried .gpu0, .gpu1, .gpu2 alone (the shipped weights
    # leave no room for GGUF parts beside the bundle): the shipped drafter by default on GPU 1,
    # the rebased w12-weights entry through the controller on GPU 0
    ( export CUDA_VISIBLE_DEVICES=1
      step gputests 170 python3 -m pytest -q -x tests/gpu
      TAIL=22 step shipped 130 python3 bench/gpu_block.py --per-category 1 --max-new 128 \
        --also block-eager,ngram --out "$OUT" ) > "$LOGDIR/gpu1.txt" 2>&1 &
    w12_verdict w12_27b_1gpu 200 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
train)  # block drafter retraining experiment on GPU 0 (the GGUF staged by an earlier call)
    export CUDA_VISIBLE_DEVICES=0
    rm -rf /tmp/block2
    step train_block2 "${TRAIN_S:-445}" python3 -m training.block --out /tmp/block2 \
        --seed 0 --device cuda ${TRAIN_ARGS:---init-from-target last --prompts 24000 \
        --summaries 2048 --steps 8000} --max-new 192 --gen-batch 2048 --feat-batch 512 \
        --batch 64 --anchors 16 --gen-seconds 150 --total-seconds 420 --val-every 500
    TAIL=16 step tau_check2 80 python3 bench/gpu_block.py --weights /tmp/block2 \
        --per-category 1 --max-new 128 --no-ar --no-force --also block-eager
    ;;
w12ptx)  # the PTX pair decode: correctness first, then kernels, sweep, 27B end to end, verdict
    ( export CUDA_VISIBLE_DEVICES=1
      step gputests_w12 120 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py tests/gpu/test_graphs.py
      step b27 160 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --iters 20 --profile
      step w12 150 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 120 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    step sweep 260 python3 bench/gpu_w12_sweep.py --out "$OUT" --budget-s 220
    w12_verdict w12_27b_1gpu 200 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
w12g)  # the tuner timing in CUDA graphs: GPU tests first, 27B end to end, kernels, verdict
    ( export CUDA_VISIBLE_DEVICES=1
      step b27 120 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --ts 1,8,16 \
        --iters 20
      step w12 130 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 100 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    step gputests_w12 150 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py tests/gpu/test_graphs.py
    w12_verdict w12_27b_1gpu 190 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
w12swap)  # the swapped GEMV in the shared K order: GPU tests, 27B end to end, kernels, a
    # sweep of the M > 1 tiles (GPU 1); verdict (GPU 0)
    ( export CUDA_VISIBLE_DEVICES=1
      step b27 120 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --ts 1,8,16 \
        --iters 20
      step w12 130 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 100
      step sweep 170 python3 bench/gpu_w12_sweep.py --out "$OUT" --ms 4,16,64 --shapes e2e \
        --budget-s 150 ) > "$LOGDIR/gpu1.txt" 2>&1 &
    step gputests_w12 150 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py tests/gpu/test_graphs.py
    w12_verdict w12_27b_1gpu 200 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
ncu)  # where the swapped GEMV's time goes: Nsight Compute on GPU 0 (M = 16 and M = 1, two
    # shapes); the W12 GPU tests with the M = 17..64 candidates on GPU 1
    ( export CUDA_VISIBLE_DEVICES=1
      [ -z "${NCU_ONLY:-}" ] && step gputests_w12 150 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy"
    NCU="$NCU --section LaunchStats --section WarpStateStats --section SchedulerStats"
    NCU="$NCU --section MemoryWorkloadAnalysis -k regex:_w12_gemv_kernel --launch-count 8"
    for shape in 17408x5120 5120x34816; do
        for m in 16 1; do
            TAIL=8 step "ncu_${shape}_m$m" 120 bash -c "$NCU python3 bench/w12_ncu.py \
                --shape $shape --m $m --reps 2 > $OUT/ncu_${shape}_m$m.txt 2>&1; \
                grep -E 'w12_gemv_kernel|Duration|Throughput|Occupancy|Registers|Stall|Warp Cycles|Issued|Eligible|No Eligible|Block Limit|Shared Memory Config|Dynamic Shared' $OUT/ncu_${shape}_m$m.txt | head -120"
        done
    done
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
ncu2)  # stall reasons of every M = 16 candidate on 17408x5120 (GPU 0)
    NCU="ncu --clock-control none --section Occupancy --section LaunchStats --section WarpStateStats"
    NCU="$NCU --section SourceCounters --print-details all -k regex:_w12_gemv_kernel"
    TAIL=8 step ncu2 150 bash -c "$NCU python3 bench/w12_ncu.py --shape 17408x5120 --m 16 --all \
        --reps 0 > $OUT/ncu2.txt 2>&1"
    ;;
w12reg)  # the M = 4 and 16 candidates under register caps (GPU 1: M = 4, GPU 0: M = 16)
    mkdir -p "$OUT/m4" "$OUT/m16"
    ( export CUDA_VISIBLE_DEVICES=1
      TAIL=12 step sweep4 230 python3 bench/gpu_w12_sweep.py --out "$OUT/m4" --ms 4 --shapes e2e \
        --maxnreg 168,128 --workers 8 --budget-s 200 ) > "$LOGDIR/gpu1.txt" 2>&1 &
    TAIL=12 step sweep16 230 python3 bench/gpu_w12_sweep.py --out "$OUT/m16" --ms 16 --shapes e2e \
        --maxnreg 168,128 --workers 8 --budget-s 200
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
compile)  # stock's `compile` option (on by default): 27B eager against compiled, bf16 and
    # W12 (GPU 1); tests/gpu and the w12-weights entry through the controller, both systems
    # compiled (GPU 0)
    ( export CUDA_VISIBLE_DEVICES=1
      TAIL=40 step b27c 330 python3 bench/gpu_27b.py --out "$OUT" --compile both --ts 1,8,16 \
        --iters 20 --w12 --w12-kernels gemv --w12-compiled ) > "$LOGDIR/gpu1.txt" 2>&1 &
    step gputests 240 python3 -m pytest -q tests/gpu
    w12_verdict w12_27b_1gpu 300 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
compile2)  # after the W12 exception lists became dynamic: 27B eager against compiled, bf16
    # and W12 (GPU 1); the W12 verdict, both systems compiled (GPU 0)
    ( export CUDA_VISIBLE_DEVICES=1
      TAIL=30 step b27c 240 python3 bench/gpu_27b.py --out "$OUT" --compile both --ts 1,8,16 \
        --iters 20 --w12 --w12-kernels gemv --w12-compiled ) > "$LOGDIR/gpu1.txt" 2>&1 &
    w12_verdict w12_27b_1gpu 270 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_1gpu.json
    ;;
w8tab)  # the W8 view tuned on its own: kernel table on GPU 1, W12 GPU tests on GPU 0
    ( export CUDA_VISIBLE_DEVICES=1
      step w12 150 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 100 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    step gputests_w12 150 python3 -m pytest -q -x tests/gpu/test_gpu_w12.py
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
w12tab)  # the W12 kernel table alone on GPU 1; the 27B step split by kernel on GPU 0
    ( export CUDA_VISIBLE_DEVICES=1
      step w12 200 python3 bench/gpu_w12.py --out "$OUT" --full --budget-s 170 ) \
        > "$LOGDIR/gpu1.txt" 2>&1 &
    step b27 200 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --ts 1,16 \
        --iters 20 --profile
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
tau2)  # right after train2/train2w on the warm machine: τ of /tmp/block beside the shipped
    # weights (GPU 1), tests/gpu with the PTX decode (GPU 0)
    ( export CUDA_VISIBLE_DEVICES=1
      TAIL=22 step tau_new 200 python3 bench/gpu_block.py --weights /tmp/block --per-category 2 \
        --max-new 128 --also ngram --out "$OUT"
      TAIL=22 step tau_shipped 200 python3 bench/gpu_block.py --per-category 2 --max-new 128 \
        --no-ar ) > "$LOGDIR/gpu1.txt" 2>&1 &
    step gputests 300 python3 -m pytest -q -x tests/gpu
    wait; cat "$LOGDIR/gpu1.txt"
    ;;
train2|train2w)  # block drafter on ~3x run 4's answers: two GPUs answer, GPU 0 trains (GGUF
    # staged); train2w: GPU 1 then runs the W12 27B step and the w12-weights verdict
    answer_half() {  # I: answer shard I/2 of the corpus on the visible GPU into /tmp/dataI.pt
        rm -f "/tmp/data$1.pt"
        step "answer$1" 270 python3 -m training.block --seed 0 --device cuda \
            --prompts "${TRAIN2_PROMPTS:-160000}" --prompt-shard "$1/2" --summaries 2048 \
            --max-new 192 --gen-batch "${TRAIN2_GEN_BATCH:-4096}" \
            --gen-seconds "${TRAIN2_GEN_S:-150}" --data-out "/tmp/data$1.pt"
    }
    rm -f /tmp/answer1.done
    ( export CUDA_VISIBLE_DEVICES=1; answer_half 1; touch /tmp/answer1.done
      if [ "$mode" = train2w ]; then
        step b27 120 python3 bench/gpu_27b.py --out "$OUT" --w12 --w12-kernels gemv --ts 1,8,16 \
            --iters 20
        w12_verdict w12_27b_1gpu 200 0
      fi ) > "$LOGDIR/gpu1.txt" 2>&1 &
    ( export CUDA_VISIBLE_DEVICES=0; answer_half 0 )
    while [ ! -e /tmp/answer1.done ] && [ "$(left)" -gt 60 ]; do sleep 2; done
    files=$(ls /tmp/data0.pt /tmp/data1.pt 2>/dev/null | paste -sd, -)
    if [ -z "$files" ]; then echo "train2: no data file was written"; else
        export CUDA_VISIBLE_DEVICES=0
        rm -rf /tmp/block
        # the whole training command ends ~25 s before the call's deadline (imports and
        # the process start are outside --total-seconds)
        ts=$(( $(left) - 25 ))
        TAIL=30 step train_block2x "$(( ts + 15 ))" python3 -m training.block \
            --out /tmp/block --seed 0 --device cuda --data-in "$files" --features live \
            --max-new 192 --total-seconds "$ts" ${TRAIN2_ARGS:---init-from-weights \
            stock/drafters/weights/embedded --lr 3e-4 --warmup 200 --steps 20000 --batch 64 \
            --anchors 16 --val-every 500}
        mkdir -p "$OUT/block" && cp /tmp/block/* "$OUT/block/" 2>/dev/null
    fi
    wait; cat "$LOGDIR/gpu1.txt"
    [ "$mode" = train2w ] && summary "$OUT"/w12_27b_1gpu.json
    ;;
groups)  # W12 groups (q/k/v and gate/up as one GEMV each, kernels/w12/linear.py): W12 GPU
    # tests, then the 27B step, bf16 with stock's defaults against W12 compiled with and
    # without groups (GPU 1); the w12-weights entry through the controller on the 27B target
    # serving AR, then with the configured n-gram drafter (GPU 0)
    ( export CUDA_VISIBLE_DEVICES=1
      step gputests_w12 150 python3 -m pytest -q tests/gpu/test_gpu_w12.py
      TAIL=45 step b27g 400 python3 bench/gpu_27b.py --out "$OUT" --compile on --ts 1,16 \
        --iters 20 --variants fused_attn --w12 --w12-kernels gemv --w12-compiled \
        --w12-unfused ) > "$LOGDIR/gpu1.txt" 2>&1 &
    step w12_27b_ar 270 bash -c "$CMP stock refs/specpilot/entries/w12-weights \
        --opt-b weights=w12 --model random:dense-27b --devices 0 --rounds 6 --requests 4 \
        --max-new 32 --drafter-a ar --json > $OUT/w12_27b_ar.json"
    w12_verdict w12_27b_ngram 270 0
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_ar.json "$OUT"/w12_27b_ngram.json
    ;;
groupsctl)  # the two verdicts of `groups`: AR serving (GPU 0), n-gram (GPU 1 beside it, or
    # after it on GPU 0 when the machine has one GPU)
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        ( w12_verdict w12_27b_ngram 420 1 ) > "$LOGDIR/gpu1.txt" 2>&1 &
    fi
    step w12_27b_ar 420 bash -c "$CMP stock refs/specpilot/entries/w12-weights \
        --opt-b weights=w12 --model random:dense-27b --devices 0 --rounds 6 --requests 4 \
        --max-new 32 --drafter-a ar --json > $OUT/w12_27b_ar.json"
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || w12_verdict w12_27b_ngram 420 0 > "$LOGDIR/gpu1.txt" 2>&1
    wait; cat "$LOGDIR/gpu1.txt"
    summary "$OUT"/w12_27b_ar.json "$OUT"/w12_27b_ngram.json
    ;;
engab)  # the controller's two 27B systems (stock, weights=w12) in one process on GPU 0: each
    # request split into prefill and decode steps (bench/gpu_engine_ab.py), AR and n-gram
    rm -rf /tmp/w12tree; git worktree prune
    git worktree add -f -q --detach /tmp/w12tree refs/specpilot/entries/w12-weights || exit 1
    TAIL=20 step engab 420 env PYTHONPATH=/tmp/w12tree python3 bench/gpu_engine_ab.py \
        --model random:dense-27b --opt-b weights=w12 --drafters ar,ngram --rounds 4 --out "$OUT"
    ;;
engabctl)  # engab, then the two verdicts of groupsctl (one GPU)
    rm -rf /tmp/w12tree; git worktree prune
    git worktree add -f -q --detach /tmp/w12tree refs/specpilot/entries/w12-weights || exit 1
    TAIL=20 step engab 200 env PYTHONPATH=/tmp/w12tree python3 bench/gpu_engine_ab.py \
        --model random:dense-27b --opt-b weights=w12 --drafters ar,ngram --rounds 4 --out "$OUT"
    step w12_27b_ar 200 bash -c "$CMP stock refs/specpilot/entries/w12-weights \
        --opt-b weights=w12 --model random:dense-27b --devices 0 --rounds 6 --requests 4 \
        --max-new 32 --drafter-a ar --json > $OUT/w12_27b_ar.json"
    w12_verdict w12_27b_ngram 200 0
    summary "$OUT"/w12_27b_ar.json "$OUT"/w12_27b_ngram.json
    ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
# at most 8 files come back from a call: the step logs and the controller's own logs of
# this call travel as one archive
[ "$LOGDIR" != "$OUT" ] && tar czf "$OUT/logs.tgz" -C / "${LOGDIR#/}" \
    $(find .specpilot/runs -maxdepth 1 -newer "$LOGDIR" 2>/dev/null | sed 's|^|tmp/repo/|') \
    2>/dev/null
echo "call done at $(date +%T), $(left) s of the budget left"
