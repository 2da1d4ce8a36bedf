"""Continuous batching: many requests in one static KV cache, one target forward a step.

`BatchEngine` holds up to `max_batch` requests, each in a row of one cache
([max_batch, Hkv, slots, D] per layer) with its own committed length. `submit` queues a
request; each `step()` first admits waiting requests into free rows, first come first
served (the admitted prompts prefilled together by the same batched forward, chunk by
chunk of `prefill_chunk` tokens, up to token_budget tokens a forward), then runs one
verification step for every active request at once: each request's [pending token] +
draft chain, padded to the longest (its padding written past its own tokens, never
committed), each row at its own positions, attention
per row over its own slots (the mask: key j visible to row r's token i iff
j <= length_r + i). Acceptance, commit and stop tests are per request; a finished request
leaves and its row is reused. With no drafter every request steps autoregressively (one
token a step). Every output equals the request's single-request greedy output (fp32:
tests/test_batch.py), because each row computes exactly what a step of its own would,
in a larger GEMM.

On CUDA (option `cuda_graphs`) verify steps replay CUDA graphs per (requests, tokens,
KV length) bucket with acceptance on the device (stock/batch_graphs.py); `static=True`
runs that static step eagerly on any device (the CPU tests of its logic). Prefill stays
the dynamic forward.

Drafters are per request (`drafter_factory()` builds one per admitted request, e.g. the
n-gram drafter; each drafts on the host from its own context), or one `batch_drafter` for
all rows (stock/drafters/block_batch.py: every row's block in one forward, fed each step's
committed target hidden states, which the verify step then also returns). On the static
path its top-1 chains go from its forward to the verify step's slot on the device, the
host never reading a lattice (option batch_chain_device; off, or for a mechanism that reads
the lattices, `draft` brings them to the host as before), and its context update of a
step's committed tokens is queued behind the verify step, reading the accepted counts on
the device, before the host waits for the step's results (option batch_overlap: the GPU
runs the update while the host reads them, instead of idling until the host queues it).

Hybrid GDN targets: each row's GDN layers step from that row's committed recurrent state
and conv window (stock/hybrid_cache.py, one row a request), and after every forward the
cache keeps, row by row, the state after what that row committed, as a single request's
step would (`commit_rows`); a row a new request takes starts from the empty state. Their
verify steps replay CUDA graphs too (the GDN staging is the slot's), through compiled
regions as a dense target's.

`BackgroundBatch` runs a BatchEngine in a thread and streams each request's tokens to its
caller (`stream`): what a server's many request handlers call at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from stock.batch_graphs import BatchRunner, row_steps
from stock.profile import profile_active
from stock.compiled import compile_enabled
from stock.drafters.base import DraftContext, Drafter
from stock.drafters.block_batch import BatchBlockDrafter
from stock.graphs import BUCKETS
from stock.errors import StockError
from stock.fused import fuse_projections
from stock.model import Transformer
from stock.options import Options


class BatchError(StockError):
    pass


@dataclass
class Request:
    prompt: list[int]
    max_new: int
    id: int = 0
    tokens: list[int] = field(default_factory=list)   # generated (a stop token included)
    accepted: list[int] = field(default_factory=list)  # tokens gained per step
    stop_reason: str = ""                              # "", length, stop, context
    row: int | None = None
    pending: int = -1
    drafter: Drafter | None = None
    on_tokens: Callable[[list[int]], None] | None = None
    submitted: float = 0.0

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)


class BatchEngine:
    def __init__(self, model: Transformer, options: Options | None = None, max_batch: int = 8,
                 max_context: int | None = None, stop_ids=frozenset(),
                 drafter_factory: Callable[[], Drafter | None] | None = None,
                 prefill_chunk: int = 256, token_budget: int = 4096,
                 static: bool | None = None, capture: bool | None = None,
                 batch_drafter: "BatchBlockDrafter | None" = None):
        if max_batch < 1:
            raise BatchError(f"max_batch must be at least 1, got {max_batch}")
        self.model, self.options = model, options or Options()
        self.max_batch, self.prefill_chunk, self.token_budget = max_batch, prefill_chunk, token_budget
        self.max_context = max_context or model.cfg.max_position
        self.stop_ids = frozenset(stop_ids)
        self.drafter_factory = drafter_factory or (lambda: None)
        # one drafter for every row (the block drafter: all rows' blocks in one forward),
        # fed each step's committed target hidden states; else drafters per request
        self.batch_drafter = batch_drafter
        if batch_drafter is not None and drafter_factory is not None:
            raise BatchError("give a batch drafter or a per-request drafter factory, not both")
        if batch_drafter is not None and batch_drafter.static and batch_drafter.spare < max_batch:
            raise BatchError(f"the batch drafter's static path needs a spare row past the "
                             f"{max_batch} requests (rows={max_batch + 1})")
        self.hidden_layers = tuple(batch_drafter.hidden_layers) if batch_drafter else ()
        self.hybrid = model.cfg.hybrid   # per-row recurrent state (stock/hybrid_cache.py)
        if static is None:
            static = model.device.type == "cuda" and self.options["cuda_graphs"]
        # a step's padding past a row's context: its draft, or the largest T bucket
        slack = BUCKETS[-1] if static else self.options["draft_len"] + 1
        # static steps: one spare row past the requests, where padding requests write
        self.cache = model.new_cache(self.max_context + slack, batch=max_batch + bool(static))
        # compiled regions as the single-request engine's (CUDA, option compile), fused
        # projections with them (views: the modules' outputs are unchanged)
        compiled = static and compile_enabled(self.options, model.device)
        fused = compiled and self.options["fuse_projections"]
        if fused:
            fuse_projections(model)
        self.runner = BatchRunner(model, self.cache, max_batch, capture=capture,
                                  hidden_layers=self.hidden_layers, compile=compiled,
                                  fused=fused, attention=self.options["attention_kernel"]
                                  if compiled else "sdpa") if static else None
        self.lengths = [0] * max_batch
        self._chains: torch.Tensor | None = None   # drafts on the device, _draft_seqs -> _run
        self._queued = False   # _run queued the drafter's context update (batch_overlap)
        # (requests, their chains on the device): drafts queued ahead (batch_draft_ahead)
        self._ahead: tuple[list[Request], torch.Tensor] | None = None
        self.rows: list[Request | None] = [None] * max_batch
        self.waiting: deque[Request] = deque()
        self._ids = 0

    def prepare(self, end: int | None = None) -> int:
        """Before serving: make (on CUDA: capture) every verification slot and every batch
        drafter slot a step whose contexts stay below `end` (default and at most
        max_context) can meet, and the slots of graph_prefill's chunks, as Engine.prepare
        does for one request, so no capture (nor a compile of a new shape) lands inside a
        served step. Returns how many slots exist (0 off the static path)."""
        if self.runner is None:
            return 0
        end = min(end or self.max_context, self.max_context)
        t_max = self.options["draft_len"] + 1
        if self.batch_drafter is not None:
            t_max = min(t_max, self.batch_drafter.net.cfg.block_size + 1)
        t_run = t_max   # the runner's steps: verification, and prefill chunks (_prefill)
        if self.options["graph_prefill"] and self.options["graph_prefill_max"] > 0:
            t_run = max(t_max, min(self.prefill_chunk, self.runner.buckets[-1],
                                   self.options["graph_prefill_max"]))
        n = self.runner.capture_upto(end, t_run)
        if self.batch_drafter is not None:   # its context update meets the runner's T
            top = self.runner._fit(self.runner.buckets, t_run, "a step of")   # buckets:
            n += self.batch_drafter.capture_upto(                  # verify, prefill chunks
                end, tuple(t for t in self.runner.buckets if t <= top),
                top1=self._chains_on_device())     # the drafts as the steps will take them
        return n

    # -- requests ----------------------------------------------------------------------------
    def submit(self, prompt: list[int], max_new: int,
               on_tokens: Callable[[list[int]], None] | None = None) -> Request:
        if not prompt:
            raise BatchError("empty prompt")
        if max_new < 1:
            raise BatchError("max new tokens must be at least 1")
        if len(prompt) >= self.max_context:
            raise BatchError(f"prompt of {len(prompt)} tokens does not fit the context of "
                             f"{self.max_context} tokens")
        self._ids += 1
        req = Request(list(prompt), max_new, self._ids, on_tokens=on_tokens,
                      submitted=time.perf_counter())
        self.waiting.append(req)
        return req

    @property
    def active(self) -> list[Request]:
        return [r for r in self.rows if r is not None]

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle:
            self.step()

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Admit what fits, then verify every active request once; returns the requests
        that finished in this step."""
        finished = self._admit()
        live = self.active
        if live:
            finished += self._verify(live)
        return finished

    def _take_rows(self) -> list[Request]:
        taken = []
        while self.waiting and None in self.rows:
            req = self.waiting.popleft()
            row = self.rows.index(None)
            req.row, self.rows[row] = row, req
            req.drafter = self.drafter_factory()
            if req.drafter is not None:
                req.drafter.reset()
            if self.batch_drafter is not None:
                self.batch_drafter.reset(row)
            taken.append(req)
        if self.hybrid and taken:   # a reused row's recurrent state is the last request's
            self.cache.reset_rows([r.row for r in taken])
        return taken

    def _admit(self) -> list[Request]:
        """Admit waiting requests into free rows, first come first served, and prefill them
        together: chunk c of every admitted prompt in one batched forward (rows padded to
        the longest chunk; padding lands past a row's tokens and is never committed), at
        most token_budget // prefill_chunk rows a forward."""
        admitted = self._take_rows()
        group = max(1, self.token_budget // self.prefill_chunk)
        finished = []
        for g in range(0, len(admitted), group):
            finished += self._prefill(admitted[g:g + group])
        return finished

    def _prefill(self, reqs: list[Request]) -> list[Request]:
        """The admitted prompts, chunk by chunk, all rows of a chunk in one forward. With
        option graph_prefill (where the static steps run: CUDA graphs) prompts of at most
        graph_prefill_max tokens go through the runner's static steps, in chunks of its
        largest tokens bucket (64), as the single-request engine prefills (stock/engine.py:
        on the H200 the dynamic forward's prefill of the embedded model took 18-40 ms at
        80-301 tokens against 2.5-6 ms in graph steps, and a new length's first one up to
        1.1 s); longer prompts, and every prefill while a profiler is active, go through the
        dynamic forward."""
        on = self.runner is not None and self.options["graph_prefill"] and not profile_active()
        top = self.options["graph_prefill_max"]
        graphed = [r for r in reqs if on and len(r.prompt) <= top]
        rest = [r for r in reqs if r not in graphed]
        return ((self._prefill_rows(graphed, True) if graphed else [])
                + (self._prefill_rows(rest, False) if rest else []))

    def _prefill_rows(self, reqs: list[Request], graphed: bool) -> list[Request]:
        c = min(self.prefill_chunk, self.runner.buckets[-1]) if graphed else self.prefill_chunk
        first: dict[int, int] = {}   # row -> the token after its prompt
        for s in range(0, max(len(r.prompt) for r in reqs), c):
            part = [r for r in reqs if len(r.prompt) > s]
            chunks = [r.prompt[s:s + c] for r in part]
            rows = [r.row for r in part]
            if graphed:   # per row [n, the argmax at each position]: its last chunk token's
                packed = self.runner.step(chunks, [s] * len(part), rows)
                tokens = [p[len(chunk)] for p, chunk in zip(packed, chunks)]
                hidden = self.runner.last.hidden
            else:
                logits, hidden = self._forward(chunks, rows, [s] * len(part), last=True)
                tokens = logits.argmax(-1).tolist()
            if self.hybrid:   # every chunk's tokens are committed: the next one reads them
                lens = [len(chunk) for chunk in chunks]
                self.cache.commit_rows(rows, lens, lens)
            for r, chunk, token in zip(part, chunks, tokens):
                if s + len(chunk) == len(r.prompt):
                    first[r.row] = token
            if hidden is not None and graphed:   # the step's hidden states, on the device:
                self.batch_drafter.extend_rows(   # one fixed-shape update (a graph replay)
                    rows, [s + len(c) for c in chunks], [len(c) for c in chunks], hidden)
            elif hidden is not None:
                self.batch_drafter.extend([(r.row, s + len(c), hidden[i, :len(c)])
                                           for i, (r, c) in enumerate(zip(part, chunks))])
        finished = []
        for req in reqs:
            self.lengths[req.row] = len(req.prompt)
            req.pending = first[req.row]
            if self._emit(req, [req.pending]):
                finished.append(req)
        return finished

    def _forward(self, seqs: list[list[int]], rows: list[int], starts: list[int],
                 last: bool = False):
        """Logits [R, T, vocab] of each row's tokens at its own positions (padded to T), or
        with `last` only at each row's last token, [R, vocab] (a prefill chunk: the head
        over one position a row, not over every prompt token), and the batch drafter's
        target layers' hidden states side by side [R, T, n * H] (None without one)."""
        dev = self.model.device
        t = max(len(s) for s in seqs)
        ids = torch.tensor([s + [s[-1]] * (t - len(s)) for s in seqs], device=dev)
        kv_len = max(starts) + t
        pos, seen = row_steps(torch.tensor(starts, device=dev), t, kv_len)
        rows_t = torch.tensor(rows, device=dev)
        if self.hybrid:   # every forward's GDN states are committed before the next reads
            self.cache.check_committed()
        top = self.model.cfg.num_layers - 1   # the last layer's output: the head's input
        layers = self.hidden_layers + ((top,) if last and top not in self.hidden_layers else ())
        for _ in range(1 + self.options["repeat_work"]):   # test-only: identical writes
            out = self.model(ids, self.cache, 0, positions=pos, kv_len=kv_len, mask=seen,
                             rows=rows_t, logits="none" if last else "all",
                             hidden_layers=layers)
        hidden = (torch.cat([out.hidden[i] for i in self.hidden_layers], dim=-1)
                  if self.hidden_layers else None)
        if not last:
            return out.logits, hidden
        ends = torch.tensor([len(x) - 1 for x in seqs], device=dev)
        x = out.hidden[top][torch.arange(len(seqs), device=dev), ends]      # [R, H]
        return self.model.lm_head(self.model.model.norm(x)).float(), hidden

    def _verify(self, live: list[Request]) -> list[Request]:
        seqs = self._draft_seqs(live)
        starts = [self.lengths[r.row] for r in live]
        accepted, hidden = self._run(seqs, starts, [r.row for r in live])
        if self.hybrid:   # each row keeps its pending token and its accepted drafts
            self.cache.commit_rows([r.row for r in live], [n + 1 for n, _ in accepted],
                                   [len(seq) for seq in seqs])
        return self._commit(live, starts, accepted, hidden)

    def _draft_seqs(self, live: list[Request]) -> list[list[int]]:
        """Each decoding request's [pending] + draft chain."""
        k_max = self.options["draft_len"]
        bd = self.batch_drafter
        if bd is not None:
            k_max = min(k_max, bd.net.cfg.block_size)
        ks = []
        for req in live:
            room = self.max_context - self.lengths[req.row] - 1
            ks.append(max(0, min(k_max, room, req.max_new - len(req.tokens),
                                 self.token_budget // len(live) - 1)))
        if bd is not None and live and self._chains_on_device():   # left there for _run:
            self._chains = self._drafted_ahead(live)
            if self._chains is None:
                self._chains = bd.draft_chains([r.row for r in live],
                                               [r.pending for r in live], ks)
            return [[req.pending] * (k + 1) for req, k in zip(live, ks)]   # lengths only
        if bd is not None and live:   # every row's block in one forward
            lattices = bd.draft([r.row for r in live], [r.pending for r in live], ks)
            chains = [lat.chain[:k] for lat, k in zip(lattices, ks)]
        else:
            chains = [req.drafter.draft(DraftContext(req.prompt + req.tokens), k).chain[:k]
                      if k > 0 and req.drafter is not None else [] for req, k in zip(live, ks)]
        return [[req.pending] + chain for req, chain in zip(live, chains)]

    def _drafted_ahead(self, live: list[Request]) -> torch.Tensor | None:
        """The chains the last step queued for these requests (`_commit`, option
        batch_draft_ahead), where every one of them was among its requests (a request that
        finished since leaves its row out); None where one was not (a request admitted
        since: the step drafts again)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        reqs, chains = ahead
        at = {id(r): i for i, r in enumerate(reqs)}
        idx = [at.get(id(r)) for r in live]
        if None in idx:
            return None
        if idx == list(range(len(reqs))):
            return chains
        return chains.index_select(0, torch.tensor(idx, device=chains.device))

    def _chains_on_device(self) -> bool:
        """Whether the batch drafter's chains reach the verify step on the device
        (`draft_chains`, copied into the step's slot) instead of through the host (`draft`):
        the static path, option batch_chain_device on. A mechanism that reads the lattices
        on the host keeps them off it."""
        return (self.runner is not None and self.batch_drafter.static
                and self.options["batch_chain_device"])

    def _run(self, seqs: list[list[int]], starts: list[int], rows: list[int]):
        """One target forward over every row's tokens: per row (accepted draft tokens n,
        the target's argmax per position), and the drafter's hidden states (or None).
        The first rows' drafts may still be on the device (`_draft_seqs` left them)."""
        chains, self._chains = self._chains, None
        if self.runner is not None and max(map(len, seqs)) <= BUCKETS[-1]:
            bd = self.batch_drafter
            self._queued = bd is not None and bd.static and self.options["batch_overlap"]
            if self._queued:   # the drafter's context update queued behind the verify
                self.runner.read_after(lambda s, r: bd.queue_extend(
                    rows, starts, s.packed[:r, 0] + 1, s.hidden))
            packed = self.runner.step(seqs, starts, rows, chains)   # acceptance on the device
            return [(p[0], p[1:]) for p in packed], self.runner.last.hidden
        if chains is not None:   # the dynamic forward: the drafts read to the host first
            top1 = chains.long().tolist()
            seqs = [s[:1] + top1[i][:len(s) - 1] if i < len(top1) else s
                    for i, s in enumerate(seqs)]
        logits, hidden = self._forward(seqs, rows, starts)
        target = logits.argmax(-1).tolist()   # one host sync
        accepted = []
        for seq, tgt in zip(seqs, target):
            n = 0
            while n < len(seq) - 1 and seq[n + 1] == tgt[n]:
                n += 1
            accepted.append((n, tgt))
        return accepted, hidden

    def _commit(self, live: list[Request], starts: list[int], accepted, hidden) -> list[Request]:
        bd = self.batch_drafter
        queued, self._queued = self._queued, False
        # the committed spans' context: [start, start + n + 1)
        ends = [s + n + 1 for s, (n, _) in zip(starts, accepted)]
        if bd is not None and live and queued:   # written already (_run's read_after)
            bd.commit_extend([r.row for r in live], ends)
            if self.options["batch_draft_ahead"] and self._chains_on_device():
                # the next step's drafts queued now: the GPU drafts while the host keeps
                # the books (a request that finishes here was drafted for nothing)
                self._ahead = (list(live), bd.draft_chains(
                    [r.row for r in live], [tgt[n] for n, tgt in accepted],
                    [bd.chain_len] * len(live)))
        elif bd is not None and live:
            bd.extend_rows([r.row for r in live], ends, [n + 1 for n, _ in accepted], hidden)
        finished = []
        for req, (n, tgt) in zip(live, accepted):
            self.lengths[req.row] += n + 1
            req.accepted.append(n + 1)
            req.pending = tgt[n]
            if self._emit(req, tgt[:n + 1]):
                finished.append(req)
        return finished

    def _emit(self, req: Request, new: list[int]) -> bool:
        """Append a step's tokens, cut at a stop token or max_new; free the row when done."""
        out = []
        for tok in new:
            out.append(tok)
            if tok in self.stop_ids:
                req.stop_reason = "stop"
                break
            if len(req.tokens) + len(out) >= req.max_new:
                req.stop_reason = "length"
                break
        if not req.stop_reason and self.lengths[req.row] >= self.max_context:
            req.stop_reason = "context"
        if len(out) < len(new) and req.accepted:   # the step's gain: the tokens kept
            req.accepted[-1] -= len(new) - len(out)
        req.tokens.extend(out)
        if req.on_tokens is not None and out:
            req.on_tokens(out)
        if req.done:
            self.rows[req.row] = None
            self.lengths[req.row] = 0
        return req.done


class BackgroundBatch:
    """A BatchEngine stepped by a thread of its own; `stream` is safe from many threads."""

    _END = object()

    def __init__(self, engine: BatchEngine):
        self.engine = engine
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="batch", daemon=True)
        self._thread.start()

    def stream(self, prompt: list[int], max_new: int) -> Iterator[list[int]]:
        out: queue.Queue = queue.Queue()
        with self._work:
            if self._error is not None:
                raise BatchError(f"the batch engine stopped: {self._error}")
            req = self.engine.submit(prompt, max_new, on_tokens=out.put)
            self._work.notify()
        while True:
            item = out.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise BatchError(f"the batch engine stopped: {item}")
            yield item
            if req.done and out.empty():
                return

    def _loop(self) -> None:
        while True:
            with self._work:
                while self.engine.idle:
                    self._work.wait()
                try:
                    self.engine.step()
                except BaseException as exc:   # every waiting caller hears of it
                    self._error = exc
                    for req in [*self.engine.active, *self.engine.waiting]:
                        if req.on_tokens is not None:
                            req.on_tokens(exc)
                    return
