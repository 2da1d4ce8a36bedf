"""A tiny Hugging Face-style model folder, built in a tmp folder in well under a second:
config.json (the tiny-qwen3 preset), model.safetensors (random weights) and a word-level
tokenizer.json whose 512 ids match the model's vocabulary. Load it with
`load_system(str(folder), device="cpu")`; break a copy of it to test bad model input.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

WEIGHTS = "model.safetensors"
NORM = "model.norm.weight"   # a small tensor every model has


def build(folder: Path) -> Path:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    from stock.config import PRESETS
    from stock.model import Transformer

    cfg = PRESETS["tiny-qwen3"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1))
    net = Transformer.random(cfg, seed=0)
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()},
              str(folder / WEIGHTS))
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, cfg.vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def copy(good: Path, dest: Path) -> Path:
    shutil.copytree(good, dest)
    return dest


def edit_config(folder: Path, change) -> None:
    """config.json replaced by change(its dict) (a dict, or anything JSON can hold)."""
    path = folder / "config.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def edit_weights(folder: Path, name: str, tensor: torch.Tensor) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / WEIGHTS))
    state[name] = tensor
    save_file(state, str(folder / WEIGHTS))
