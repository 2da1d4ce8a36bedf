"""The W12 on-disk format (version 1) and the converter/stats behind `specpilot w12`.

A converted model is a folder like the Hugging Face source: every non-safetensors file is
copied as is, and each ``*.safetensors`` file is rewritten under the same name with

- each converted weight ``NAME`` (a 2-D floating ``*.weight`` that is not an embedding)
  replaced by five tensors ``NAME.w12.hi`` (uint8 [N, Kp]), ``NAME.w12.lo`` (uint8
  [N, Kp/2]), ``NAME.w12.base`` (uint8 [N]), ``NAME.w12.exc_idx`` (int32/int64 [E]) and
  ``NAME.w12.exc_val`` (int16 [E]) — the planes of kernels/w12/format.py;
- every other tensor unchanged;
- safetensors metadata ``{"format": "w12", "w12": <W12Manifest JSON>}``: format name,
  version, and per converted weight its shape, stored dtype (bfloat16) and source dtype.

Weights stored in another dtype than bf16 are rounded to bf16 when converted (the format
is lossless for bf16); the manifest's ``source_dtype`` says so for each weight.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from kernels.w12.format import FORMAT, VERSION, W12Error, W12Tensor, encode

PARTS = ("hi", "lo", "base", "exc_idx", "exc_val")
EMBEDDING_MARKERS = ("embed", "wte", "wpe", "position_embeddings", "token_type")


class TensorEntry(BaseModel):
    shape: list[int]
    dtype: str = "bfloat16"
    source_dtype: str


class W12Manifest(BaseModel):
    format: str = FORMAT
    version: int = VERSION
    tensors: dict[str, TensorEntry] = Field(default_factory=dict)


class LayerStats(BaseModel):
    name: str
    shape: list[int]
    params: int
    bytes: int
    exceptions: int
    bits_per_param: float
    exception_rate: float
    source_dtype: str


class ModelStats(BaseModel):
    model: str
    stored_w12: bool      # read from a converted folder (else encoded on the fly)
    layers: list[LayerStats]
    params: int
    bytes: int
    bytes_bf16: int
    exceptions: int
    bits_per_param: float
    exception_rate: float


def is_linear_weight(name: str, t: torch.Tensor) -> bool:
    return (t.dim() == 2 and t.is_floating_point() and name.endswith("weight")
            and not any(m in name for m in EMBEDDING_MARKERS))


def _files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise W12Error(f"{folder}: not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise W12Error(f"{folder}: no *.safetensors files")
    return files


def read_manifest(path: Path) -> W12Manifest | None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        return None
    manifest = W12Manifest.model_validate_json(meta["w12"])
    if manifest.version != VERSION:
        raise W12Error(f"{path}: W12 format version {manifest.version}; this code reads "
                       f"version {VERSION}")
    return manifest


def is_w12_folder(folder: Path) -> bool:
    return any(read_manifest(p) is not None for p in _files(folder))


def _layer(name: str, t: W12Tensor, source_dtype: str) -> LayerStats:
    return LayerStats(name=name, shape=list(t.shape), params=t.numel, bytes=t.nbytes,
                      exceptions=t.num_exceptions, bits_per_param=t.bits_per_param,
                      exception_rate=t.exception_rate, source_dtype=source_dtype)


def convert_folder(src: Path, dst: Path, device: str = "cpu") -> ModelStats:
    """Convert a Hugging Face safetensors folder into a W12 folder (see the module doc)."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    files = _files(src)
    if any(read_manifest(p) is not None for p in files):
        raise W12Error(f"{src}: already a W12 folder")
    if dst.resolve() == src.resolve():
        raise W12Error("the output folder must differ from the model folder")
    if dst.exists() and any(dst.iterdir()):
        raise W12Error(f"{dst}: exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.suffix != ".safetensors":
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dst / item.name)
    layers = []
    for path in files:
        state = load_file(str(path))
        out, manifest = {}, W12Manifest()
        for name, w in state.items():
            if not is_linear_weight(name, w):
                out[name] = w.contiguous()
                continue
            t = encode(w.to(device=device, dtype=torch.bfloat16)).to("cpu")
            for part in PARTS:
                out[f"{name}.w12.{part}"] = getattr(t, part).contiguous()
            src_dtype = str(w.dtype).removeprefix("torch.")
            manifest.tensors[name] = TensorEntry(shape=list(t.shape), source_dtype=src_dtype)
            layers.append(_layer(name, t, src_dtype))
        save_file(out, str(dst / path.name),
                  metadata={"format": FORMAT, "w12": manifest.model_dump_json()})
    return _summary(str(src), False, layers)


def load_folder(folder: Path) -> tuple[dict[str, W12Tensor], dict[str, torch.Tensor]]:
    """A W12 folder's converted weights (as W12Tensor) and its other tensors."""
    from safetensors.torch import load_file

    w12, rest = {}, {}
    for path in _files(Path(folder)):
        manifest = read_manifest(path)
        state = load_file(str(path))
        names = manifest.tensors if manifest else {}
        for name, entry in names.items():
            try:
                parts = [state.pop(f"{name}.w12.{p}") for p in PARTS]
            except KeyError as exc:
                raise W12Error(f"{path}: {name} lacks its W12 tensor {exc}") from None
            w12[name] = W12Tensor(*parts, shape=tuple(entry.shape))
        rest.update(state)
    return w12, rest


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors with every W12 weight decoded (bf16, bit-exact)."""
    w12, rest = load_folder(folder)
    return {**rest, **{name: t.decode() for name, t in w12.items()}}


def model_stats(model: Path) -> ModelStats:
    """Per-layer stats of a W12 folder, or of a safetensors folder encoded on the fly."""
    from safetensors.torch import load_file

    folder = Path(model)
    files = _files(folder)
    manifests = [read_manifest(p) for p in files]
    if any(m is not None for m in manifests):
        w12, _ = load_folder(folder)
        dtypes = {n: e.source_dtype for m in manifests if m for n, e in m.tensors.items()}
        return _summary(str(folder), True, [_layer(n, t, dtypes[n]) for n, t in w12.items()])
    layers = []
    for path in files:
        for name, w in load_file(str(path)).items():
            if is_linear_weight(name, w):
                src_dtype = str(w.dtype).removeprefix("torch.")
                layers.append(_layer(name, encode(w.to(torch.bfloat16)), src_dtype))
    return _summary(str(folder), False, layers)


def _summary(model: str, stored: bool, layers: list[LayerStats]) -> ModelStats:
    if not layers:
        raise W12Error(f"{model}: no 2-D linear weights to encode")
    params = sum(x.params for x in layers)
    nbytes = sum(x.bytes for x in layers)
    exc = sum(x.exceptions for x in layers)
    return ModelStats(model=model, stored_w12=stored, layers=layers, params=params,
                      bytes=nbytes, bytes_bf16=2 * params, exceptions=exc,
                      bits_per_param=8.0 * nbytes / params, exception_rate=exc / params)


def dumps(stats: ModelStats) -> str:
    return json.dumps(stats.model_dump(), indent=2)
