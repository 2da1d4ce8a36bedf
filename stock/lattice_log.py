"""Lattice recording: per verification step, the draft lattice, the accepted length and the
target's own tokens, in one compact .npz (for exact replay and the cost model's τ factor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from stock.drafters.base import DraftLattice

FORMAT_VERSION = 1


@dataclass
class StepRecord:
    lattice: DraftLattice
    accepted: int  # draft tokens accepted (the bonus token not counted)
    target: list[int]  # the target's argmax at each verified position (len(lattice) + 1)


class LatticeRecorder:
    def __init__(self, topk: int, meta: dict | None = None):
        self.topk = topk
        self.meta = dict(meta or {})
        self.steps: list[StepRecord] = []
        self.request_bounds: list[int] = [0]  # step index where each request starts

    def add(self, lattice: DraftLattice, accepted: int, target: list[int]) -> None:
        ids, lps = lattice.ids, lattice.logprobs
        if ids.shape[1] != self.topk:  # pad or cut alternatives to the log's width
            pad = self.topk - ids.shape[1]
            if pad > 0:
                ids = torch.cat([ids, torch.full((len(ids), pad), -1, dtype=ids.dtype)], 1)
                lps = torch.cat([lps, torch.full((len(lps), pad), -float("inf"))], 1)
            else:
                ids, lps = ids[:, : self.topk], lps[:, : self.topk]
        self.steps.append(StepRecord(DraftLattice(ids, lps), accepted, list(target)))

    def end_request(self) -> None:
        self.request_bounds.append(len(self.steps))

    def save(self, path: str | Path) -> None:
        lens = np.array([len(s.lattice) for s in self.steps], dtype=np.int32)
        k = self.topk
        ids = np.concatenate([s.lattice.ids.numpy().astype(np.int32) for s in self.steps]
                             or [np.zeros((0, k), np.int32)])
        lps = np.concatenate([s.lattice.logprobs.numpy().astype(np.float32) for s in self.steps]
                             or [np.zeros((0, k), np.float32)])
        target = np.concatenate([np.array(s.target, np.int32) for s in self.steps]
                                or [np.zeros(0, np.int32)])
        meta = {"format_version": FORMAT_VERSION, "topk": k, **self.meta}
        with open(path, "wb") as fh:
            np.savez_compressed(fh, lens=lens, ids=ids, logprobs=lps, target=target,
                                accepted=np.array([s.accepted for s in self.steps], np.int32),
                                requests=np.array(self.request_bounds, np.int32),
                                meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))

    @classmethod
    def load(cls, path: str | Path) -> "LatticeRecorder":
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"{path}: lattice log format {meta.get('format_version')} "
                                 f"is not {FORMAT_VERSION}")
            rec = cls(meta.pop("topk"), {k: v for k, v in meta.items() if k != "format_version"})
            ids, lps, target = z["ids"], z["logprobs"], z["target"]
            i = t = 0
            for n, acc in zip(z["lens"].tolist(), z["accepted"].tolist()):
                lat = DraftLattice(torch.from_numpy(ids[i:i + n].astype(np.int64)),
                                   torch.from_numpy(lps[i:i + n].astype(np.float32)))
                rec.steps.append(StepRecord(lat, acc, target[t:t + n + 1].tolist()))
                i, t = i + n, t + n + 1
            rec.request_bounds = z["requests"].tolist()
        return rec
