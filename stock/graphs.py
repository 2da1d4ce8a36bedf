"""Verification steps replayed from CUDA graphs.

A `GraphRunner` owns one *slot* per shape it has run: (T bucket, KV-length bucket, hidden
layers asked for). A step of t tokens runs in the smallest T bucket >= t (1, 2, 4, ... 64):
the tokens are padded rather than losing the graph. Attention reads the smallest KV bucket
(256, 512, ... the cache's length) that holds the step's real tokens, so a short context does
not pay for reading the whole cache. A slot has static inputs (one int64 buffer: the T ids,
the start position and the real draft length k) and static outputs: logits [T, vocab] fp32,
the chosen hidden states, and `packed` [1 + T] int64 = (n, argmax of each row), where n is
the number of draft tokens accepted, computed on the device. Reading `packed[:t + 1]` is the
only host synchronisation of a step.

On CUDA (`capture=True`) each slot is captured once, after warm-up forwards on a side stream
(as torch.cuda.graphs requires), and replayed afterwards; all slots share one memory pool
(they never run concurrently). Warm-up and capture write K/V only into the cache's last
slots, which lie past `max_context` and are never committed, so a slot can be captured in
the middle of a request. With `capture=False` (any device) the same static forward runs
eagerly: on CPU that is how the tests check the step logic; on CUDA it is the reference the
graphs are checked against bit for bit.

`compile=True` runs the static forward's layers through torch.compile'd regions
(stock/compiled.py; the engine's option `compile`). Compilation happens in the first
warm-up forward of each T bucket, before any capture; the compiled kernels are then captured
into the slot's graph like any others.

On a hybrid target (stock/hybrid_cache.py) a slot also keeps its GDN layers' staging
buffers and hands them to the cache after each replay, so the engine's commit keeps the
state after the accepted tokens; the committed state's buffers never move.

`reset()` drops every graph, so a benchmark can swap modules (e.g. nn.Linear replaced by
another implementation) and capture again. Outputs are views of static buffers: valid until
the same slot runs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from stock.cache import ContextOverflow, KVCache
from stock.errors import StockError
from stock.model import Transformer
from stock.profile import profiling
from stock.static_step import static_forward

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_KV = 256
WARMUP = 2


class GraphError(StockError):
    pass


def capture(compute, device, pool):
    """`compute()` warmed up WARMUP times on a side stream (as torch.cuda.graphs requires;
    compiled regions compile there), then captured once into a CUDA graph in `pool`:
    (the graph, the captured run's outputs, which each replay rewrites)."""
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(main)
    with profiling(None), torch.cuda.stream(side):
        for _ in range(WARMUP):
            compute()
    main.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with profiling(None), torch.cuda.graph(graph, pool=pool):
        out = compute()
    return graph, out


def kv_buckets(max_len: int, smallest: int = MIN_KV) -> tuple[int, ...]:
    """Powers of two from `smallest` below `max_len`, then `max_len` itself."""
    out, n = [], smallest
    while n < max_len:
        out.append(n)
        n *= 2
    return (*out, max_len)


@dataclass
class StepOut:
    logits: torch.Tensor  # [T, vocab] fp32 (rows past the real tokens are padding)
    hidden: dict[int, torch.Tensor]  # layer -> [1, T, hidden]
    packed: torch.Tensor  # [1 + T] int64: accepted draft tokens n, then argmax per row


@dataclass
class Slot:
    t: int
    kv_len: int
    hidden_layers: tuple[int, ...]
    inp: torch.Tensor  # [t + 2] int64: ids, start, k
    host: torch.Tensor | None = None  # pinned staging copy of inp (CUDA)
    copied: "torch.cuda.Event | None" = None  # recorded after each copy out of `host`
    out: StepOut | None = None
    graph: "torch.cuda.CUDAGraph | None" = None
    replays: int = field(default=0)
    staged: dict | None = None  # a hybrid target's GDN staging (HybridCache), the slot's
    start: int = 0  # the loaded step's start (host copy)


class GraphRunner:
    def __init__(self, model: Transformer, cache: KVCache, max_context: int,
                 buckets: tuple[int, ...] = BUCKETS, capture: bool | None = None,
                 min_kv: int = MIN_KV, compile: bool = False, attention: str = "sdpa",
                 fused: bool = False):
        self.model, self.cache, self.max_context = model, cache, max_context
        self.compile = compile  # layers through stock/compiled.py (compiled in warm-up)
        self.attention = attention  # compiled layers' attention: "sdpa" or "triton"
        self.fused = fused  # compiled layers multiply by fused projection matrices
        self.buckets = tuple(sorted(buckets))
        self.device = model.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise GraphError("CUDA graphs need a CUDA device")
        if cache.max_len < max_context + self.buckets[-1]:
            raise GraphError(f"the cache ({cache.max_len} slots) needs {self.buckets[-1]} slots "
                             f"of slack past the context of {max_context} for padding")
        self.kv_buckets = kv_buckets(cache.max_len, min_kv)
        self.slots: dict[tuple, Slot] = {}
        self._pool = None

    # -- shapes --------------------------------------------------------------------------------
    def bucket(self, t: int) -> int:
        for b in self.buckets:
            if b >= t:
                return b
        raise GraphError(f"a step of {t} tokens exceeds the largest bucket ({self.buckets[-1]})")

    def kv_bucket(self, end: int) -> int:
        for b in self.kv_buckets:
            if b >= end:
                return b
        raise ContextOverflow(f"context of {end} tokens exceeds the cache's {self.cache.max_len}")

    def slot(self, t: int, kv_len: int, hidden_layers: tuple[int, ...] = ()) -> Slot:
        """The slot of bucket shape (t, kv_len), captured on first use when capturing."""
        key = (t, kv_len, tuple(hidden_layers))
        s = self.slots.get(key)
        if s is None:
            with torch.inference_mode():
                inp = torch.zeros(t + 2, dtype=torch.long, device=self.device)
            s = Slot(t, kv_len, tuple(hidden_layers), inp)
            if self.device.type == "cuda":
                s.host = torch.empty(t + 2, dtype=torch.long, pin_memory=True)
                s.copied = torch.cuda.Event()
            if self.capture:
                self._capture(s)
            self.slots[key] = s
        return s

    # -- running -------------------------------------------------------------------------------
    @torch.inference_mode()
    def _compute(self, s: Slot) -> StepOut:
        t = s.t
        ids = s.inp[:t].view(1, t)
        start, k = s.inp[t], s.inp[t + 1]
        steps = torch.arange(t, device=self.device)
        positions = start + steps
        out = static_forward(self.model, ids, positions, self.cache, s.kv_len, s.hidden_layers,
                             compiled=self.compile, attention=self.attention,
                             fused=self.fused)
        logits = out.logits[0]
        target = logits.argmax(-1)
        # draft token i (ids[i + 1]) is accepted iff it equals the target's choice at row i
        # and every earlier one was accepted; rows at or past the real draft length k never are
        match = (ids[0, 1:] == target[:-1]) & (steps[:-1] < k)
        n = match.long().cumprod(0).sum().view(1)
        if hasattr(self.cache, "take_staged"):   # hybrid: this run's GDN staging buffers
            s.staged = self.cache.take_staged()
        return StepOut(logits, out.hidden, torch.cat([n, target]))

    def _capture(self, s: Slot) -> None:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            s.inp.zero_()
            s.inp[s.t] = self.cache.max_len - s.t  # warm-up writes land in never-committed slots
        s.graph, s.out = capture(lambda: self._compute(s), self.device, self._pool)

    def load(self, s: Slot, ids: list[int], start: int, k: int | None = None) -> None:
        """Copy a step's inputs into the slot: ids padded to its T with the last id."""
        if not 0 < len(ids) <= s.t:
            raise GraphError(f"{len(ids)} tokens do not fit a slot of {s.t}")
        if start + len(ids) > min(self.max_context, s.kv_len):
            raise ContextOverflow(f"step [{start}, {start + len(ids)}) exceeds the context "
                                  f"({self.max_context}) or the slot's KV length ({s.kv_len})")
        k = len(ids) - 1 if k is None else k

        def fill(buf) -> None:
            n = len(ids)
            buf[:n] = ids
            buf[n:s.t] = ids[-1]
            buf[s.t], buf[s.t + 1] = start, k
        self.stage(s, fill, start)

    def stage(self, s: Slot, fill, start: int) -> None:
        """Write a step's inputs into the slot: `fill(buf)` writes them into the host staging
        array (a numpy view: cheaper on the host than building a tensor from a list every
        step), then one copy into the slot's input; on CUDA an async copy from pinned memory,
        no host sync."""
        if s.copied is not None:
            # CUDA: the last async copy out of the staging buffer must have run before the
            # buffer is rewritten. After a step whose result was read it has (no wait); steps
            # launched back to back on one slot without a read (a prompt prefilled in
            # chunks) wait here for the copy, not for the step.
            s.copied.synchronize()
        host = s.host if s.host is not None else torch.empty(s.inp.numel(), dtype=torch.long)
        fill(host.numpy())
        s.start = start
        with torch.inference_mode():
            s.inp.copy_(host, non_blocking=s.host is not None)
        if s.copied is not None:
            s.copied.record()

    def launch(self, s: Slot) -> StepOut:
        s.replays += 1
        if s.graph is not None:
            s.graph.replay()
        else:
            s.out = self._compute(s)
        if s.staged is not None:   # the commit reads what this replay staged
            self.cache.restage(s.staged, s.start)
        return s.out

    def step(self, ids: list[int], start: int, hidden_layers: tuple[int, ...] = (),
             k: int | None = None) -> StepOut:
        """Verify ids = [pending] + draft chain at positions start, start+1, ...; k (default:
        all but the first) bounds the draft tokens that may be accepted."""
        s = self.slot(self.bucket(len(ids)), self.kv_bucket(start + len(ids)), hidden_layers)
        self.load(s, ids, start, k)
        return self.launch(s)

    def chain_step(self, lattice: torch.Tensor, pending: int, start: int, k: int,
                   hidden_layers: tuple[int, ...] = ()) -> StepOut:
        """`step` for [pending] + the first k tokens of a drafter's chain on this device:
        its top-1 chain [D] (int64, `draft_chain`) or the top-1 tokens of its packed lattice
        [2, D, K] (stock/drafters/block_step.pack_lattice). The draft tokens are copied into
        the slot on the device, so the drafter's step and this one run back to back with no
        host read between them."""
        chain = lattice if lattice.dim() == 1 else lattice[0, :, 0]   # float64 ids are exact
        if not 0 < k <= chain.shape[0]:
            raise GraphError(f"a chain of {k} draft tokens from a draft of "
                             f"{chain.shape[0]} positions")
        s = self.slot(self.bucket(k + 1), self.kv_bucket(start + k + 1), hidden_layers)
        self.load(s, [pending] * (k + 1), start, k)   # placeholders for the draft tokens
        with torch.inference_mode():
            s.inp[1:k + 1].copy_(chain[:k])
        return self.launch(s)

    def capture_all(self, start: int, hidden_layers: tuple[int, ...] = ()) -> None:
        """Capture every T bucket for a step starting at `start` (benchmarks)."""
        for t in self.buckets:
            self.slot(t, self.kv_bucket(start + t), hidden_layers)

    def capture_upto(self, end: int, hidden_layers: tuple[int, ...] = ()) -> int:
        """Make every slot a step ending at or before `end` can use (so that no capture
        happens inside a timed run); returns how many slots exist."""
        last = self.kv_bucket(min(end, self.cache.max_len))
        for kv in self.kv_buckets:
            if kv > last:
                break
            for t in self.buckets:
                if t <= kv:
                    self.slot(t, kv, hidden_layers)
        return len(self.slots)

    def reset(self) -> None:
        """Drop every graph and static buffer (capture again on next use)."""
        self.slots.clear()
        self._pool = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
