"""The decoder layer's body, written once: every forward of the target runs these pieces.

The eager forward (`Transformer.forward`, prefill and steps without CUDA graphs), the static
one (`static_step.static_forward`, CUDA graphs) and the compiled one (`compiled.forward`,
torch.compile regions) differ only in how they drive the pieces, never in the math:

- `step_inputs`: the one place where positions and masks enter. A step is its token ids,
  their positions (an int64 device tensor), the cache slots they are written to (the
  positions, or start.. for rows at positions of their own) and `kv_len`, the slots it
  reads; key j is visible to query i iff j <= positions[i] (`visible`), unless the caller
  hands its own visibility (a tree's ancestor mask, padded rows). Returns the RoPE rows,
  the additive mask folded onto the K/V heads (or None where every slot is visible) and the
  embeddings.
- `qkv`: q/k/v projections (three modules, or one GEMM by a fused group); `rotate`: q/k
  norms and RoPE; `write_kv`: K/V into the cache at the step's positions; `attend`: the
  folded queries over the first kv_len slots; `merge`: heads back to the hidden size.
- `mlp`: the MLP (its module, or gate/up as one fused GEMM).

`call(mod, x)` is how a piece calls a module: plainly in eager code, through
`compiled._call` inside compiled regions (which runs modules dynamo should not trace
eagerly). Queries are folded onto their K/V head ([B, Hkv, G*T, D]): query head h uses K/V
head h // G, without materialising repeated K/V over the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stock.gdn import mix
from stock.layers import apply_rope
from stock.linear import linear
from stock.profile import region


def plain(mod, x: torch.Tensor) -> torch.Tensor:
    return mod(x)


def visible(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Boolean [T, kv_len]: key j is visible to query i iff j <= positions[i]."""
    keys = torch.arange(kv_len, device=positions.device)
    return keys.unsqueeze(0) <= positions.unsqueeze(1)


