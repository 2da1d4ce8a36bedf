"""Training that continues from run to run (--resume DIR): short GPU runs accumulate.

A run saves, beside its weights folder's manifest, its *training state*: the drafter's fp32
weights after its last step (the folder holds its best validated checkpoint in bf16) and
AdamW's moments and step counts. The state is about five times the weights' bytes, so it
lives outside the repository: by default `<cache>/training/<key>.pt` (the cache of
stock/gguf_convert.py, `SPECPILOT_CACHE_DIR` or `~/.cache/specpilot`), `key` naming the
weights it belongs to (the hash of the folder's shard hashes); --optimizer-state FILE puts it
elsewhere. The manifest records the file and its key.

`--resume DIR` starts from DIR's weights and, when its training state is found and belongs
to those weights, from the state's fp32 weights and optimizer: the moments are warm, so the
run skips its learning-rate warm-up. Without the state (weights trained before this existed,
such as the first shipped ones, or a state file deleted) it starts a fresh optimizer from
the weights and says so. Either way the new manifest's `history` is DIR's history plus DIR's
own run (command, steps, data, validation), so the weights shipped after several short runs
say how they were made.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import torch

from stock.drafters.block_weights import BlockManifest, read_manifest

FORMAT = "specpilot-block-training-state/1"


def weights_key(manifest: BlockManifest) -> str:
    """Which weights a training state belongs to: the hash of the folder's shard hashes."""
    joined = ",".join(s.sha256 for s in manifest.shards)
    return hashlib.sha256(joined.encode()).hexdigest()[:20]


def default_state_path(key: str) -> Path:
    base = os.environ.get("SPECPILOT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specpilot")
    return Path(base) / "training" / f"{key}.pt"


def save_state(path: Path, manifest: BlockManifest, last_weights: dict, opt,
               steps: int) -> dict:
    """Write the training state of the run that saved `manifest`; returns the manifest's
    record of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = weights_key(manifest)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save({"format": FORMAT, "key": key, "steps": steps,
                "weights": {k: v.detach().float().cpu() for k, v in last_weights.items()},
                "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)
    return {"file": str(path), "key": key, "bytes": path.stat().st_size, "steps": steps}


def find_state(folder: Path, explicit: str = "") -> tuple[Path | None, str]:
    """The training state of the weights in `folder`: (path or None, why none)."""
    man = read_manifest(folder)
    key = weights_key(man)
    record = (man.training or {}).get("optimizer_state") or {}
    for cand in ([explicit] if explicit else []) + [record.get("file", ""),
                                                    str(default_state_path(key))]:
        if cand and Path(cand).is_file():
            return Path(cand), ""
    if not record:
        return None, f"{folder} was saved without a training state"
    return None, f"its training state {record.get('file')} is gone"


def load_state(path: Path, folder: Path, net, opt, device) -> int:
    """Load a training state into `net` (fp32 weights) and `opt`; returns the steps it had
    run. An error names the file when it belongs to other weights or another drafter."""
    man = read_manifest(folder)
    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:   # noqa: BLE001 - any unreadable file: one line naming it
        raise ValueError(f"--resume {folder}: training state {path} is unreadable: "
                         f"{type(exc).__name__}") from None
    if not isinstance(st, dict) or st.get("format") != FORMAT:
        raise ValueError(f"--resume {folder}: {path} is not a block-drafter training state")
    if st["key"] != weights_key(man):
        raise ValueError(f"--resume {folder}: training state {path} belongs to other "
                         f"weights (key {st['key']}, these {weights_key(man)})")
    mine = net.state_dict()
    if set(st["weights"]) != set(mine) or any(st["weights"][k].shape != v.shape
                                              for k, v in mine.items()):
        raise ValueError(f"--resume {folder}: training state {path} is of another drafter "
                         "shape")
    with torch.no_grad():
        net.load_state_dict({k: v.to(device) for k, v in st["weights"].items()})
    opt.load_state_dict(st["optimizer"])
    return int(st["steps"])


def history(folder: Path) -> list[dict]:
    """DIR's history, then DIR's own run: what a run resumed from DIR records."""
    man = read_manifest(folder)
    t = man.training or {}
    own = {"command": man.command, "seed": man.seed, "steps": t.get("steps"),
           "kept_step": t.get("kept_step"), "train_s": t.get("train_s"),
           "answers": t.get("answers"), "answer_tokens": t.get("answer_tokens"),
           "val_block_accept_len": t.get("val_block_accept_len"), "val_tau": t.get("val_tau"),
           "val_loss": t.get("val_loss"), "init": t.get("init"),
           "resumed_from_state": t.get("resumed_from_state"),
           "saved": t.get("saved"), "device": t.get("device")}
    return [*man.history, own]


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
