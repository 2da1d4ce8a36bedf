"""Hybrid checkpoints' tensors under stock's names.

- Qwen3.5 vision-language checkpoints (`Qwen3_5ForConditionalGeneration`) keep the language
  model under `model.language_model.`; the vision tower (`model.visual.`) and the
  multi-token-prediction head (`mtp.`) are not part of the target and are dropped.
- Qwen3-Next packs each GDN layer's q, k, v and z projections into `in_proj_qkvz` and b, a
  into `in_proj_ba`, grouped per key head ([q, k, v, z] rows of each group); stock keeps
  Qwen3.5's layout (`in_proj_qkv` feeding the conv, `in_proj_z`, `in_proj_b`, `in_proj_a`),
  so they are regrouped here, row for row (no arithmetic).
"""

from __future__ import annotations

import torch

from stock.config import ModelConfig

DROPPED = ("model.visual.", "mtp.")


def adapt(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(DROPPED):
            continue
        name = name.replace("model.language_model.", "model.", 1)
        if name.endswith("linear_attn.in_proj_qkvz.weight"):
            out.update(_split_qkvz(cfg, name.removesuffix("in_proj_qkvz.weight"), tensor))
        elif name.endswith("linear_attn.in_proj_ba.weight"):
            out.update(_split_ba(cfg, name.removesuffix("in_proj_ba.weight"), tensor))
        else:
            out[name] = tensor
    return out


def _split_qkvz(cfg: ModelConfig, prefix: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // hk
    g = w.reshape(hk, 2 * dk + 2 * r * dv, w.shape[-1])
    q, k, v, z = g.split([dk, dk, r * dv, r * dv], dim=1)
    rows = [x.reshape(-1, w.shape[-1]) for x in (q, k, v, z)]
    return {prefix + "in_proj_qkv.weight": torch.cat(rows[:3]),
            prefix + "in_proj_z.weight": rows[3].contiguous()}


def _split_ba(cfg: ModelConfig, prefix: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    hk = cfg.linear_num_key_heads
    r = cfg.linear_num_value_heads // hk
    b, a = w.reshape(hk, 2 * r, w.shape[-1]).split([r, r], dim=1)
    return {prefix + "in_proj_b.weight": b.reshape(-1, w.shape[-1]).contiguous(),
            prefix + "in_proj_a.weight": a.reshape(-1, w.shape[-1]).contiguous()}
