"""Plain-PyTorch reference for the static step's attention (any device, fp32 math).

Shapes are those of the static step (stock/static_step.py, stock/compiled.py):

- q [B, Hkv, R, D]: the step's queries folded onto their K/V heads, R = G * T rows, row r
  belonging to token r % T (query head h = kv_head * G + r // T);
- k, v [B, Hkv, S, D]: the layer's cache buffers, S >= kv_len slots;
- positions [T] int64: each token's position; row r sees key j iff j <= positions[r % T]
  and j < kv_len (the step's additive mask, `step_mask`);
- tree (optional) [1 + T] int64: a draft tree's step, start then one ancestor bitmask per
  token: row r sees key j iff j < start, or bit j - start of its token's mask is set.

Returns [B, Hkv, R, D] in q's dtype.
"""

from __future__ import annotations

import math

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        positions: torch.Tensor, kv_len: int,
                        tree: torch.Tensor | None = None) -> torch.Tensor:
    t = positions.numel()
    rows = q.shape[2]
    if rows % t:
        raise ValueError(f"{rows} query rows are not a multiple of {t} tokens")
    keys = torch.arange(kv_len, device=q.device)
    if tree is None:
        row_pos = positions.repeat(rows // t)  # row r -> positions[r % T]
        visible = keys.unsqueeze(0) <= row_pos.unsqueeze(1)  # [R, kv_len]
    else:
        start, bits = int(tree[0]), tree[1:].repeat(rows // t)
        rel = keys - start
        inside = (rel >= 0) & (rel < 64)
        own = ((bits.unsqueeze(1) >> rel.clamp(0, 63).unsqueeze(0)) & 1) != 0
        visible = (keys < start).unsqueeze(0) | (inside.unsqueeze(0) & own)
    qf, kf, vf = q.float(), k[:, :, :kv_len].float(), v[:, :, :kv_len].float()
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible, float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).to(q.dtype)
