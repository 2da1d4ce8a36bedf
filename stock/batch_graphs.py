"""Batched verification steps replayed from CUDA graphs (the BatchEngine's static path).

A `BatchRunner` owns one slot per shape it has run: (requests bucket B, tokens bucket T,
KV-length bucket), buckets as GraphRunner's. A slot's static input is one int64 buffer:
the B x T token ids (each request's [pending] + draft, padded with its last token), then
per request its start (committed length), its cache row and its real draft length k. The
step builds each row's positions (start + 0..T-1) and mask (key j visible iff j <= the
token's position) on the device, runs the batched forward (cache rows, stock/model.py; or,
with `compile`, stock/compiled.py's regions around SDPA over the rows, as the engine's steps),
and computes each request's acceptance there: `packed` [B, 1 + T] = (accepted draft tokens
n, then the target's argmax per position). Reading `packed[:R]` is the step's one host
synchronisation. With `hidden_layers` (a block drafter's) each slot also outputs those
layers' hidden states side by side, [B, T, layers * H] (`last.hidden` after a step).

Requests past the real count (the B bucket's padding) use the cache's spare last row, at
start 0: their writes land there and nothing reads them; so does the warm-up before a
capture. On a hybrid target (stock/hybrid_cache.py) each row's GDN layers read that row's
committed state and window (the spare row's stay empty: nothing commits them) and stage
into the slot's buffers, which the cache gets back after each replay (`restage_rows`) for
the engine's per-row commit. `capture=False` runs the same static step eagerly (any device:
how the CPU tests check its logic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from stock import compiled as compiled_step
from stock.cache import KVCache
from stock.errors import StockError
from stock.graphs import BUCKETS, MIN_KV, capture, kv_buckets
from stock.model import Transformer
from stock.profile import profile_active


class BatchGraphError(StockError):
    pass


def row_steps(starts: torch.Tensor, t: int, kv_len: int):
    """Each row's positions [R, t] (its start + 0..t-1) and visibility [R, t, kv_len] (key
    j visible iff j <= the token's position): a batched step's positions and mask."""
    pos = starts[:, None] + torch.arange(t, device=starts.device)
    return pos, torch.arange(kv_len, device=starts.device)[None, None, :] <= pos[:, :, None]


def request_buckets(max_batch: int) -> tuple[int, ...]:
    out, n = [], 1
    while n < max_batch:
        out.append(n)
        n *= 2
    return (*out, max_batch)


@dataclass
class BatchSlot:
    b: int
    t: int
    kv_len: int
    inp: torch.Tensor          # [b * t + 3 * b] int64: ids, starts, rows, ks
    packed: torch.Tensor | None = None
    hidden: torch.Tensor | None = None   # [b, t, layers * H]: the runner's hidden_layers
    graph: "torch.cuda.CUDAGraph | None" = None
    staged: dict | None = None   # a hybrid target's GDN staging: the slot's own buffers


class BatchRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_batch: int,
                 buckets: tuple[int, ...] = BUCKETS, capture: bool | None = None,
                 min_kv: int = MIN_KV, hidden_layers: tuple[int, ...] = (),
                 compile: bool = False, fused: bool = False, attention: str = "sdpa"):
        self.model, self.cache, self.max_batch = model, cache, max_batch
        # the layers through stock/compiled.py's regions (compiled in warm-up), multiplying
        # by the fused projection matrices with `fused`, attention through `attention`
        # ("triton": the split-KV kernel reading each request's row; "sdpa")
        self.compile, self.fused, self.attention = compile, fused, attention
        self.hidden_layers = tuple(hidden_layers)   # every slot's extra output (a drafter's)
        self.spare = cache.k[0].shape[0] - 1   # the cache's last row: padding's scratch
        if self.spare < max_batch:
            raise BatchGraphError(f"the cache needs a spare row past the {max_batch} requests")
        self.device = model.device
        self.hybrid = hasattr(cache, "restage_rows")   # GDN layers: staged per step
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise BatchGraphError("CUDA graphs need a CUDA device")
        self.buckets, self.b_buckets = tuple(sorted(buckets)), request_buckets(max_batch)
        self.kv_buckets = kv_buckets(cache.max_len, min_kv)
        self.slots: dict[tuple[int, int, int], BatchSlot] = {}
        # a step's inputs staged on the host, one buffer a (B, T) bucket: pinned on CUDA so
        # that their copy is queued behind the drafts without the host waiting for them
        self._host: dict[tuple[int, int], torch.Tensor] = {}
        # (B, T) -> a pinned host copy of a step's results and its event (`read_after`)
        self._out: dict[tuple[int, int], tuple[torch.Tensor, "torch.cuda.Event"]] = {}
        self._before_read: Callable[[BatchSlot, int], None] | None = None
        self._pool = None
        self.last: BatchSlot | None = None   # the slot of the last step

    @staticmethod
    def _fit(buckets, n: int, what: str) -> int:
        for b in buckets:
            if b >= n:
                return b
        raise BatchGraphError(f"{what} {n} exceeds the largest bucket ({buckets[-1]})")

    def slot(self, b: int, t: int, kv_len: int) -> BatchSlot:
        key = (b, t, kv_len)
        s = self.slots.get(key)
        if s is None:
            with torch.inference_mode():
                inp = torch.zeros(b * t + 3 * b, dtype=torch.long, device=self.device)
            s = self.slots[key] = BatchSlot(b, t, kv_len, inp)
            if self.capture:
                self._capture(s)
        return s

    @torch.inference_mode()
    def _compute(self, s: BatchSlot):
        b, t = s.b, s.t
        ids = s.inp[:b * t].view(b, t)
        starts, rows, ks = s.inp[b * t:].view(3, b)
        steps = torch.arange(t, device=self.device)
        pos, seen = row_steps(starts, t, s.kv_len)
        if self.compile and not profile_active():
            out = compiled_step.forward(self.model, ids, pos, self.cache, s.kv_len,
                                        self.hidden_layers, attention=self.attention,
                                        fused=self.fused, seen=seen, rows=rows)
        else:
            out = self.model(ids, self.cache, 0, positions=pos, kv_len=s.kv_len, mask=seen,
                             rows=rows, logits="all", hidden_layers=self.hidden_layers)
        target = out.logits.argmax(-1)                                    # [b, t]
        match = (ids[:, 1:] == target[:, :-1]) & (steps[None, :-1] < ks[:, None])
        n = match.long().cumprod(1).sum(1, keepdim=True)
        hidden = (torch.cat([out.hidden[i] for i in self.hidden_layers], dim=-1)
                  if self.hidden_layers else None)
        if self.hybrid:   # this run's GDN staging buffers (the graph's, once captured)
            s.staged = self.cache.take_staged()
        return torch.cat([n, target], dim=1), hidden

    def _scratch(self, s: BatchSlot) -> None:
        with torch.inference_mode():
            s.inp.zero_()
            s.inp[s.b * s.t + s.b:s.b * s.t + 2 * s.b] = self.spare

    def _capture(self, s: BatchSlot) -> None:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self._scratch(s)   # warm-up and capture write only the spare row
        s.graph, (s.packed, s.hidden) = capture(lambda: self._compute(s), self.device,
                                                self._pool)
        if self.hybrid:   # the spare row's staging: nothing commits it
            self.cache.discard_staged()

    def capture_upto(self, end: int, t_max: int) -> int:
        """Make (on CUDA: capture) every slot a step of at most `t_max` tokens per request
        whose context stays below `end` can meet: every requests bucket, every tokens bucket
        up to t_max's, every KV bucket up to end + that bucket's. Returns how many exist."""
        t_top = self._fit(self.buckets, t_max, "a step of")
        last = self._fit(self.kv_buckets, min(end + t_top, self.cache.max_len), "a context of")
        for b in self.b_buckets:
            for t in (x for x in self.buckets if x <= t_top):
                for kv in (x for x in self.kv_buckets if x <= last):
                    self.slot(b, t, kv)
        return len(self.slots)

    def read_after(self, fn: Callable[[BatchSlot, int], None]) -> None:
        """Queue fn(slot, r) behind the next `step` before the host waits for its results
        (work on the device that reads the step's outputs there, e.g. a drafter's context
        update); the results then come back through a pinned buffer while fn's work runs.
        One step only."""
        self._before_read = fn

    def step(self, seqs: list[list[int]], starts: list[int], rows: list[int],
             chains: torch.Tensor | None = None) -> list[list[int]]:
        """Verify each request's [pending] + draft at its start in its row; per request
        [n, target tokens...] (n accepted draft tokens, then the T argmaxes). `chains`
        [n, D] on the device (a batch drafter's top-1 chains, `draft_chains`): request i < n
        verifies the first len(seqs[i]) - 1 of chains[i] as its draft, copied into the
        slot on the device (seqs[i] past its pending token then only gives the length);
        positions past a draft are padding either way, never accepted nor committed.
        Work given to `read_after` is queued behind it before the host reads."""
        before_read, self._before_read = self._before_read, None
        if self.hybrid:   # the last step's GDN states were committed (before a capture
            self.cache.check_committed()   # below discards its own staging)
        r = len(seqs)
        t = self._fit(self.buckets, max(len(x) for x in seqs), "a step of")
        b = self._fit(self.b_buckets, r, "a batch of")
        kv = self._fit(self.kv_buckets, max(starts) + t, "a context of")
        s = self.slot(b, t, kv)
        host = self._host.get((b, t))
        if host is None:   # reused every step: the last step's copy ended before its read
            host = self._host[(b, t)] = torch.zeros(b * t + 3 * b, dtype=torch.long,
                                                    pin_memory=self.device.type == "cuda")
        buf = host.numpy()
        buf[:] = 0
        for i, seq in enumerate(seqs):
            buf[i * t:i * t + len(seq)] = seq
            buf[i * t + len(seq):(i + 1) * t] = seq[-1]
        buf[b * t:b * t + r] = starts
        buf[b * t + b:b * t + b + r] = rows
        buf[b * t + b + r:b * t + 2 * b] = self.spare       # padding requests: the spare row
        buf[b * t + 2 * b:b * t + 2 * b + r] = [len(x) - 1 for x in seqs]
        with torch.inference_mode():
            s.inp.copy_(host, non_blocking=host.is_pinned())
            if chains is not None:   # the drafts, device to device (ids as int64)
                w = min(t - 1, chains.shape[1])
                s.inp[:b * t].view(b, t)[:chains.shape[0], 1:1 + w].copy_(chains[:, :w])
        if s.graph is not None:
            s.graph.replay()
            if s.staged is not None:   # the commit reads what this replay staged
                self.cache.restage_rows(s.staged)
        else:
            s.packed, s.hidden = self._compute(s)
        self.last = s
        if before_read is None or self.device.type != "cuda":
            if before_read is not None:
                before_read(s, r)
            return s.packed[:r].tolist()   # the one host sync of a step
        out = self._out.get((b, t))
        if out is None:   # read after its event every step: free again by the next
            out = self._out[(b, t)] = (torch.zeros(b, t + 1, dtype=torch.long,
                                                   pin_memory=True), torch.cuda.Event())
        out[0].copy_(s.packed, non_blocking=True)
        out[1].record()
        before_read(s, r)   # queued behind the copy: the host waits for the copy only
        out[1].synchronize()   # the one host sync of a step
        return out[0][:r].tolist()
