"""Block-drafter weights on disk: bf16 safetensors shards plus a manifest with checksums.

A weights folder holds `manifest.json` (a `BlockManifest`) and the shards it lists, each at
most `MAX_SHARD_BYTES`. Loading checks every shard's sha256 and that the drafter fits the
target (shapes, and a fingerprint of the target's embedding) before building the drafter.
The target's embedding and head are never stored: the drafter reuses the target's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors.torch import load_file, save_file

from stock.drafters.block import BlockConfig, BlockDrafterError, BlockNet

FORMAT = "specpilot-block-drafter/1"
MAX_SHARD_BYTES = 16_000_000
DEFAULT_DIR = Path(__file__).resolve().parent / "weights" / "embedded"
TRAIN_HINT = ("train them with `python -m training.block --out "
              "stock/drafters/weights/embedded --seed 0 --device cuda` (see bench/archive/NOTES-2026.md, "
              "'Block drafter'), or pass a trained folder with --opt block_weights=DIR")


class Shard(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    file: str
    sha256: str
    bytes: int
    tensors: list[str]


class BlockManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["specpilot-block-drafter/1"] = FORMAT
    config: BlockConfig
    target_fingerprint: str  # target_fingerprint(target) of the model it was trained for
    target_name: str = ""
    dtype: str = "bfloat16"
    shards: list[Shard]
    seed: int
    command: str = ""
    data: dict = {}
    training: dict = {}
    history: list[dict] = []   # earlier runs this one continued (training/resume.py)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def target_fingerprint(target) -> str:
    """Hash of the target's first embedding rows rounded to bf16: the same for its fp32 CPU
    and bf16 GPU copies, different for another model of the same shape."""
    rows = target.model.embed_tokens.weight[:64].detach().to(torch.bfloat16).float().cpu()
    return hashlib.sha256(rows.numpy().tobytes()).hexdigest()[:16]


def save_block(net: BlockNet, folder: Path, *, target, seed: int, command: str = "",
               data: dict | None = None, training: dict | None = None,
               target_name: str = "", history: list[dict] | None = None) -> BlockManifest:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in net.state_dict().items()}
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * 2
        if nbytes > MAX_SHARD_BYTES - 4096:
            raise BlockDrafterError(f"tensor {name} of {nbytes} bytes does not fit one shard")
        if size + nbytes > MAX_SHARD_BYTES - 65536 and groups[-1]:
            groups.append({})
            size = 0
        groups[-1][name] = state[name]
        size += nbytes
    for old in folder.glob("block-*.safetensors"):
        old.unlink()
    shards = []
    for i, group in enumerate(groups):
        path = folder / f"block-{i:02d}.safetensors"
        save_file(group, str(path), metadata={"format": FORMAT})
        if path.stat().st_size > MAX_SHARD_BYTES:
            raise BlockDrafterError(f"{path} is {path.stat().st_size} bytes, over the limit")
        shards.append(Shard(file=path.name, sha256=sha256_file(path), bytes=path.stat().st_size,
                            tensors=sorted(group)))
    manifest = BlockManifest(config=net.cfg, target_fingerprint=target_fingerprint(target),
                             target_name=target_name, shards=shards, seed=seed, command=command,
                             data=data or {}, training=training or {},
                             history=history or [])
    write_manifest(folder, manifest)
    return manifest


def write_manifest(folder: Path, manifest: BlockManifest) -> None:
    (Path(folder) / "manifest.json").write_text(manifest.model_dump_json(indent=1) + "\n")


def read_manifest(folder: Path) -> BlockManifest:
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise BlockDrafterError(f"no block-drafter weights at {folder} (no manifest.json); "
                                + TRAIN_HINT)
    try:
        return BlockManifest.model_validate(json.loads(path.read_text()))
    except (ValidationError, json.JSONDecodeError) as exc:
        raise BlockDrafterError(f"{path}: not a block-drafter manifest: {exc}") from None


def load_block(folder: Path | str | None, target) -> tuple[BlockNet, BlockManifest]:
    """Verified BlockNet (fp32, CPU) for `target` from `folder` (default: the shipped one)."""
    folder = Path(folder) if folder else DEFAULT_DIR
    manifest = read_manifest(folder)
    manifest.config.check_target(target.cfg)
    fp = target_fingerprint(target)
    if fp != manifest.target_fingerprint:
        raise BlockDrafterError(
            f"block-drafter weights at {folder} were trained for another target "
            f"(fingerprint {manifest.target_fingerprint}, this target {fp}); " + TRAIN_HINT)
    state: dict[str, torch.Tensor] = {}
    for shard in manifest.shards:
        path = folder / shard.file
        if not path.is_file():
            raise BlockDrafterError(f"{path}: missing shard listed in the manifest; " + TRAIN_HINT)
        digest = sha256_file(path)
        if digest != shard.sha256:
            raise BlockDrafterError(f"{path}: sha256 {digest[:16]}… does not match the manifest's "
                                    f"{shard.sha256[:16]}… (corrupt or replaced weights)")
        state.update(load_file(str(path)))
    net = BlockNet(manifest.config)
    missing, unexpected = net.load_state_dict({k: v.float() for k, v in state.items()},
                                              strict=False)
    if missing or unexpected:
        raise BlockDrafterError(f"{folder}: weights do not match the config: missing "
                                f"{missing[:4]}, unexpected {unexpected[:4]}")
    return net.eval(), manifest
