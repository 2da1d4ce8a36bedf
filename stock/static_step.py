"""A static-shape forward of the target, for CUDA graphs.

Called with defaults, the model's forward (`Transformer.forward`) reads the KV cache up to
`start + T` and builds its positions from host integers, so every step has new shapes: it
cannot be captured. Called as here it has none of that (one layer body, stock/body.py). It
takes

- `ids` [B, T] and `positions` [T] (int64, on the model's device): the tokens of the step
  and their positions; T is fixed per call site (a bucket), real tokens first, padding after;
- `kv_len`, a Python int fixed per call site: attention reads cache slots [0, kv_len).

It writes each token's K/V at its position with `index_copy_` along the sequence dim and
attends over the first `kv_len` slots of the static cache with an additive mask built on the
device from the positions: query i sees key j iff j <= positions[i]. Keys past a query's
position (stale slots, rejected drafts, padding) are masked; the committed context and the
step's earlier tokens are not. Padding tokens (positions after the real ones) are written
into the cache too; their slots lie past every real query's position, so nothing reads them
before a later step overwrites them. Outputs at padded rows are garbage and are ignored.

It reuses the model's own modules (projections, norms, MLPs, head), so a module swapped in
place (say, nn.Linear replaced by another implementation) is used here as well. Positions
past the RoPE table (padding near the end of a long context) are clamped for the RoPE
lookup only; they belong to padding, whose outputs nobody reads.
"""

from __future__ import annotations

import torch

from stock.cache import KVCache
from stock.model import Output, Transformer
from stock.profile import profile_active


def tree_kernel_runs(model: Transformer, compiled: bool, attention: str) -> bool:
    """Whether a tree step of `model` runs kernels/attention's split-KV kernel (a dense
    target, compiled, on CUDA, a head dim it takes, no profiler): then its visibility mask
    is never read."""
    if not compiled or profile_active() or model.cfg.hybrid:
        return False
    from stock.compiled import uses_kernel  # lazy: torch.compile, only when used

    return uses_kernel(attention, model.device, model.cfg.head_dim)


@torch.inference_mode()
def static_forward(model: Transformer, ids: torch.Tensor, positions: torch.Tensor,
                   cache: KVCache, kv_len: int, hidden_layers: tuple[int, ...] = (),
                   logits: bool = True, compiled: bool = False,
                   attention: str = "sdpa", fused: bool = False,
                   rope: torch.Tensor | None = None, seen: torch.Tensor | None = None,
                   tree: torch.Tensor | None = None) -> Output:
    """ids [B, T], positions [T] int64 (device tensors); logits [B, T, vocab] fp32.
    `compiled`: run the layers through stock/compiled.py's torch.compile regions (same
    contract; eager anyway while a profiler is active, whose regions synchronise), with
    `attention` ("sdpa" or "triton") between them and `fused` (see compiled.forward).
    Eager: the model's own forward at these positions and slots (one layer body).
    `rope` [T] and `seen` [T, kv_len] (bool): the tokens' RoPE positions and visibility when
    they are not their slots and the causal mask (a tree's depths and ancestor mask);
    attention then runs SDPA with that mask, or, compiled with the split-KV kernel, that
    kernel with `tree` (stock/tree.py's tree_table: the same visibility as bits). `seen` may
    be left out only where `tree` is given and that kernel runs (`tree_kernel_runs`)."""
    kernel = tree is not None and tree_kernel_runs(model, compiled, attention)
    if (rope is None and seen is not None) or (rope is not None and seen is None and not kernel):
        raise ValueError("rope comes with seen, or with tree where the split-KV kernel runs")
    if not 0 < kv_len <= cache.max_len:
        raise ValueError(f"kv_len {kv_len} outside (0, {cache.max_len}]")
    if compiled and not profile_active():
        from stock import compiled as compiled_step  # lazy: torch.compile, only when used

        return compiled_step.forward(model, ids, positions, cache, kv_len, hidden_layers,
                                     logits, attention, fused, rope, seen, tree)
    return model(ids, cache, 0, positions=positions, kv_len=kv_len, mask=seen, rope=rope,
                 logits="all" if logits else "none", hidden_layers=tuple(hidden_layers))
