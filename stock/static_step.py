"""A static-shape forward of the target, for CUDA graphs.

The dynamic forward (`Transformer.forward`) slices the KV cache to `start + T` and builds
its mask on the host, so every step has new shapes and host-side integers: it cannot be
captured. This forward has none of that. It takes

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
import torch.nn.functional as F

from stock.cache import KVCache
from stock.layers import apply_rope
from stock.model import Output, Transformer
from stock.profile import profile_active, region


def step_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [T, kv_len]: 0 where key j <= positions[i], -inf elsewhere."""
    keys = torch.arange(kv_len, device=positions.device)
    visible = keys.unsqueeze(0) <= positions.unsqueeze(1)
    zero = torch.zeros((), dtype=dtype, device=positions.device)
    return torch.where(visible, zero, torch.full_like(zero, float("-inf")))


def _attention(attn, x, cos, sin, cache: KVCache, positions, kv_len: int, mask_g):
    """One attention block over the static cache; grouped queries share their K/V head."""
    b, t, _ = x.shape
    with region("gemm"):
        q = attn.q_proj(x).view(b, t, attn.h, attn.d)
        k = attn.k_proj(x).view(b, t, attn.hkv, attn.d)
        v = attn.v_proj(x).view(b, t, attn.hkv, attn.d)
    with region("attention"):
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_all, v_all = cache.write_at(attn.layer, positions, k, v)
        g = attn.h // attn.hkv
        # [B, H, T, D] -> [B, Hkv, G*T, D]: query head h uses K/V head h // G (as enable_gqa),
        # without materialising repeated K/V over the whole cache.
        qg = q.reshape(b, attn.hkv, g * t, attn.d)
        out = F.scaled_dot_product_attention(qg, k_all[:, :, :kv_len], v_all[:, :, :kv_len],
                                             attn_mask=mask_g)
        out = out.view(b, attn.h, t, attn.d).transpose(1, 2).reshape(b, t, attn.h * attn.d)
    with region("gemm"):
        return attn.o_proj(out)


def step_prologue(model: Transformer, ids: torch.Tensor, positions: torch.Tensor,
                  kv_len: int, mask: bool = True):
    """A step's RoPE rows, grouped mask [1, 1, G*T, kv_len] (None without `mask`) and
    embeddings: shared by this forward and the compiled one (eager, once per step)."""
    t = ids.shape[1]
    rope_pos = positions.clamp(max=model.cos.shape[0] - 1)
    cos = model.cos[rope_pos].view(1, 1, t, -1)
    sin = model.sin[rope_pos].view(1, 1, t, -1)
    g = model.cfg.num_heads // model.cfg.num_kv_heads
    mask_g = (step_mask(positions, kv_len, model.dtype).repeat(g, 1).view(1, 1, g * t, kv_len)
              if mask else None)
    return cos, sin, mask_g, model.model.embed_tokens(ids)


@torch.inference_mode()
def static_forward(model: Transformer, ids: torch.Tensor, positions: torch.Tensor,
                   cache: KVCache, kv_len: int, hidden_layers: tuple[int, ...] = (),
                   logits: bool = True, compiled: bool = False,
                   attention: str = "sdpa", fused: bool = False) -> Output:
    """ids [B, T], positions [T] int64 (device tensors); logits [B, T, vocab] fp32.
    `compiled`: run the layers through stock/compiled.py's torch.compile regions (same
    contract; eager anyway while a profiler is active, whose regions synchronise), with
    `attention` ("sdpa" or "triton") between them and `fused` (see compiled.forward)."""
    if not 0 < kv_len <= cache.max_len:
        raise ValueError(f"kv_len {kv_len} outside (0, {cache.max_len}]")
    if compiled and not profile_active():
        from stock import compiled as compiled_step

        return compiled_step.forward(model, ids, positions, cache, kv_len, hidden_layers,
                                     logits, attention, fused)
    cos, sin, mask_g, x = step_prologue(model, ids, positions, kv_len)
    hidden = {}
    for i, layer in enumerate(model.model.layers):
        x = x + _attention(layer.self_attn, layer.input_layernorm(x), cos, sin, cache,
                           positions, kv_len, mask_g)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in hidden_layers:
            hidden[i] = x
    if not logits:
        return Output(None, hidden)
    return Output(model.lm_head(model.model.norm(x)).float(), hidden)
