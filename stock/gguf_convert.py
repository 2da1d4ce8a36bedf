"""GGUF -> Hugging Face-style folder (config.json, model.safetensors, tokenizer.json).

Converted once into the user cache, keyed by the file's content (a second venv or a copy
elsewhere finds the same conversion); later loads read the safetensors file directly.
Quantized tensors are dequantized with the `gguf` package to fp32 (Q4/Q8 values are exact
in fp32). llama.cpp stores q/k projections permuted for its RoPE layout; we undo that.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from stock.config import ModelConfig
from stock.errors import StockError

GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TO_HF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
CONVERTER_VERSION = 1


class GGUFError(StockError):
    """The file is not a GGUF model this engine can read."""


def cache_root() -> Path:
    base = os.environ.get("SPECPILOT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specpilot")
    return Path(base) / "models"


SAMPLE = 1 << 20   # bytes hashed at each of five places of the file


def content_key(gguf_path: Path) -> str:
    """The file's size and a hash of five 1 MiB samples (its start, where the header and
    metadata are, its end, and three places between): the same model copied to another
    venv, path or mtime has the same key, and hashing a 15 GB file does not read 15 GB."""
    size = gguf_path.stat().st_size
    h = hashlib.sha256(f"{size}|v{CONVERTER_VERSION}".encode())
    with open(gguf_path, "rb") as f:
        for at in sorted({0, size // 4, size // 2, 3 * size // 4, max(0, size - SAMPLE)}):
            f.seek(at)
            h.update(f.read(SAMPLE))
    return h.hexdigest()[:16]


def cache_dir_for(gguf_path: Path) -> Path:
    """Where the converted folder lives: keyed by the file's content (content_key), not
    its path."""
    return cache_root() / f"{gguf_path.stem}-{content_key(gguf_path)}"


def _hf_name(name: str) -> str:
    if name in GGUF_TO_HF:
        return GGUF_TO_HF[name]
    parts = name.split(".")
    if parts[0] != "blk" or len(parts) != 4 or parts[2] not in BLOCK_TO_HF:
        raise GGUFError(f"unexpected tensor {name!r}")
    return f"model.layers.{parts[1]}.{BLOCK_TO_HF[parts[2]]}.{parts[3]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved -> half-split rotary layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen3"):
        raise GGUFError(f"unsupported GGUF architecture {arch!r}")
    g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        arch=arch,
        vocab_size=int(g("vocab_size", len(_field(reader, "tokenizer.ggml.tokens", [])))),
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=int(g("attention.key_length", hidden // heads)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position=int(g("context_length", 4096)),
        tie_embeddings="output.weight" not in names,
        qk_norm=arch == "qwen3",
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=[] if eos is None else [int(eos)],
    )


def _open(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises assorted errors on bad bytes
        raise GGUFError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write an HF-style folder for `gguf_path` into `out_dir` atomically; return it."""
    import gguf
    from safetensors.torch import save_file

    reader = _open(gguf_path)
    cfg = read_config(reader)
    print(f"converting {gguf_path.name} once into {out_dir} (about 20 s on a CPU)...",
          file=sys.stderr, flush=True)
    tensors = {}
    for t in reader.tensors:
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise GGUFError(f"{gguf_path}: cannot decode tensor {t.name}: {exc}") from exc
        name = _hf_name(t.name)
        if cfg.arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            n = cfg.num_heads if "attn_q" in t.name else cfg.num_kv_heads
            arr = _unpermute(arr, n)
        tensors[name] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1))
        cfg.save(tmp)
        _write_tokenizer(gguf_path, reader, tmp)
        publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def publish(tmp: Path, out_dir: Path) -> None:
    """Move a finished conversion `tmp` to `out_dir` in one rename. A folder already there
    without model.safetensors is a stale partial one and is replaced; a complete one was
    written by another process converting the same file at the same time (two workers on a
    fresh machine): it is kept, with the same bytes, and tmp is dropped."""
    done = out_dir / "model.safetensors"
    if out_dir.exists() and not done.is_file():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:
        if not done.is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _write_tokenizer(gguf_path: Path, reader, folder: Path) -> None:
    """tokenizer.json via transformers' GGUF tokenizer conversion; the chat template verbatim."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.backend_tokenizer.save(str(folder / "tokenizer.json"))
    meta = {
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    }
    (folder / "specpilot_tokenizer.json").write_text(json.dumps(meta, indent=1))


def ensure_converted(gguf_path: Path) -> Path:
    out = cache_dir_for(gguf_path)
    if (out / "model.safetensors").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return convert(gguf_path, out)
