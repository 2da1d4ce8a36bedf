"""Logit parity with transformers: the oracle for the model code."""

from __future__ import annotations

import pytest
import torch

from stock.config import PRESETS
from stock.model import Transformer


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _teacher_forced_ids(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def memoized_gguf():
    """The oracle's loader, minus its repeated work: transformers parses the GGUF file once
    for the config, once for the tensors and once for the tokenizer (49k vocabulary strings
    each time, seconds each here) and builds the gguf package's tensor-name map once per
    module of the model (397 times, about 6 s). Both are pure functions of their arguments
    (a read-only memory map; a table of names), so each is computed once in this module;
    what transformers does with them is unchanged."""
    import functools

    import gguf as gguf_pkg

    readers: dict = {}
    real_reader = gguf_pkg.GGUFReader

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_pkg, "GGUFReader", reader)
        mp.setattr(gguf_pkg, "get_tensor_name_map",
                   functools.lru_cache(maxsize=None)(gguf_pkg.get_tensor_name_map))
        yield


@pytest.mark.slow
def test_embedded_model_matches_transformers_gguf_loader(smol, memoized_gguf):
    from transformers import AutoModelForCausalLM

    from stock.weights import EMBEDDED_FILE, embedded_gguf

    gguf = embedded_gguf()
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=EMBEDDED_FILE,
                                               dtype=torch.float32).eval()
    text = " ".join(f"Step {i}: the value of x is {i * 7 % 13}." for i in range(80))
    ids = torch.tensor([smol.tokenizer.encode(text)[:512]])
    assert ids.shape[1] == 512
    with torch.inference_mode():
        want = ref(ids).logits
    model = smol.engine.model
    got = model(ids, model.new_cache(512), 0).logits
    assert _rel_err(got, want) <= 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_tiny_qwen3_matches_transformers(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = PRESETS["tiny-qwen3"]
    torch.manual_seed(0)
    ref = Qwen3ForCausalLM(Qwen3Config(**cfg.to_hf())).eval()
    ref.save_pretrained(tmp_path)
    model = Transformer.from_folder(tmp_path)
    assert model.cfg.qk_norm and model.cfg.arch == "qwen3"
    ids = _teacher_forced_ids(512, cfg.vocab_size)
    with torch.inference_mode():
        want = ref(ids).logits
    got = model(ids, model.new_cache(512), 0).logits
    assert _rel_err(got, want) <= 1e-4
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_tiny_qwen3_incremental_equals_one_shot(tmp_path):
    """Chunked forwards against the cache give the logits of one full forward."""
    model = Transformer.random(PRESETS["tiny-qwen3"], seed=1)
    ids = _teacher_forced_ids(40, 512, seed=2)
    full = model(ids, model.new_cache(64), 0).logits
    cache = model.new_cache(64)
    parts = []
    for s, e in ((0, 17), (17, 18), (18, 30), (30, 40)):
        parts.append(model(ids[:, s:e], cache, s).logits)
        cache.commit(e)
    assert _rel_err(torch.cat(parts, 1), full) <= 1e-5


def test_tokenizer_matches_transformers_chat_template(smol, memoized_gguf):
    from transformers import AutoTokenizer

    from stock.weights import EMBEDDED_FILE, embedded_gguf

    gguf = embedded_gguf()
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=EMBEDDED_FILE)
    msg = "Explain list comprehensions in Python, with two examples."
    want = ref.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True,
                                   tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert smol.tokenizer.chat(msg) == list(want)
