"""The engine: greedy autoregressive and speculative generation, and token forcing.

One step verifies [pending token] + draft chain in a single forward, accepts the longest
prefix of the chain that equals the target's argmax, adds the target's next token (the
bonus), and commits the cache to the accepted length. Autoregressive decoding is the same
step with an empty chain, so both modes share every line of the verification path.

On CUDA (option `cuda_graphs`, on by default) a step of up to 64 tokens runs through a
`GraphRunner`: the static-shape forward replayed from a CUDA graph, the chain padded to a
bucket, acceptance computed on the device, and one host read per step (the accepted count
with the target's tokens). With option `graph_prefill` (on) a prompt of at most
`graph_prefill_max` tokens (256) is prefilled by the same runner, in steps of 64 tokens (a
replay each instead of the dynamic forward's launches: on the H200 the 27B-class target's
16-token prompt took 63 ms dynamic against about one step's 19 ms, with W12 weights 105-183
ms; and the dynamic forward's first prefill of some prompt lengths cost 0.5-1.1 s of one-time
cuDNN setup). Longer prompts and steps of more than 64 tokens use the dynamic forward.
`static=True` runs the static forward eagerly on any device (CPU tests of the graph path's
logic). While a profiler is active the static forward runs eagerly too: a graph hides its
kernels from the profile's regions. On CUDA the option `compile` (on by default, ignored on
CPU) runs the static forward's layers through torch.compile'd regions (stock/compiled.py),
which fuse the elementwise work between the GEMMs; they are compiled in each graph slot's
warm-up. With it, `fuse_projections` (on) makes q/k/v and gate/up one GEMM each
(stock/fused.py) and `attention_kernel` (triton) runs attention through kernels/attention's
split-KV kernel.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from stock.cache import ContextOverflow, KVCache
from stock.compiled import compile_enabled
from stock.fused import fuse_projections
from stock.errors import StockError
from stock.drafters.base import DraftContext, DraftLattice, Drafter
from stock.graphs import BUCKETS, GraphRunner
from stock.lattice_log import LatticeRecorder
from stock.model import Transformer
from stock.options import Options
from stock.profile import Profiler, profile_active, profiling, region


class EngineError(StockError):
    pass


FAULT_BIAS = 50.0  # the test-only fault: added to one token's logit (see options.py)


@dataclass
class GenResult:
    tokens: list[int]  # generated tokens (a stop token, if reached, included)
    prompt_len: int
    accepted: list[int] = field(default_factory=list)  # tokens gained per step (bonus incl.)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = "length"  # length | stop | context

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean tokens gained per verification step, bonus token included."""
        return sum(self.accepted) / max(len(self.accepted), 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / max(self.prefill_s + self.decode_s, 1e-9)

    @property
    def step_ms(self) -> float:
        return 1e3 * self.decode_s / max(self.steps, 1)


@dataclass
class ForcedResult:
    argmax: list[int]  # the engine's own choice at each forced position
    margin: list[float]  # reference logit margin: top-1 minus top-2 of the engine's logits
    forced: list[int]
    digests: list[str] = field(default_factory=list)  # per position, when asked: logits' hash

    @property
    def mismatches(self) -> list[int]:
        return [i for i, (a, f) in enumerate(zip(self.argmax, self.forced)) if a != f]


class Engine:
    def __init__(self, model: Transformer, options: Options | None = None,
                 max_context: int | None = None, stop_ids: set[int] | frozenset = frozenset(),
                 static: bool | None = None, capture: bool | None = None):
        self.model = model
        self.options = options or Options()
        self.max_context = max_context or model.cfg.max_position
        self.stop_ids = frozenset(stop_ids)
        if static is None:
            static = model.device.type == "cuda" and self.options["cuda_graphs"]
        self._static, self._capture = static, capture
        self.compiled = compile_enabled(self.options, model.device)
        self.attention = self.options["attention_kernel"] if self.compiled else "sdpa"
        self.fused = self.compiled and self.options["fuse_projections"]
        if self.fused:
            fuse_projections(model)  # views: the modules and their outputs are unchanged
        self.runner: GraphRunner | None = None
        # the static path pads steps to a bucket: the largest bucket as slack, rounded up to
        # 64 slots (aligned rows for the attention kernels)
        slots = -(-(self.max_context + BUCKETS[-1]) // 64) * 64 if static else self.max_context
        self.cache = model.new_cache(slots)
        self._prompt_len = 0  # for the test-only fault: which new token a logit row predicts
        # drafters kept across requests by stock.system.make_drafter: the block drafter (its
        # weights, context cache and CUDA graphs are built once per engine; generate()
        # resets its per-request state). One request at a time per engine, as for the cache.
        # After swapping the target's modules, clear it along with GraphRunner.reset().
        self.drafters: dict[str, object] = {}

    @property
    def cache(self) -> KVCache:
        return self._cache

    @cache.setter
    def cache(self, cache: KVCache) -> None:
        """Replacing the cache (callers share one engine's buffer) rebinds the static path;
        a cache without the padding slack it needs falls back to the dynamic path."""
        self._cache = cache
        fits = cache.max_len >= self.max_context + BUCKETS[-1]
        self.runner = (GraphRunner(self.model, cache, self.max_context, capture=self._capture,
                                   compile=self.compiled, attention=self.attention,
                                   fused=self.fused)
                       if self._static and fits else None)
        self._eager_runner: GraphRunner | None = None

    @property
    def uses_graphs(self) -> bool:
        """Whether verification steps are replayed from CUDA graphs."""
        return self.runner is not None and self.runner.capture

    def prepare(self, drafter=None, end: int | None = None) -> int:
        """Before serving: capture every CUDA graph a request whose context stays below
        `end` (default and at most max_context) can meet, the verification and prefill
        slots with the hidden layers `drafter` reads and the drafter's own graphs, so that
        no capture (nor a compile of a new T bucket) lands inside a served request, as a
        server captures its graphs at start-up. Returns how many slots exist (0 off the
        static path: nothing to prepare; the CPU's static path makes its slots, uncaptured)."""
        if self.runner is None:
            return 0
        end = min(end or self.max_context, self.max_context)
        layers = tuple(drafter.hidden_layers) if drafter is not None else ()
        n = self.runner.capture_upto(end, layers)
        if hasattr(drafter, "capture_upto"):   # the chain's graphs where steps take it
            chain = hasattr(drafter, "draft_chain") and self._device_chain(drafter, None)
            n += drafter.capture_upto(end, top1=True) if chain else drafter.capture_upto(end)
        return n

    # -- one verification step -------------------------------------------------------------
    def _verify(self, pending: int, chain: list[int], start: int, hidden_layers=()):
        """Logits [t, vocab] and hidden states of [pending] + chain, and, from the static
        path, `packed` (accepted count, then the target's tokens) computed on the device."""
        t = len(chain) + 1
        if self.runner is not None and t <= self.runner.buckets[-1]:
            runner = self.runner
            if runner.capture and profile_active():
                # a graph hides its kernels from the profile's regions: profile the same
                # static forward, run eagerly
                if self._eager_runner is None:
                    self._eager_runner = GraphRunner(self.model, self.cache, self.max_context,
                                                     capture=False)
                runner = self._eager_runner
            for _ in range(1 + self.options["repeat_work"]):  # repeats: identical writes
                out = runner.step([pending] + chain, start, tuple(hidden_layers))
            logits = out.logits[:t]
            hidden = {layer: h[:, :t] for layer, h in out.hidden.items()}
            if self.options["fault_logit_bias_after"] >= 0:
                return self._fault(logits, start + 1 - self._prompt_len), hidden, None
            return logits, hidden, out.packed
        ids = torch.tensor([[pending] + chain], device=self.model.device)
        out = self.model(ids, self.cache, start, logits="all", hidden_layers=hidden_layers)
        for _ in range(self.options["repeat_work"]):  # test-only: identical writes, same result
            self.model(ids, self.cache, start, logits="all", hidden_layers=hidden_layers)
        logits = out.logits[0]
        if self.options["fault_logit_bias_after"] >= 0:
            logits = self._fault(logits, start + 1 - self._prompt_len)
        return logits, out.hidden, None

    def _device_chain(self, drafter, recorder) -> bool:
        """Whether chain steps take their draft on the device (the block drafter: its chain,
        `draft_chain`, or a drafter's lattice, `draft_packed`) instead of reading it to the
        host: the static path, unprofiled, no lattice log (it records host lattices), no
        test fault (applied to host logits)."""
        return (self.runner is not None and hasattr(drafter, "draft_packed")
                and recorder is None and not profile_active()
                and self.options["fault_logit_bias_after"] < 0)

    def _verify_device_chain(self, packed: torch.Tensor, pending: int, start: int, k: int,
                             hidden_layers=()):
        """Verify [pending] + the first k tokens of a chain left on the device (a chain, or
        a lattice's top-1); (n accepted draft tokens, the target's k + 1 tokens, hidden
        states)."""
        for _ in range(1 + self.options["repeat_work"]):  # repeats: identical writes
            out = self.runner.chain_step(packed, pending, start, k, tuple(hidden_layers))
        got = out.packed[: k + 2].tolist()  # the one host sync of a step
        return got[0], got[1:], {layer: h[:, : k + 1] for layer, h in out.hidden.items()}

    def _fault(self, logits: torch.Tensor, first: int) -> torch.Tensor:
        """Test-only fault: bias one token's logit in rows predicting new token >= after."""
        after = self.options["fault_logit_bias_after"]
        rows = torch.arange(first, first + logits.shape[0], device=logits.device) >= after
        logits = logits.clone()
        logits[rows, logits.shape[-1] // 2] += FAULT_BIAS
        return logits

    def _prefill(self, prompt: list[int], hidden_layers=()) -> tuple[int, dict]:
        if not prompt:
            raise EngineError("empty prompt")
        if len(prompt) >= self.max_context:
            raise EngineError(f"prompt of {len(prompt)} tokens does not fit the context of "
                              f"{self.max_context} tokens")
        with region("prefill"):
            t = len(prompt)
            if (self.runner is not None and self.options["graph_prefill"]
                    and t <= self.options["graph_prefill_max"] and not profile_active()):
                last, hidden = self._graph_prefill(prompt, tuple(hidden_layers))
            else:
                ids = torch.tensor([prompt], device=self.model.device)
                out = self.model(ids, self.cache, 0, logits="last", hidden_layers=hidden_layers)
                last, hidden = out.logits[0, -1:], out.hidden
            self.cache.commit(t)
            self._prompt_len = t
            if self.options["fault_logit_bias_after"] >= 0:
                last = self._fault(last, 0)
            return int(last.argmax()), hidden

    def _graph_prefill(self, prompt: list[int], layers: tuple[int, ...]):
        """The prompt through the runner's static steps, in chunks of its largest bucket
        (one replay each; a shorter last chunk is padded like a verify step), each chunk
        attending to the ones before it through the cache: no shape ever new to the
        process, so no per-length setup (on the H200 the dynamic forward's first prefill of
        some prompt lengths took 0.5-1.1 s, bench/gpu_prefill_lengths.py). Returns the last
        position's logits and copies of the chosen hidden states."""
        size = self.runner.buckets[-1]
        parts: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
        for start in range(0, len(prompt), size):
            chunk = prompt[start:start + size]
            out = self.runner.step(chunk, start, layers)
            self.cache.commit(start + len(chunk))   # a GDN layer's next chunk reads its state
            for layer, h in out.hidden.items():  # static outputs: the next replay rewrites them
                parts[layer].append(h[:, :len(chunk)].clone())
        hidden = {layer: p[0] if len(p) == 1 else torch.cat(p, dim=1)
                  for layer, p in parts.items()}
        return out.logits[len(chunk) - 1:len(chunk)], hidden

    def generate(self, prompt: list[int], max_new: int, drafter: Drafter | None = None,
                 recorder: LatticeRecorder | None = None,
                 profiler: Profiler | None = None) -> GenResult:
        """Greedy generation; speculative when a drafter is given, else autoregressive."""
        if max_new < 1:
            raise EngineError("max new tokens must be at least 1")
        k_max = self.options["draft_len"] if drafter is not None else 0
        with profiling(profiler):
            self.cache.rollback(0)
            if drafter is not None:
                drafter.reset()
            res = GenResult([], len(prompt))
            t0 = time.perf_counter()
            layers = drafter.hidden_layers if drafter is not None else ()
            device_chain = drafter is not None and self._device_chain(drafter, recorder)
            pending, hidden = self._prefill(prompt, layers)  # hidden: {} unless asked for
            self._sync()
            res.prefill_s = time.perf_counter() - t0
            res.tokens.append(pending)
            t0 = time.perf_counter()
            while not self._finished(res, max_new):
                start = self.cache.length
                room = self.max_context - start - 1
                if room < 0:
                    res.stop_reason = "context"
                    break
                step = profiler.step() if profiler else nullcontext()
                with step:
                    k = min(k_max, room, max_new - len(res.tokens))
                    lattice = DraftLattice.empty()
                    if k > 0 and device_chain and k < self.runner.buckets[-1]:
                        # the draft stays on the device: no host read between the drafter's
                        # step and this one
                        with region("drafter"):   # its chain alone where it gives one
                            draft = getattr(drafter, "draft_chain", drafter.draft_packed)(
                                DraftContext(prompt + res.tokens, hidden), k)
                        depth = draft.shape[0] if draft.dim() == 1 else draft.shape[1]
                        n, target, hid = self._verify_device_chain(
                            draft, pending, start, min(k, depth), layers)
                    else:
                        if k > 0 and drafter is not None:
                            with region("drafter"):
                                lattice = drafter.draft(DraftContext(prompt + res.tokens,
                                                                     hidden), k)
                        chain = lattice.chain[:k]
                        logits, hid, packed = self._verify(pending, chain, start, layers)
                        if packed is not None:  # acceptance was computed on the device
                            got = packed[: len(chain) + 2].tolist()  # the one host sync
                            n, target = got[0], got[1:]
                        else:
                            target = logits.argmax(-1).tolist()  # the one host sync of a step
                            n = 0
                            while n < len(chain) and chain[n] == target[n]:
                                n += 1
                    self.cache.commit(start + n + 1)
                    # static outputs are overwritten by the next replay: keep copies
                    hidden = {layer: h[:, : n + 1].clone() for layer, h in hid.items()}
                    res.tokens.extend(target[: n + 1])
                    res.accepted.append(n + 1)
                    pending = target[n]
                    if recorder is not None:
                        recorder.add(lattice, n, target)
            res.decode_s = time.perf_counter() - t0
            if recorder is not None:
                recorder.end_request()
        return res

    def _finished(self, res: GenResult, max_new: int) -> bool:
        new = res.accepted[-1] if res.accepted else 1  # only the last step's tokens are new
        for i in range(len(res.tokens) - new, len(res.tokens)):
            if res.tokens[i] in self.stop_ids:
                self._cut(res, i + 1)
                res.stop_reason = "stop"
                return True
        if len(res.tokens) >= max_new:
            self._cut(res, max_new)
            res.stop_reason = "length"
            return True
        return False

    @staticmethod
    def _cut(res: GenResult, keep: int) -> None:
        """Drop the last step's tokens past `keep`, and count only the kept ones as its
        gain (τ is tokens kept per verification step)."""
        dropped = len(res.tokens) - keep
        if dropped > 0:
            del res.tokens[keep:]
            if res.accepted:
                res.accepted[-1] -= dropped

    def _sync(self):
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    # -- token forcing -----------------------------------------------------------------------
    def force(self, prompt: list[int], forced: list[int], chunk: int | None = None,
              digests: bool = False) -> ForcedResult:
        """Run with `forced` as the output; at every position record the engine's argmax and
        its top-1 minus top-2 logit margin. Steps verify `chunk` tokens at a time (default:
        draft_len + 1, the speculative step's shape). `digests`: also a hash of each
        position's fp32 logits, for bit-identity checks."""
        if not forced:
            raise EngineError("nothing to force")
        if len(prompt) + len(forced) > self.max_context:
            raise ContextOverflow(f"prompt and forced tokens ({len(prompt) + len(forced)}) "
                                  f"exceed the context of {self.max_context}")
        chunk = chunk or self.options["draft_len"] + 1
        self.cache.rollback(0)
        self._prompt_len = len(prompt)
        ids = torch.tensor([prompt[:-1]], device=self.model.device)
        if len(prompt) > 1:
            self.model(ids, self.cache, 0, logits="none")
        self.cache.commit(len(prompt) - 1)
        seq = [prompt[-1]] + forced[:-1]  # position i's input predicts forced[i]
        argmax: list[int] = []
        margin: list[float] = []
        hashes: list[str] = []
        for s in range(0, len(seq), chunk):
            part = seq[s:s + chunk]
            start = self.cache.length
            logits, _, _ = self._verify(part[0], part[1:], start)
            top2 = logits.topk(2, dim=-1)
            argmax += top2.indices[:, 0].tolist()
            margin += (top2.values[:, 0] - top2.values[:, 1]).tolist()
            if digests:
                rows = logits.float().cpu().numpy()
                hashes += [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest()
                           for row in rows]
            self.cache.commit(start + len(part))
        return ForcedResult(argmax, margin, list(forced), hashes)
