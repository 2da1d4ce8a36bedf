# Sourced at the start of a device-tool command (the H200 image has torch, triton and
# transformers but not gguf, pydantic or gitpython; the embedded GGUF is 98 MB, over one
# call's 64 MiB, so it travels in parts, .gpu0/, .gpu1/, ... on one warm machine).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
source bench/gpu_lib.sh && gguf_assemble /tmp/site