def additive(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where visible, -inf elsewhere (SDPA's additive mask)."""
    zero = torch.zeros((), dtype=dtype, device=seen.device)
    return torch.where(seen, zero, torch.full_like(zero, float("-inf")))


def step_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [T, kv_len] of a causal step: 0 where key j <= positions[i]."""
    return additive(visible(positions, kv_len), dtype)


def step_inputs(model, ids: torch.Tensor, positions: torch.Tensor, kv_len: int,
                seen: torch.Tensor | None = None, mask: bool = True):
    """A step's RoPE rows [B or 1, 1, T, D], its additive mask folded onto the K/V heads
    [B or 1, 1, G*T, kv_len] (None without `mask` and `seen`: every slot is visible, or the
    caller's attention masks by positions itself) and its embeddings. `positions`: [T], or
    [B, T] for rows at positions of their own (RoPE only). `seen`: the caller's own
    visibility ([T, kv_len], [B, T, kv_len] or [B, 1, T, kv_len]: a tree, padded rows)
    instead of the causal one from `positions`."""
    t = ids.shape[1]
    rows = positions.shape[0] if positions.dim() == 2 else 1
    rope_pos = positions.clamp(max=model.cos.shape[0] - 1)  # padding past the table
    cos = model.cos[rope_pos].view(rows, 1, t, -1)
    sin = model.sin[rope_pos].view(rows, 1, t, -1)
    mask_g = None
    if mask or seen is not None:
        g = model.cfg.num_heads // model.cfg.num_kv_heads
        seen = visible(positions, kv_len) if seen is None else seen
        seen = seen if seen.dim() == 4 else seen.view(-1, 1, t, kv_len)
        mask_g = additive(seen, model.dtype).repeat(1, 1, g, 1)   # row g*T + i is query i
    return cos, sin, mask_g, model.model.embed_tokens(ids)


def group_out(call, fused, x: torch.Tensor) -> torch.Tensor:
    """x times a fused group: stock's concatenated matrix (one GEMM), or the group module a
    patch installed (stock/fused.py, install_group), called like any module."""
    return linear(x, fused) if isinstance(fused, torch.Tensor) else call(fused, x)


def gated_qkv(call, attn, hx: torch.Tensor, fused=None):
    """A gated attention's queries [B, T, H, D], output gate [B, T, H*D], k and v [B, T,
    Hkv, D]: q_proj emits queries and gate interleaved per head (Qwen3.5); `fused`: q/k/v
    as one GEMM (qkv's)."""
    b, t, _ = hx.shape
    if fused is None:
        qg, k, v = call(attn.q_proj, hx), call(attn.k_proj, hx), call(attn.v_proj, hx)
    else:
        qg, k, v = group_out(call, fused, hx).split(
            [2 * attn.h * attn.d, attn.hkv * attn.d, attn.hkv * attn.d], dim=-1)
    qg = qg.reshape(b, t, attn.h, 2 * attn.d)
    return (qg[..., :attn.d], qg[..., attn.d:].reshape(b, t, attn.h * attn.d),
            k.reshape(b, t, attn.hkv, attn.d), v.reshape(b, t, attn.hkv, attn.d))


def qkv(call, attn, hx: torch.Tensor, fused=None):
    """q, k, v [B, T, heads, D]: three projections, or one GEMM by the fused matrix."""
    b, t, _ = hx.shape
    if getattr(attn, "gated", False):   # drafters' attention modules have no gate
        raise ValueError("a gated attention's queries come from gated_qkv")
    if fused is None:
        q, k, v = call(attn.q_proj, hx), call(attn.k_proj, hx), call(attn.v_proj, hx)
    else:
        q, k, v = group_out(call, fused, hx).split(
            [attn.h * attn.d, attn.hkv * attn.d, attn.hkv * attn.d], dim=-1)
    return (q.reshape(b, t, attn.h, attn.d), k.reshape(b, t, attn.hkv, attn.d),
            v.reshape(b, t, attn.hkv, attn.d))


def rotate(call, attn, q, k, v, cos, sin):
    """q/k norms, RoPE, heads first: q, k, v [B, heads, T, D], views of [B, T, heads, D]
    tensors (RoPE runs in the projection's layout, cos/sin [B or 1, 1, T, R] read as [B or
    1, T, 1, R]: an elementwise pass with no transposing write, whatever sizes a compiled
    region leaves dynamic; `fold` copies where SDPA needs it, `split_heads` does not)."""
    if attn.qk_norm:
        q, k = call(attn.q_norm, q), call(attn.k_norm, k)
    cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def write_kv(k_buf, v_buf, positions: torch.Tensor, k, v) -> None:
    """K/V [B, Hkv, T, D] into the layer's cache buffers at slots `positions`."""
    k_buf.index_copy_(2, positions, k)
    v_buf.index_copy_(2, positions, v)


def write_rows(k_buf, v_buf, rows: torch.Tensor, slots: torch.Tensor, k, v) -> None:
    """A batched step's K/V [R, Hkv, T, D] into cache rows `rows` [R], row r's tokens at
    its own slots slots[r] [T] (requests of ragged lengths in one static cache)."""
    r = rows[:, None]
    k_buf[r, :, slots] = k.permute(0, 2, 1, 3)   # indexed dims first: [R, T, Hkv, D]
    v_buf[r, :, slots] = v.permute(0, 2, 1, 3)


def fold(attn, q: torch.Tensor) -> torch.Tensor:
    """Queries [B, H, T, D] -> [B, Hkv, G*T, D] (grouped onto their K/V head)."""
    b, _, t, _ = q.shape
    return q.reshape(b, attn.hkv, (attn.h // attn.hkv) * t, attn.d)


def split_heads(attn, q: torch.Tensor) -> torch.Tensor:
    """Queries [B, H, T, D] -> [B, Hkv, G, T, D], a view (kernels/attention's decode_attention
    reads rows g * T + t by their strides: the folding copy `fold` makes is not needed)."""
    return q.unflatten(1, (attn.hkv, attn.h // attn.hkv))


def attend(qg, k_buf, v_buf, kv_len: int, mask_g, rows: torch.Tensor | None = None):
    """SDPA of folded queries over the first kv_len cache slots (of cache rows `rows`, a
    batched step's requests, when given)."""
    k, v = k_buf[:, :, :kv_len], v_buf[:, :, :kv_len]
    if rows is not None:
        k, v = k.index_select(0, rows), v.index_select(0, rows)
    return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask_g)


def merge(attn, out: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """Attention output [B, Hkv, G*T, D] -> [B, T, H*D]; an output already [B, T, H*D]
    (kernels/attention's `merged`) as it is. A reshape, not a view: SDPA's
    memory-efficient kernel may return [B, G*T, Hkv, D]-strided outputs, which no view can
    split into query heads."""
    if out.dim() == 3:
        return out
    return out.reshape(b, attn.h, t, attn.d).transpose(1, 2).reshape(b, t, attn.h * attn.d)


def mlp(call, module, x: torch.Tensor, gate_up=None) -> torch.Tensor:
    """The MLP: its module, or gate/up as one GEMM by the fused matrix."""
    if gate_up is None:
        return call(module, x)
    g, u = group_out(call, gate_up, x).split([module.gate_proj.out_features,
                                              module.up_proj.out_features], dim=-1)
    return call(module.down_proj, F.silu(g) * u)


def eager_layers(model, x, cos, sin, cache, slots, kv_len: int, mask_g,
                 hidden_layers=(), num_layers: int | None = None, start: int | None = None,
                 rows: torch.Tensor | None = None):
    """The layers of an eager step (dynamic or static), with the profile's regions; K/V
    are written at cache slots `slots` [T] (a batched step: cache rows `rows` [R], each row
    at its own slots [R, T]). GDN layers (hybrid targets) step from the committed state at
    `start`, or a batched step's from each row's own (stock/gdn.py). Returns the last
    hidden state and the chosen layers' hidden states."""
    hidden = {}
    layers = model.model.layers if num_layers is None else model.model.layers[:num_layers]
    for i, layer in enumerate(layers):
        b, t, _ = x.shape
        hx = layer.input_layernorm(x)
        if hasattr(layer, "linear_attn"):
            with region("recurrent"):
                x = x + mix(layer.linear_attn, hx, cache, start, rows)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in hidden_layers:
                hidden[i] = x
            continue
        attn = layer.self_attn
        with region("gemm"):
            if attn.gated:
                q, gate, k, v = gated_qkv(plain, attn, hx)
            else:
                q, k, v = qkv(plain, attn, hx)
        with region("attention"):
            q, k, v = rotate(plain, attn, q, k, v, cos, sin)
            if rows is None:
                write_kv(cache.k[attn.layer], cache.v[attn.layer], slots, k, v)
            else:
                write_rows(cache.k[attn.layer], cache.v[attn.layer], rows, slots, k, v)
            out = merge(attn, attend(fold(attn, q), cache.k[attn.layer], cache.v[attn.layer],
                                     kv_len, mask_g, rows), b, t)
            if attn.gated:
                out = out * torch.sigmoid(gate)
        with region("gemm"):
            x = x + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in hidden_layers:
            hidden[i] = x
    return x, hidden
