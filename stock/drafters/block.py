"""Block drafter (DFlash-style): a whole block of draft tokens from one forward.

A few transformer layers at the target's width. Their context is not the drafter's own past
but the target's: the hidden states of chosen target layers at every committed position are
concatenated, projected to the width by a linear (`fc`) and normalised, and every drafter
layer projects them with its own k/v weights into extra keys and values (kept in a context
cache and extended as tokens are committed). The block is the last accepted token (the
engine's pending token, embedded by the target's frozen embedding) followed by
`block_size - 1` positions holding one learned mask embedding; attention inside the block is
bidirectional. The output at block position j, through the target's frozen final head,
predicts the token j + 1 places after the pending token, so one forward proposes up to
`block_size` tokens. Only the drafter's own weights are saved (`stock.drafters.block_weights`);
the embedding and head are the target's.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn

from stock.config import ModelConfig
from stock.drafters.base import DraftContext, DraftLattice, Drafter
from stock.drafters.block_step import block_context, pack_lattice, packed_step, rms
from stock.errors import StockError
from stock.layers import MLP, RMSNorm, apply_rope
from stock.linear import Linear, linear
from stock.options import register

register("block_size", int, 16, "block drafter: positions per drafter forward (the pending "
         "token and block_size - 1 masks); it proposes up to block_size tokens", min=1, max=256)
register("block_topk", int, 4, "block drafter: tokens kept per position in its draft lattice",
         min=1, max=64)
register("block_graphs", bool, True, "block drafter: replay its step (context update, block "
         "forward, top-k) from a CUDA graph per key-length bucket; used on CUDA only, ignored "
         "on CPU (eager)")
register("block_compile", bool, True, "block drafter: its forwards (the single-request "
         "step, the batched draft and context update) through torch.compile'd regions where "
         "option compile is on; off: the same regions eagerly, inside its CUDA graphs; used "
         "on CUDA only, ignored on CPU", devices=("cuda",))
register("batch_chain_device", bool, True, "block drafter batched (the batched engine): its "
         "top-1 chains go from its forward to the verify step on the device (no host read of "
         "its lattices between them); off: read to the host every step; used on the static "
         "path (CUDA graphs) only", devices=("cuda",))
register("batch_overlap", bool, True, "block drafter batched, static path: its context "
         "update is queued behind the verify step before the host reads the step's "
         "acceptance (the update reads the accepted counts on the device, the host waits "
         "for the verify only); off: queued after the read, the GPU idle in between")
register("batch_draft_ahead", bool, False, "block drafter batched, static path with "
         "batch_chain_device and batch_overlap: the next step's drafts are queued as soon as "
         "the host has read a step's acceptance, before its bookkeeping, and the next step "
         "takes them where its requests are the same or fewer (else it drafts again); off: "
         "drafted at the next step's start")
register("block_weights", str, "", "block drafter: folder with manifest.json and safetensors "
         "shards; empty: the weights shipped for the embedded model")


class BlockDrafterError(StockError):
    pass


class BlockConfig(BaseModel):
    """Shape of a block drafter; persisted in its manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_layers: tuple[int, ...]  # target layers whose outputs form the context
    num_layers: int = 3
    block_size: int = 16
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    qk_norm: bool

    @classmethod
    def for_target(cls, cfg: ModelConfig, num_layers: int = 3, block_size: int = 16,
                   target_layers: tuple[int, ...] | None = None,
                   num_target_layers: int = 4) -> "BlockConfig":
        """Context layers spread from shallow to deep by default (1 .. L-2)."""
        if target_layers is None:
            lo, hi = min(1, cfg.num_layers - 1), max(cfg.num_layers - 2, 0)
            n = max(1, min(num_target_layers, cfg.num_layers))
            target_layers = tuple(sorted({round(lo + (hi - lo) * i / max(n - 1, 1))
                                          for i in range(n)}))
        bad = [i for i in target_layers if not 0 <= i < cfg.num_layers]
        if bad or not target_layers:
            raise BlockDrafterError(f"target layers {list(target_layers)} outside "
                                    f"0..{cfg.num_layers - 1}")
        if num_layers < 1 or block_size < 1:
            raise BlockDrafterError("need num_layers >= 1 and block_size >= 1")
        return cls(target_layers=tuple(target_layers), num_layers=num_layers,
                   block_size=block_size, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads,
                   num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps, qk_norm=cfg.qk_norm)

    def layer_config(self) -> ModelConfig:
        return ModelConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, vocab_size=self.vocab_size,
                           rms_norm_eps=self.rms_norm_eps, qk_norm=self.qk_norm,
                           arch="qwen3" if self.qk_norm else "llama")

    def check_target(self, cfg: ModelConfig) -> None:
        mine = (self.hidden_size, self.vocab_size, self.num_heads, self.num_kv_heads, self.head_dim)
        theirs = (cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if mine != theirs or max(self.target_layers) >= cfg.num_layers:
            raise BlockDrafterError(
                f"block drafter built for hidden/vocab/heads/kv/head_dim {mine} and layers "
                f"{list(self.target_layers)}; the target has {theirs} and {cfg.num_layers} layers")


class ContextAttention(nn.Module):
    """Attention whose keys/values are the projected target context, then the block's own."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, S, H] -> k, v [B, Hkv, S, D] (k rotated at the given positions)."""
        b, s, _ = x.shape
        k = self.k_proj(x).view(b, s, self.hkv, self.d)
        v = self.v_proj(x).view(b, s, self.hkv, self.d)
        if self.qk_norm:
            k = self.k_norm(k)
        return apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d)
        if self.qk_norm:
            q = self.q_norm(q)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k, v = self.kv(x, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=self.h != self.hkv)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d))


class BlockLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = ContextAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockNet(nn.Module):
    """The drafter's own weights (what the weights file holds)."""

    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg
        lc = cfg.layer_config()
        h = cfg.hidden_size
        self.fc = Linear(len(cfg.target_layers) * h, h, bias=False)
        self.context_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(h))
        self.layers = nn.ModuleList(BlockLayer(lc) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)

    def resized(self, block_size: int) -> "BlockNet":
        """The same weights drafting blocks of another size (trained at cfg.block_size)."""
        if block_size < 1:
            raise BlockDrafterError("block_size must be at least 1")
        self.cfg = self.cfg.model_copy(update={"block_size": block_size})
        return self

    def init_weights(self, seed: int, std: float = 0.02) -> "BlockNet":
        gen = torch.Generator(device=self.fc.weight.device).manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
        return self

    def init_from_target(self, target, layers: tuple[int, ...] | None = None) -> "BlockNet":
        """Start from the target's own layers instead of random weights.

        Drafter layer i becomes a copy of target layer `layers[i]` (default: the last
        num_layers layers): q/k/v/o projections (the k/v projections also turn the context
        into keys and values, as the target's do for its own past), q/k norms, MLP and both
        norms. `fc` selects the deepest context layer's hidden state (identity on its block,
        zero on the others, which still get gradients) and `context_norm` takes the mean of
        the chosen layers' input norms, so each layer's context keys/values start as the
        target's layer would compute them from that state. The final norm is the target's."""
        cfg = self.cfg
        n = target.cfg.num_layers
        if layers is None:
            layers = tuple(range(n - cfg.num_layers, n))
        layers = tuple(int(i) for i in layers)
        if len(layers) != cfg.num_layers or any(not 0 <= i < n for i in layers):
            raise BlockDrafterError(f"init from target layers {list(layers)}: need "
                                    f"{cfg.num_layers} layers in 0..{n - 1}")
        cfg_t = target.cfg
        if (cfg_t.hidden_size, cfg_t.intermediate_size, cfg_t.qk_norm) != (
                cfg.hidden_size, cfg.intermediate_size, cfg.qk_norm):
            raise BlockDrafterError("init from target: the drafter's layer shapes differ "
                                    "from the target's")
        h = cfg.hidden_size
        with torch.no_grad():
            for mine, i in zip(self.layers, layers):
                theirs = target.model.layers[i].state_dict()
                own = mine.state_dict()
                if set(own) != set(theirs):
                    raise BlockDrafterError(f"init from target layer {i}: parameters "
                                            f"{sorted(set(own) ^ set(theirs))} differ")
                for name, p in own.items():
                    p.copy_(theirs[name].to(p.dtype))
            deepest = max(range(len(cfg.target_layers)), key=lambda j: cfg.target_layers[j])
            self.fc.weight.zero_()
            self.fc.weight[:, deepest * h:(deepest + 1) * h].copy_(
                torch.eye(h, dtype=self.fc.weight.dtype))
            norms = torch.stack([target.model.layers[i].input_layernorm.weight.float()
                                 for i in layers])
            self.context_norm.weight.copy_(norms.mean(0))
            self.norm.weight.copy_(target.model.norm.weight.float())
        return self

    def features(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """Target hidden states (one [B, S, H] per chosen layer) -> context [B, S, H]."""
        return self.context_norm(self.fc(torch.cat(hidden, dim=-1)))

    def context_kv(self, feat: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return [layer.self_attn.kv(feat, cos, sin) for layer in self.layers]

    def forward(self, x: torch.Tensor, cos, sin, ctx_kv, mask=None) -> torch.Tensor:
        """x [B, T, H] block inputs; ctx_kv per layer (k, v) [B, Hkv, S, D]; -> normed [B, T, H]."""
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def block_inputs(self, anchor_embeds: torch.Tensor) -> torch.Tensor:
        """anchor_embeds [..., H] -> [..., block_size, H]: the anchor then mask embeddings."""
        t = self.cfg.block_size
        masks = self.mask_embedding.to(anchor_embeds.dtype).expand(
            *anchor_embeds.shape[:-1], t - 1, anchor_embeds.shape[-1])
        return torch.cat([anchor_embeds.unsqueeze(-2), masks], dim=-2)


class BlockDrafter(Drafter):
    """The engine-facing adapter: keeps the projected target context, drafts one block.

    The context cache: per drafter layer K/V [1, Hkv, slots, D]; positions [0, ctx_len) hold
    the projected target context, and the block's own K/V are written right after it (slots
    [ctx_len, ctx_len + T)), so attention reads a fixed-length prefix of the cache (the
    smallest bucket of `stock.graphs.kv_buckets` holding ctx_len + T) under an additive mask
    built on the device. The step's inputs (pending token, context start and end) sit in one
    device buffer, staged through pinned memory on CUDA (no host sync); the lattice's top-k
    ids and log-probs come back to the host in one transfer.

    Two step paths:

    - plain (`static` off; CPU by default): `extend` writes the newly committed span's
      context (n rows: one GEMM for every layer's k/v, one RoPE), then `_forward` runs the
      block;
    - fixed-shape (`static`; implied by `graphs` and `compiled`): the committed span's hidden
      states go into a static buffer with one launch and stock/drafters/block_step.py's
      `packed_step` does the context update (always block_size + 1 rows), the block forward
      and the top-k. With `graphs` (option block_graphs, CUDA) that step is replayed from a
      CUDA graph per key bucket; with `compiled` (the engine's option `compile`, CUDA) its
      regions are torch.compile'd. The prompt's context (longer than the step's rows) is
      written by `extend` first, eagerly.

    The fused weights are copies taken at construction: build the drafter after training."""

    name = "block"

    def __init__(self, net: BlockNet, target, max_len: int, topk: int = 4,
                 graphs: bool = False, compiled: bool = False, static: bool = False):
        from stock.graphs import kv_buckets  # lazy: stock.graphs imports the model stack

        cfg = net.cfg
        cfg.check_target(target.cfg)
        p = next(net.parameters())
        if p.device != target.device or p.dtype != target.dtype:  # leave the caller's net be
            net = copy.deepcopy(net).to(device=target.device, dtype=target.dtype)
        self.net = net.eval()
        self.target, self.topk, self.max_len = target, topk, max_len
        self.hidden_layers = tuple(cfg.target_layers)
        t = cfg.block_size
        self.rows = t + 1  # the fixed-shape step's context rows: the longest committed span
        dev, dt = target.device, target.dtype
        # room for the block's own K/V after a full context, and for a fixed-shape context
        # update that starts at the last context position
        self.slots = max_len + self.rows
        self.kv_buckets = kv_buckets(self.slots)
        n_layers, hkv, d = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        shape = (1, hkv, self.slots, d)
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in range(n_layers)]
        self.ctx_len = 0  # positions [0, ctx_len) hold the target context
        with torch.no_grad():
            attn = [layer.self_attn for layer in net.layers]
            # context k/v of every layer in one GEMM: rows (layer, k|v, head, dim)
            self._ctx_w = torch.cat([w for a in attn for w in (a.k_proj.weight, a.v_proj.weight)])
            self._qkv_w = [torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                           for a in attn]
            self._gate_up_w = [torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])
                               for layer in net.layers]
            self._ctx_knorm = (torch.stack([a.k_norm.weight for a in attn])[:, None, None]
                               if cfg.qk_norm else None)
            masks = net.mask_embedding.to(dt)[None].expand(t - 1, -1)
            self._masks = masks.contiguous()  # block rows 1 .. T-1
        self._steps = torch.arange(t, device=dev)
        self._rows = torch.arange(self.rows, device=dev)
        self._keys = torch.arange(self.slots, device=dev)
        with torch.inference_mode():
            self._inp = torch.zeros(3, dtype=torch.long, device=dev)  # pending, start, end
            # the fixed-shape step's context input: target hidden states side by side
            self._feat_in = torch.zeros(self.rows, len(self.hidden_layers) * cfg.hidden_size,
                                        device=dev, dtype=dt)
        self._host = (torch.zeros(3, dtype=torch.long, pin_memory=True)
                      if dev.type == "cuda" else None)
        if (graphs or compiled) and dev.type != "cuda":
            raise BlockDrafterError("block_graphs and compile need a CUDA device")
        self.graphs, self.compiled = graphs, compiled
        self.static = bool(static or graphs or compiled)
        self._copied = None  # CUDA event after the last staged copy of the step inputs
        # (kv bucket, top-1 chain only) -> (CUDA graph, its output: the packed lattice or chain)
        self._graphs: dict[tuple[int, bool], tuple] = {}
        self._pool = None

    def reset(self) -> None:
        self.ctx_len = 0

    def _rope_at(self, pos: torch.Tensor):
        pos = pos.clamp(max=self.target.cfg.max_position - 1)
        return self.target.cos[pos][None, None], self.target.sin[pos][None, None]

    def kv_bucket(self, end: int) -> int:
        for b in self.kv_buckets:
            if b >= end:
                return b
        raise BlockDrafterError(f"block drafter: {end} positions exceed its {self.slots} slots")

    def _span(self, hidden: dict[int, torch.Tensor], end: int) -> int:
        """Rows n of the committed span [end - n, end) in `hidden`, checked against the
        context (0: nothing new)."""
        if not hidden:
            if self.ctx_len != end:
                raise BlockDrafterError(
                    f"block drafter: no target hidden states for positions {self.ctx_len}.."
                    f"{end - 1}; the engine must request layers {list(self.hidden_layers)}")
            return 0
        missing = [layer for layer in self.hidden_layers if layer not in hidden]
        if missing:
            raise BlockDrafterError(f"block drafter: target hidden states of layers {missing} "
                                    "were not passed")
        n = hidden[self.hidden_layers[0]].shape[1]
        start = end - n
        if start < 0 or start > self.ctx_len or end > self.max_len:
            raise BlockDrafterError(f"block drafter: hidden states for positions {start}..{end - 1} "
                                    f"do not extend its context of {self.ctx_len} positions")
        return n

    @torch.inference_mode()
    def extend(self, hidden: dict[int, torch.Tensor], end: int) -> None:
        """Write the context of positions [end - n, end) from the target's hidden states.

        Positions past `end` that were written before (rejected tokens, the last block) are
        simply no longer read: the context is rolled back by length, like the target's KV
        cache, and the attention mask stops at the context's end."""
        n = self._span(hidden, end)
        if not n:
            return
        dt = self.target.dtype
        feat_in = torch.cat([hidden[layer][0].to(dt) for layer in self.hidden_layers], dim=-1)
        pos = torch.arange(end - n, end, device=self.target.device)
        cos, sin = self._rope_at(pos)
        # the fixed-shape step's context update, here for the span's n rows
        block_context(feat_in, self.net.fc, self.net.context_norm, self._ctx_w,
                      self._ctx_knorm, cos, sin, pos, self.k, self.v)
        self.ctx_len = end

    def _load(self, pending: int, start: int | None = None) -> None:
        """The step's inputs into the device buffer: pending id, the start of the context
        rows the fixed-shape step writes (default: none, start = end) and the context's end.
        No host sync (pinned, async on CUDA; the staging buffer is rewritten only after the
        step's lattice was read)."""
        vals = (pending, self.ctx_len if start is None else start, self.ctx_len)
        if self._host is None:
            self._inp.copy_(torch.tensor(vals, dtype=torch.long))
        else:
            if self._copied is not None:  # done long ago after draft()'s host read; a
                self._copied.synchronize()  # second block_logits() call may still wait
            self._host.numpy()[:] = vals  # no tensor built from a list (as GraphRunner.load)
            self._inp.copy_(self._host, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def _forward(self, kv_len: int) -> torch.Tensor:
        """fp32 logits [T, vocab] of the block after self._inp's pending token at position
        self._inp[2]; attention reads cache slots [0, kv_len)."""
        net, cfg = self.net, self.net.cfg
        t, h, hkv, d = cfg.block_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        g, eps = h // hkv, cfg.rms_norm_eps
        ctx_len = self._inp[2]
        pos = ctx_len + self._steps  # the block's positions (its K/V slots too)
        cos, sin = self._rope_at(pos)
        keys = self._keys[:kv_len]
        zero = torch.zeros((), dtype=self.target.dtype, device=pos.device)
        # the context and the whole block (bidirectional): keys before ctx_len + T
        mask = torch.where(keys < ctx_len + t, zero, torch.full_like(zero, float("-inf")))
        mask = mask.view(1, 1, 1, kv_len)
        x = torch.cat([self.target.model.embed_tokens(self._inp[:1]), self._masks])[None]
        for i, layer in enumerate(net.layers):
            attn = layer.self_attn
            y = layer.input_layernorm(x)
            q, k, v = linear(y, self._qkv_w[i]).view(1, t, h + 2 * hkv, d).split(
                [h, hkv, hkv], dim=2)
            if cfg.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = apply_rope(q.transpose(1, 2), cos, sin)
            k = apply_rope(k.transpose(1, 2), cos, sin)
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v.transpose(1, 2))
            # [1, H, T, D] -> [1, Hkv, G*T, D]: query head j uses K/V head j // G (as
            # enable_gqa) without repeating K/V; every query row has the same mask
            qg = q.reshape(1, hkv, g * t, d)
            out = F.scaled_dot_product_attention(qg, self.k[i][:, :, :kv_len],
                                                 self.v[i][:, :, :kv_len], attn_mask=mask)
            x = x + attn.o_proj(out.view(1, h, t, d).transpose(1, 2).reshape(1, t, h * d))
            gate, up = linear(layer.post_attention_layernorm(x), self._gate_up_w[i]).chunk(2, -1)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        return self.target.lm_head(rms(x[0], net.norm.weight, eps)).float()

    @torch.inference_mode()
    def block_logits(self, pending: int, k: int | None = None) -> torch.Tensor:
        """fp32 logits [k, vocab] (default k: block_size) for the tokens after `pending`
        (at ctx_len), by the plain path; the block always has block_size positions, as in
        training."""
        self._load(pending)
        return self._forward(self.kv_bucket(self.ctx_len + self.net.cfg.block_size))[:k]

    def _packed(self, kv_len: int, top1: bool = False) -> torch.Tensor:
        """The packed lattice [2, T, topk] float64 on the device (block_step.pack_lattice),
        or with `top1` only the top-1 chain [T] (int64): the fixed-shape step (context update
        included) where `static`, else the block forward."""
        if self.static:
            return packed_step(self, kv_len, self.compiled, top1)
        logits = self._forward(kv_len)
        return logits.argmax(-1) if top1 else pack_lattice(logits, self.topk)

    def _replay(self, kv_len: int, top1: bool = False) -> torch.Tensor:
        """The packed lattice (`top1`: the chain) from this bucket's CUDA graph, captured on
        first use (after two warm-up runs on a side stream, where compiled regions compile;
        they and the capture write K/V only at the step's own positions, with the step's own
        inputs, so the replay rewrites the same values)."""
        entry = self._graphs.get((kv_len, top1))
        if entry is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            main = torch.cuda.current_stream(self.target.device)
            side = torch.cuda.Stream(self.target.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._packed(kv_len, top1)
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._packed(kv_len, top1)
            entry = self._graphs[(kv_len, top1)] = (graph, out)
        entry[0].replay()
        return entry[1]

    @torch.inference_mode()
    def capture_upto(self, end: int, top1: bool = False) -> int:
        """Capture the CUDA graph of every key bucket that a step with its context ending
        before `end` can use (of the lattice, or with `top1` of the chain: `draft_chain`;
        benchmarks: no capture inside a timed run); returns how many graphs exist. Between
        requests only: the warm-ups and replays write K/V at the current context end, past
        the context."""
        if not self.graphs:
            return 0
        last = self.kv_bucket(min(end + self.net.cfg.block_size, self.slots))
        self._load(0)
        for b in self.kv_buckets:
            if b > last:
                break
            self._replay(b, top1)
        return len(self._graphs)

    @torch.inference_mode()
    def draft(self, ctx: DraftContext, k: int) -> DraftLattice:
        packed = self.draft_packed(ctx, k)
        if packed is None:
            return DraftLattice.empty(self.topk)
        both = packed.cpu()  # the step's only host read of the drafter
        return DraftLattice(both[0, :k].long(), both[1, :k].float())

    @property
    def packed_shape(self) -> tuple[int, int]:
        """(D, K) of `draft_packed`'s lattice: block_size positions, topk tokens each."""
        return self.net.cfg.block_size, self.topk

    @torch.inference_mode()
    def draft_packed(self, ctx: DraftContext, k: int) -> torch.Tensor | None:
        """The draft as the device holds it, with no host read: the packed lattice [2,
        block_size, topk] float64 (block_step.pack_lattice; rows past k are drafted too and
        mean nothing), or None when nothing is drafted (k <= 0). A static output, rewritten
        by the next draft: a consumer copies it (a tree step built on the device does)."""
        return self._draft_device(ctx, k, False)

    @torch.inference_mode()
    def draft_chain(self, ctx: DraftContext, k: int) -> torch.Tensor | None:
        """The draft's top-1 chain as the device holds it, with no host read: [block_size]
        token ids (int64; past k drafted too, meaning nothing), or None when nothing is
        drafted: the same step as `draft_packed`'s, ending in an argmax instead of the
        lattice's log-softmax and top-k (the lattice's top-1 but at ties, exact or within
        the log-softmax's rounding). A static output, rewritten by the next draft (the
        engine's chain step copies it into its own slot)."""
        return self._draft_device(ctx, k, True)

    def _draft_device(self, ctx: DraftContext, k: int, top1: bool) -> torch.Tensor | None:
        end = len(ctx.tokens) - 1
        k = min(k, self.net.cfg.block_size)
        n = self._span(ctx.hidden, end) if self.static and k > 0 else 0
        start = None
        if 0 < n <= self.rows:  # a step's committed span: the fixed-shape step writes it
            hid = [ctx.hidden[layer][0] for layer in self.hidden_layers]
            if hid[0].dtype == self._feat_in.dtype:
                torch.cat(hid, dim=-1, out=self._feat_in[:n])  # one launch
            else:
                self._feat_in[:n].copy_(torch.cat(hid, dim=-1))
            start, self.ctx_len = end - n, end
        else:  # the plain path, the prompt, or nothing new
            self.extend(ctx.hidden, end)
        if k <= 0:
            return None
        self._load(ctx.tokens[-1], start)
        kv_len = self.kv_bucket(self.ctx_len + self.net.cfg.block_size)
        return self._replay(kv_len, top1) if self.graphs else self._packed(kv_len, top1)
