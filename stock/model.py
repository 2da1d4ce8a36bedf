"""The target model: embedding, decoder layers, final norm, output head.

`forward` runs T new tokens per sequence against a static KV cache starting at `start`.
By default positions are start..start+T-1, the step reads cache slots [0, start+T) and
key j is visible to query i iff j <= its position; a caller (tree verification, the
static step) may pass its own positions, slots read (`kv_len`) and visibility. The layer
body is stock/body.py's, the same for every forward. Logits are fp32 whatever the compute
dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from stock import body
from stock.cache import KVCache
from stock.config import ModelConfig
from stock.errors import StockError
from stock.hybrid_cache import HybridCache
from stock.hybrid_weights import adapt
from stock.layers import DecoderLayer, OffsetRMSNorm, make_norm, rope_tables
from stock.linear import Linear
from stock.weights import load_config, load_state_dict


@dataclass
class Output:
    logits: torch.Tensor | None  # [B, T or 1, vocab] fp32
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, T, H]


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # built on the meta device only, and always loaded or filled after (from_state_dict,
        # random): an explicit empty weight skips nn.Embedding's normal_ init, whose first
        # call on meta imports torch's Python decompositions (about 2.3 s a process)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg, cfg.hidden_size)


def check_tensors(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every tensor of `state` that `model` (built from the config) has: same shape, and a
    floating-point dtype (it is cast to the compute dtype, never reinterpreted)."""
    expected = model.state_dict()
    for name, tensor in state.items():
        want = expected.get(name)
        if want is None:
            continue  # unexpected names are reported by load_state_dict's check
        if tuple(tensor.shape) != tuple(want.shape):
            raise StockError(f"tensor {name} has shape {list(tensor.shape)}; the config "
                             f"makes it {list(want.shape)}")
        if not tensor.is_floating_point():
            raise StockError(f"tensor {name} has dtype {str(tensor.dtype).removeprefix('torch.')}"
                             f"; weights must be floating point")


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.cos = self.sin = None

    def setup_rope(self):
        dev = self.model.embed_tokens.weight.device
        dtype = self.model.embed_tokens.weight.dtype
        self.cos, self.sin = rope_tables(self.cfg, dev, dtype)

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def new_cache(self, max_len: int, batch: int = 1, num_layers: int | None = None) -> KVCache:
        """A KV cache for the first `num_layers` layers (all by default); on a hybrid target
        a HybridCache (KV of its attention layers, recurrent state of its GDN layers)."""
        kind = HybridCache if self.cfg.hybrid else KVCache
        return kind(self.cfg, max_len, batch, self.device, self.dtype, num_layers=num_layers)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, start: int,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                logits: str = "all", hidden_layers: tuple[int, ...] = (),
                num_layers: int | None = None, kv_len: int | None = None,
                rope: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> Output:
        """ids [B, T]; logits 'all' | 'last' | 'none'; num_layers truncates the stack.
        positions: [T] int64 on the model's device, where the tokens sit in the cache (the
        static step, a tree), or [B, T], each row's RoPE positions with the tokens written
        to slots start..start+T-1 (padded rows); default start..start+T-1. kv_len: the
        cache slots read (default start + T). mask: a boolean visibility ([T, kv_len] or
        per row); default, for [T] positions, key j visible iff j <= the query's position,
        and for [B, T] positions every slot (give a mask with them). rope: [T] RoPE positions
        of tokens whose slots are `positions` (a tree: context length + depth; give the
        tree's mask with them). rows: [R] the cache rows of a batched step's requests
        (stock/batch.py), with positions [R, T] each token's own slot and RoPE position,
        kv_len and the step's mask [R, T, kv_len]; a hybrid target's GDN layers then step
        from each row's committed state (the cache's `commit_rows` keeps what is accepted)."""
        b, t = ids.shape
        if rows is not None:
            if positions is None or positions.dim() != 2 or mask is None or kv_len is None:
                raise ValueError("a batched step gives each row's positions [R, T], kv_len "
                                 "and its mask")
            cos, sin, mask_g, x = body.step_inputs(self, ids, positions, kv_len, mask,
                                                   mask=False)
            x, hidden = body.eager_layers(self, x, cos, sin, cache, positions, kv_len, mask_g,
                                          hidden_layers, num_layers, rows=rows)
            return self._head(x, hidden, logits)
        default = positions is None
        if self.cfg.hybrid and (mask is not None or rope is not None
                                or (positions is not None and positions.dim() == 2)):
            raise StockError("a hybrid target's GDN layers step from the committed state in "
                             "order: trees and padded rows are not supported on it yet")
        if positions is None or positions.dim() == 2:
            cache.check_room(start, t)
            slots = torch.arange(start, start + t, device=ids.device)
            positions = slots if positions is None else positions
        else:
            slots = positions
        kv_len = start + t if kv_len is None else kv_len
        if mask is not None:
            seen = mask
        elif positions.dim() == 2 or (default and t == 1 and kv_len == start + 1):
            seen = None   # one new token at the context's end, or rows given their own
        else:
            seen = body.visible(slots, kv_len)
        if rope is not None and mask is None:
            raise ValueError("rope positions of their own need the step's mask")
        cos, sin, mask_g, x = body.step_inputs(self, ids, positions if rope is None else rope,
                                               kv_len, seen, mask=False)
        # GDN layers: a static step's start is a device tensor (its positions); they trust
        # it to be the committed length, which the commit checks
        x, hidden = body.eager_layers(self, x, cos, sin, cache, slots, kv_len, mask_g,
                                      hidden_layers, num_layers,
                                      start=start if default else None)
        return self._head(x, hidden, logits)

    def _head(self, x: torch.Tensor, hidden: dict, logits: str) -> Output:
        if logits == "none":
            return Output(None, hidden)
        if logits == "last":
            x = x[:, -1:]
        return Output(self.lm_head(self.model.norm(x)).float(), hidden)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor],
                        device="cpu", dtype=torch.float32) -> "Transformer":
        with torch.device("meta"):
            model = cls(cfg)
        state = adapt(cfg, state) if cfg.hybrid else dict(state)
        if cfg.tie_embeddings:
            state.pop("lm_head.weight", None)
        check_tensors(model, state)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise StockError(f"weights do not match the config: missing {missing[:4]}, "
                             f"unexpected {unexpected[:4]}")
        if cfg.tie_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model = model.to(device=device, dtype=dtype)
        model.setup_rope()
        return model.eval()

    @classmethod
    def from_folder(cls, folder: Path, device="cpu", dtype=torch.float32) -> "Transformer":
        cfg, state = load_config(folder), load_state_dict(folder)
        try:
            return cls.from_state_dict(cfg, state, device, dtype)
        except StockError as exc:
            raise StockError(f"{folder}: {exc}") from None

    @classmethod
    def random(cls, cfg: ModelConfig, device="cpu", dtype=torch.float32, seed: int = 0,
               std: float = 0.02) -> "Transformer":
        """Random weights directly on `device` (benchmarks of large configs, tests)."""
        with torch.device("meta"):
            model = cls(cfg).to(dtype)  # cast on meta: never materialise fp32 copies
        model = model.to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("A_log"):   # decay rates exp(A_log) in [1, 16)
                    p.uniform_(0.0, 2.77, generator=gen)
                elif name.endswith("dt_bias"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
            for mod in model.modules():
                if isinstance(mod, OffsetRMSNorm):   # stored as offsets from 1
                    mod.weight.zero_()
        if cfg.tie_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.setup_rope()
        return model.eval()
