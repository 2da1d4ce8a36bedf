"""Static KV cache with commit and rollback by length.

One preallocated buffer per layer: [batch, kv_heads, max_len, head_dim], each a view of one
buffer for all layers (`k_all`, `v_all`: [layers, batch, kv_heads, max_len, head_dim]). A
forward writes K/V for its tokens at positions [start, start + T); `length` is what is committed. Rolling
back is setting a smaller length: stale slots past it are overwritten by the next write and
never read, because attention reads only [0, start + T).
"""

from __future__ import annotations

import torch

from stock.config import ModelConfig
from stock.errors import StockError


class ContextOverflow(StockError):
    pass


class KVCache:
    def __init__(self, cfg: ModelConfig, max_len: int, batch: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 num_layers: int | None = None):
        n = cfg.num_layers if num_layers is None else num_layers
        shape = (n, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        # one buffer for all layers, each layer's a view of it: a step that moves rows in
        # every layer (a tree's accepted path) does it in one op over k_all / v_all
        self.k_all = torch.zeros(shape, device=device, dtype=dtype)
        self.v_all = torch.zeros(shape, device=device, dtype=dtype)
        # select, not unbind: unbind's views refuse in-place writes outside inference mode
        self.k = [self.k_all[i] for i in range(n)]
        self.v = [self.v_all[i] for i in range(n)]
        self.max_len = max_len
        self.length = 0

    def check_room(self, start: int, n: int) -> None:
        if start + n > self.max_len:
            raise ContextOverflow(
                f"context of {start + n} tokens exceeds the cache's {self.max_len}")

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [B, Hkv, T, D] at [start, start+T); return views of [0, start+T)."""
        end = start + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def write_at(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [B, Hkv, T, D] at slots `positions` [T] (an int64 device tensor, so a
        captured graph can write where the step's tokens are); return the whole buffers."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)
        return self.k[layer], self.v[layer]

    def commit(self, length: int) -> None:
        if not 0 <= length <= self.max_len:
            raise ValueError(f"commit length {length} outside [0, {self.max_len}]")
        self.length = length

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        self.length = length
