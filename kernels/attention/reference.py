"""Plain-PyTorch reference for the static step's attention (any device, fp32 math).

Shapes are those of the static step (stock/static_step.py, stock/compiled.py):

- q [B, Hkv, R, D]: the step's queries folded onto their K/V heads, R = G * T rows, row r
  belonging to token r % T (query head h = kv_head * G + r // T);
- k, v [B, Hkv, S, D]: the layer's cache buffers, S >= kv_len slots;
- positions [T] int64: each token's position; row r sees key j iff j <= positions[r % T]
  and j < kv_len (the step's additive mask, `step_mask`);
- rows_of (optional) [B] int64: a batched step, request b's queries q[b] over cache row
  rows_of[b] of k, v [rows, Hkv, S, D] with its own positions[b] (positions [B, T]);
- tree (optional): a draft tree's step (stock/tree.py's tree_table: start, T depths, T
  paths of 64): row r sees keys j < start and the slots start + path[e] of its token's
  ancestors, e <= its depth.

Returns [B, Hkv, R, D] in q's dtype.
"""

from __future__ import annotations

import math

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        positions: torch.Tensor, kv_len: int,
                        tree: torch.Tensor | None = None,
                        rows_of: torch.Tensor | None = None) -> torch.Tensor:
    if rows_of is not None:   # a batched step: request b in cache row rows_of[b], own positions
        return torch.cat([reference_attention(q[i:i + 1], k[r:r + 1], v[r:r + 1], positions[i],
                                              kv_len) for i, r in enumerate(rows_of.tolist())])
    t = positions.numel()
    rows = q.shape[2]
    if rows % t:
        raise ValueError(f"{rows} query rows are not a multiple of {t} tokens")
    keys = torch.arange(kv_len, device=q.device)
    if tree is None:
        row_pos = positions.repeat(rows // t)  # row r -> positions[r % T]
        visible = keys.unsqueeze(0) <= row_pos.unsqueeze(1)  # [R, kv_len]
    else:
        start, depths = int(tree[0]), tree[1:1 + t].tolist()
        paths = tree[1 + t:].view(t, 64).tolist()
        per_token = torch.zeros(t, kv_len, dtype=torch.bool, device=q.device)
        per_token[:, :start] = True
        for i in range(t):
            for e in range(depths[i] + 1):
                per_token[i, start + paths[i][e]] = True
        visible = per_token.repeat(rows // t, 1)   # row r -> token r % T
    qf, kf, vf = q.float(), k[:, :, :kv_len].float(), v[:, :, :kv_len].float()
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible, float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).to(q.dtype)
