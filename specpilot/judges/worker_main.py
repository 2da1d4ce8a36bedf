"""The judges' one worker program: serves one system from one clean checkout, in its own
process.

Run by every judge (worker_proc.Worker, through worker_proc.launch) as
`python -P -B -s worker_main.py` with PYTHONPATH=<checkout>, so `import stock` is that
checkout's code and nothing else. Standard library and torch only: it must not import
specpilot (the checkout has none), and its command line and environment are the same
whichever judge started it (gates, references, controller, the cycle's measurements).

Channel: requests arrive as JSON lines on stdin; replies go to the pipe the judge gave as
stdout, which the worker moves to a private descriptor first thing; its stdout then goes to
the log with stderr, so nothing the candidate prints can forge or corrupt a reply. The
controller times each request itself around the pipe.

First message: setup {checkout, system_paths, model, options, device, max_context,
drafter}. The worker hashes the checkout's system paths as git would (before importing any
of it), loads the system, and replies `ready` with the options in effect, the tree hash and
where `stock` was imported from; the controller checks all three against what it asked.
With `hold` set it loads no model yet: the candidate's own registry checks the options
(names, types, ranges) in seconds, before a judge spends minutes on references, and it
replies `options` (the same report); it loads the model at {"cmd": "load"}, then replies
`ready`. The controller checks each side's options in the process that then serves it;
the gate's --opt check stops its held worker unloaded.
Then: {"cmd": "run", "id", "prompt" | "ids", "max_new"} -> {"event": "done", tokens, ...};
"force" {ids, forced, chunk, digests} and "reference" {ids, length, draft_len, chunk} serve
the correctness gates; "tokenize" {prompt}; "registry" -> the system's option definitions;
"measure" {prompts, max_new} -> the cost model's raw measurements (judges/analyze.py;
teacher-forced lattices included, `teacher_forced`);
"prepare" {end} -> the graphs captured before any timed request (stock's Engine.prepare) and
    the seconds its compiler took (stock.compiled.compile_seconds, where stock has it);
"timed" {options, ids, max_new} -> one generation's decode time under other option values
(the tuner); "batch" {items: [{id, ids}], max_new, max_batch} -> every item's tokens,
served together by the system's batched engine (stock.batch.BatchEngine, at most
max_batch at once: the controller's throughput mode), or with `count` and no items, the
items then arriving as {"cmd": "submit", id, item} at their arrival times (a load trace);
"serve" {max_batch, prepare} -> {"event": "serving", graphs, max_context, stop_ids,
batch_drafter (its name, or null: drafters per request)}, then
the batched engine stepping for as long as the channel is open: {"cmd": "submit", id, ids,
max_new} joins it; each step's new tokens of a request come as {"event": "tokens", id,
tokens}, its end as {"event": "end", id, reason} (`specpilot serve --system`: the server
tokenizes and answers HTTP, this process only decodes);
{"cmd": "quit"} or end of input ends it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import queue
import stat
import sys
import threading
import time
import weakref
from pathlib import Path


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _tree(rows: list[tuple[str, str, str]]) -> str:
    """rows of (mode, name, sha) -> git tree hash (git's order: trees sort as 'name/')."""
    keyed = sorted(((n + "/" if m == "40000" else n).encode(), m, n, s) for m, n, s in rows)
    body = b"".join(m.encode() + b" " + n.encode() + b"\0" + bytes.fromhex(s)
                    for _k, m, n, s in keyed)
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _entry(path: Path) -> tuple[str, str] | None:
    """(mode, sha) of a file, link or folder as git stores it; None for an empty folder."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return "120000", _blob(os.readlink(path).encode())
    if stat.S_ISDIR(st.st_mode):
        rows = []
        for child in sorted(path.iterdir()):
            found = _entry(child)
            if found:
                rows.append((found[0], child.name, found[1]))
        return ("40000", _tree(rows)) if rows else None
    mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    return mode, _blob(path.read_bytes())


def tree_hash(root: Path, paths: list[str]) -> str:
    """The git tree hash of `paths` under `root` (matches GitStore.system_tree)."""
    nested: dict = {}
    for p in paths:
        p = p.strip("/")
        found = _entry(root / p) if (root / p).exists() or (root / p).is_symlink() else None
        if found is None:
            continue
        node = nested
        *dirs, leaf = p.split("/")
        for part in dirs:
            node = node.setdefault(part, {})
        node[leaf] = found

    def build(node: dict) -> str:
        return _tree([("40000", n, build(v)) if isinstance(v, dict) else (v[0], n, v[1])
                      for n, v in node.items()])
    return build(nested)


def _place(device: str):
    """'cpu:N' stands in for device N: one thread pinned to core N (mod the cores)."""
    import torch

    if device.startswith("cpu:"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(device[4:]) % len(cores)]})
        torch.set_num_threads(1)
        return "cpu"
    return device


def compute_dtype(device: str):
    """Stock's compute dtype: bf16 on CUDA, fp32 elsewhere (as stock.system.load_system)."""
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _hardware(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


DEFAULT_CONTEXT = 1024   # a random test model's context when the setup names none


def reference_pass(engine, ids: list[int], length: int, draft_len: int,
                   chunk: int | None, noise: bool | None = None) -> dict:
    """Stock's reference for one prompt (the one computation behind every gate's
    references): its greedy output by lossless ngram speculation (greedy speculative output
    equals greedy autoregressive output), then `engine`'s forced pass over it recording, per
    position, the argmax, the top-1 minus top-2 margin and a hash of the logits.

    `noise` (default: in bf16 or fp16, not fp32): a second forced pass in steps of another
    shape (chunk 1, the autoregressive step's, or 2 when the first was 1) measures how far
    stock's own kernels move each margin when only the summation order changes: `noise` per
    position (|margin change|; the two margins' sum where the argmax flips) and
    `noise_flips`, the positions whose argmax the change of shape alone flipped."""
    # lazy: the checkout's stock, imported after setup hashed its tree
    import torch
    from stock.system import make_drafter

    eng = speculative_engine(engine, int(draft_len))
    # each part ends in host reads of its results (lists): its wall time is its own
    t0 = time.perf_counter()
    gen = eng.generate(list(ids), int(length), make_drafter("ngram", eng))
    t1 = time.perf_counter()
    fr = engine.force(list(ids), gen.tokens, chunk=chunk, digests=True)
    t2 = time.perf_counter()
    out = {"tokens": gen.tokens, "stop_reason": gen.stop_reason, "argmax": fr.argmax,
           "margin": fr.margin, "digests": fr.digests, "noise": [], "noise_flips": [],
           "seconds": {"generate": t1 - t0, "forced": t2 - t1}}
    if noise is None:
        noise = engine.model.dtype in (torch.bfloat16, torch.float16)
    if noise and gen.tokens:
        first = chunk or engine.options["draft_len"] + 1
        other = engine.force(list(ids), gen.tokens, chunk=1 if first != 1 else 2)
        out["noise"], out["noise_flips"] = shape_noise(fr, other)
        out["seconds"]["noise"] = time.perf_counter() - t2
    return out


_SPECULATIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def speculative_engine(engine, draft_len: int):
    """The engine that generates `engine`'s references by ngram speculation at `draft_len`:
    made once per (engine, draft_len) and kept, sharing `engine`'s cache buffer (one
    request at a time), so its static path's CUDA graphs are captured once, not again for
    every request. (A fresh one a request, as before 2026-12-06, spent 165 of the 261
    worker-seconds of 256 references on the H100, embedded default, where the forced pass
    and the noise pass over the same tokens took 36 and 60.)"""
    # lazy: the checkout's stock, imported after setup hashed its tree
    from stock.engine import Engine
    from stock.options import Options

    kept = _SPECULATIVE.setdefault(engine, {})
    eng = kept.get(draft_len)
    if eng is None:
        eng = kept[draft_len] = Engine(engine.model, Options({"draft_len": draft_len}),
                                       engine.max_context, engine.stop_ids)
    if eng.cache is not engine.cache:   # share the buffer: one cache's memory, not two
        eng.cache = engine.cache
    return eng


def shape_noise(a, b) -> tuple[list[float], list[int]]:
    """Two forced passes of the same tokens in steps of different shapes (each with `margin`
    and `argmax` per position): how far the margin moved at each position (|change|; the
    two margins' sum where the argmax flipped), and the positions whose argmax flipped."""
    noise = [abs(x - y) if u == v else x + y
             for x, y, u, v in zip(a.margin, b.margin, a.argmax, b.argmax)]
    return noise, [i for i, (u, v) in enumerate(zip(a.argmax, b.argmax)) if u != v]


def registry() -> dict:
    """The imported system's option registry: names, types, defaults, choices, help, the
    device types an option acts on (None for all) and the range of a numeric option (min,
    max; None where open); a system older than a field has None there."""
    # lazy: the checkout's stock, imported after setup hashed its tree
    from stock.options import REGISTRY

    return {n: {"type": o.type.__name__, "default": o.default, "help": o.help,
                "choices": list(o.choices) if getattr(o, "choices", None) else None,
                "devices": list(o.devices) if getattr(o, "devices", None) else None,
                "min": getattr(o, "min", None), "max": getattr(o, "max", None)}
            for n, o in REGISTRY.items()}


FORCED_DEPTH = 16   # rows of a teacher-forced lattice (at least the system's draft_len)


class _Forcing:
    """A drafter for `teacher_forced`: at every step it asks the system's drafter for its
    lattice, keeps it and proposes nothing, so each step verifies only the pending token and
    commits it (the autoregressive step). The drafter sees what a step of any decode that
    committed the same prefix hands it: the tokens, and the target's hidden states of the
    tokens committed since its last call (here one a step, a speculative step's accepted
    run there). Its lattices are `depth` deep, capped as the engine caps a step's draft
    (room in the context, tokens left to generate)."""

    def __init__(self, drafter, prompt_len: int, max_new: int, max_context: int, depth: int):
        self.inner, self.name, self.hidden_layers = drafter, drafter.name, drafter.hidden_layers
        self.ends, self.depth, self.lattices = (prompt_len, max_new, max_context), depth, []

    def reset(self) -> None:
        self.inner.reset()
        self.lattices = []

    def draft(self, ctx, k: int):
        prompt_len, max_new, max_context = self.ends
        n = len(ctx.tokens)   # committed tokens + the pending one
        lat = self.inner.draft(ctx, min(self.depth, max_context - n, max_new - n + prompt_len))
        self.lattices.append(lat)
        return type(lat)(lat.ids[:0], lat.logprobs[:0])


def teacher_forced(engine, drafter, prompt: list[int], max_new: int, depth: int) -> dict:
    """The greedy output of one prompt and, at every position p of it but the last, the
    drafter's lattice for a step that starts with committed prompt + output[:p] and pending
    token output[p] (judges/tau.py simulates decodes over them)."""
    forcing = _Forcing(drafter, len(prompt), max_new, engine.max_context, depth)
    res = engine.generate(list(prompt), max_new, forcing)
    return {"output": res.tokens, "depth": depth,
            "lattices": [{"ids": lat.ids.tolist(), "logprobs": lat.logprobs.tolist()}
                         for lat in forcing.lattices]}


def measure(engine, drafter, prompts: list[list[int]], max_new: int) -> dict:
    """What the cost model needs of a system, measured: per prompt one timed generation on
    the path the controller times (no recorder: a graphed chain keeps its draft on the
    device only without one; its step times, per step the tokens gained), one recorded
    generation (per step the draft lattice, the accepted count and the target's tokens;
    the same generation as the timed one where no CUDA graphs run), and one pass under
    stock's profiler (time per kernel category), plus the model's shapes; with a drafter,
    per prompt its teacher-forced lattices too ("forced", FORCED_DEPTH or draft_len deep).
    A system whose engine refuses lattice recording (stock's recorder logs chain steps; a
    tree-verifying system says so with an EngineError before its first step) is measured
    without lattices ("recorded": False). The judges' analyze.py turns it into the
    factors."""
    import dataclasses

    # lazy: the checkout's stock, imported after setup hashed its tree
    import torch
    from stock.engine import EngineError
    from stock.lattice_log import LatticeRecorder
    from stock.profile import Profiler

    # Untimed first. Where steps replay CUDA graphs, a step's first use of a (T, KV) shape
    # captures a graph and, with stock's `compile` option, its first use of a T compiles the
    # layers (7-18 s a T on the 27B-class target, bench/archive/NOTES-2026.md): there every prompt runs
    # once at full length, so that the timed runs below meet no new shape. Elsewhere a short
    # run is enough.
    if engine.uses_graphs:
        for ids in prompts:
            engine.generate(ids, max_new, drafter)
    else:
        engine.generate(prompts[0], 4, drafter)
    topk = engine.options["lattice_topk"]
    try:   # a one-token generation: refused at its start by a system that cannot record
        engine.generate(prompts[0], 1, drafter, recorder=LatticeRecorder(topk))
        recorded = True
    except EngineError:
        recorded = False
    recorder = LatticeRecorder(topk)
    runs = []
    for ids in prompts:
        first = len(recorder.steps)
        res = engine.generate(ids, max_new, drafter, recorder=recorder) if recorded else None
        if res is None or engine.uses_graphs:
            res = engine.generate(ids, max_new, drafter)
        runs.append({"prompt_len": len(ids), "decode_s": res.decode_s, "steps": res.steps,
                     "accepted": list(res.accepted),
                     "lattices": [{"ids": s.lattice.ids.tolist(),
                                   "logprobs": s.lattice.logprobs.tolist(),
                                   "target": list(s.target), "accepted": s.accepted}
                                  for s in recorder.steps[first:]]})
        if drafter is not None:
            runs[-1]["forced"] = teacher_forced(
                engine, drafter, ids, max_new, max(FORCED_DEPTH, engine.options["draft_len"]))
    profiler = Profiler(engine.model.device)
    for ids in prompts:
        engine.generate(ids, max_new, drafter, profiler=profiler)
    return {"runs": runs, "profile": profiler.report(), "topk": recorder.topk,
            "recorded": recorded,
            # where steps replay CUDA graphs the profiled steps run the same static forward
            # eagerly (a graph hides its kernels from the regions): not the timed path
            "profile_path": "eager" if engine.uses_graphs else "timed",
            "draft_len": engine.options["draft_len"],
            "drafter": getattr(drafter, "name", "ar"),   # "auto" resolved (stock.system)
            "device": str(engine.model.device),
            "dtype": "fp32" if engine.model.dtype == torch.float32 else "bf16",
            "model_cfg": dataclasses.asdict(engine.model.cfg)}


class Server:
    def __init__(self, setup: dict):
        checkout = Path(setup["checkout"]).resolve()
        self.tree = tree_hash(checkout, setup["system_paths"])  # before importing any of it
        device = _place(setup["device"])
        # lazy: the checkout's stock, imported after setup hashed its tree
        import stock
        import stock.system  # noqa: F401 - registers every option the system defines (drafters')
        import torch
        from stock.engine import Engine
        from stock.options import Options
        from stock.system import make_drafter
        if importlib.util.find_spec("stock.batch") is not None:
            # the checkout's batched engine: its modules register options of their own (an
            # entry's admission or tree knobs)
            importlib.import_module("stock.batch")  # lazy: the checkout's, after the hash

        self.Engine, self.Options, self.make_drafter = Engine, Options, make_drafter
        self.system = stock.system   # its batch_engine only where a command asks for it

        where = Path(stock.__file__).resolve()
        if checkout not in where.parents:
            raise RuntimeError(f"stock imported from {where}, not from the checkout {checkout}")
        self.stock_file = str(where)
        torch.manual_seed(0)
        options = Options(setup.get("options") or {})
        self.options, self.engine = options, None
        self._setup, self._device = setup, device
        # hold: the candidate's registry checked the options; "options" is replied and the
        # model waits for the judge's "load"
        if not setup.get("hold"):
            self.load()

    def load(self) -> None:
        """The system's model, engine and drafter at the options checked above."""
        import torch

        setup, device, options, Engine = self._setup, self._device, self.options, self.Engine
        make_drafter = self.make_drafter
        if self.engine is not None:
            raise RuntimeError("load: the model is loaded already")
        model = setup["model"]
        if model.startswith("random:"):
            # lazy: the checkout's stock, imported after setup hashed its tree
            from stock.config import PRESETS
            from stock.model import Transformer

            net = Transformer.random(PRESETS[model[7:]], torch.device(device),
                                     compute_dtype(device))
            self.engine = Engine(net, options, setup.get("max_context") or DEFAULT_CONTEXT,
                                 set())
            self.tokenizer = None
            self.drafter = make_drafter(setup.get("drafter"), self.engine)
        else:
            # lazy: the checkout's stock, imported after setup hashed its tree
            from stock.system import load_system

            system = load_system(model, options, device, setup.get("max_context"))
            self.engine, self.tokenizer = system.engine, system.tokenizer
            self.drafter = system.drafter(setup.get("drafter"))
        self.drafter_name = setup.get("drafter")
        self.hardware = _hardware(device)
        self.batchers: dict[int, object] = {}   # max_batch -> the system's BatchEngine

    def ready(self) -> dict:
        import torch

        if self.engine is None:   # held: no model yet
            return {"event": "ready", "options": self.options.as_dict(),
                    "non_default": self.options.non_default(), "tree": self.tree,
                    "stock_file": self.stock_file, "pid": os.getpid()}
        return {"event": "ready", "options": self.engine.options.as_dict(),
                "non_default": self.engine.options.non_default(), "tree": self.tree,
                "stock_file": self.stock_file, "hardware": self.hardware,
                "torch": torch.__version__, "pid": os.getpid(),
                "dtype": str(self.engine.model.dtype).removeprefix("torch."),
                "drafter": type(self.drafter).__name__ if self.drafter is not None else None,
                "stop_ids": sorted(int(t) for t in self.engine.stop_ids)}

    def force(self, msg: dict) -> dict:
        fr = self.engine.force(list(msg["ids"]), list(msg["forced"]), chunk=msg.get("chunk"),
                               digests=bool(msg.get("digests")))
        return {"event": "done", "id": msg.get("id"), "argmax": fr.argmax, "margin": fr.margin,
                "digests": fr.digests}

    def reference(self, msg: dict) -> dict:
        """Greedy output by lossless ngram speculation, then this engine's forced pass."""
        return {"event": "done", "id": msg.get("id"),
                **reference_pass(self.engine, msg["ids"], msg["length"], msg["draft_len"],
                                 msg.get("chunk"), msg.get("noise"))}

    def measure(self, msg: dict) -> dict:
        """The cost model's raw measurements of this system (judges/analyze.py computes the
        factors from them in the judges' process)."""
        return {"event": "done", "id": msg.get("id"),
                **measure(self.engine, self.drafter, [list(ids) for ids in msg["prompts"]],
                          int(msg["max_new"]))}

    def timed(self, msg: dict) -> dict:
        """One generation of this system's model under other option values (the tuner's
        evidence: its search is the pre-screen; gates and controller judge its pick in
        workers started at that pick): a fresh engine, and a drafter built for it, so that
        drafter options (ngram_max, ...) take effect."""
        eng = self.Engine(self.engine.model, self.Options(msg.get("options") or {}),
                          self.engine.max_context, self.engine.stop_ids)
        res = eng.generate(list(msg["ids"]), int(msg["max_new"]),
                           self.make_drafter(self.drafter_name, eng))
        return {"event": "done", "id": msg.get("id"), "decode_s": res.decode_s,
                "tokens": res.tokens, "uses_graphs": eng.uses_graphs}

    def _batcher(self, n: int):
        """The system's batched engine of at most n requests at once, built once."""
        be = self.batchers.get(n)
        if be is None:
            build = getattr(self.system, "batch_engine", None)   # absent in older systems
            if build is None:
                raise RuntimeError("this system has no batched engine "
                                   "(stock.system.batch_engine): throughput mode needs one")
            be = self.batchers[n] = build(self.engine, self.drafter_name, n)
        return be

    def batch(self, msg: dict, inbox: "queue.Queue[dict]") -> dict:
        """Every item served together by the system's own batched engine, built once per
        max_batch (its CUDA graphs survive from round to round); drafters per request.
        With `count` the items arrive one by one as `submit` messages (an arrival trace,
        sent by the judge at each request's time): each joins the engine as it arrives,
        the engine steps in between and waits when it has nothing to do."""
        be = self._batcher(int(msg["max_batch"]))
        max_new = int(msg["max_new"])
        reqs = [(item["id"], be.submit(list(item["ids"]), max_new)) for item in msg["items"]]
        count = int(msg.get("count", len(reqs)))
        while len(reqs) < count:
            try:   # a request that has arrived; block only when there is nothing to step
                sub = inbox.get(block=be.idle)
            except queue.Empty:
                be.step()
                continue
            if sub.get("cmd") != "submit" or sub.get("id") != msg.get("id"):
                raise RuntimeError(f"batch {msg.get('id')}: expected its submits, got {sub!r}")
            reqs.append((sub["item"]["id"], be.submit(list(sub["item"]["ids"]), max_new)))
        be.run()
        return {"event": "done", "id": msg.get("id"),
                "outputs": {rid: r.tokens for rid, r in reqs},
                "steps": max((len(r.accepted) for _, r in reqs), default=0)}

    def serve(self, msg: dict, inbox: "queue.Queue[dict]", reply) -> dict:
        """The batched engine serving submits until the channel ends (or "quit"): every
        request's tokens go out a step at a time as they are accepted. A submit the engine
        refuses (too long a prompt) ends only that request, with its reason."""
        be = self._batcher(int(msg["max_batch"]))
        graphs = 0
        if msg.get("prepare"):
            prep = getattr(be, "prepare", None)
            graphs = int(prep()) if prep is not None else 0
        reply({"event": "serving", "id": msg.get("id"), "graphs": graphs,
               "max_context": be.max_context, "stop_ids": sorted(int(t) for t in be.stop_ids),
               "drafter": getattr(be, "drafter_name", None),
               "batch_drafter": getattr(getattr(be, "batch_drafter", None), "name", None)})
        live: dict[int, str] = {}   # the engine's request id -> the server's
        while True:
            try:   # block for a message only when there is nothing to step
                sub = inbox.get(block=be.idle)
            except queue.Empty:
                for req in be.step():
                    reply({"event": "end", "id": live.pop(req.id), "reason": req.stop_reason})
                continue
            if sub.get("cmd") == "quit":
                return {"event": "done", "id": msg.get("id")}
            if sub.get("cmd") != "submit":
                raise RuntimeError(f"serving: expected submits, got {sub!r}")
            rid = sub["id"]
            try:
                req = be.submit(list(sub["ids"]), int(sub["max_new"]),
                                on_tokens=lambda toks, rid=rid: reply(
                                    {"event": "tokens", "id": rid, "tokens": list(toks)}))
            except Exception as exc:   # this request only (stock's BatchError, a bad field)
                reply({"event": "end", "id": rid, "reason": "refused", "message": str(exc)})
                continue
            live[req.id] = rid

    def registry(self, msg: dict) -> dict:
        """The system's own option definitions (entries record them as the code defines
        them; Phase 3 picks the options that act on a kernel category from them)."""
        return {"event": "done", "id": msg.get("id"), "registry": registry()}

    def tokenize(self, msg: dict) -> dict:
        return {"event": "done", "id": msg.get("id"), "ids": self.tokenizer.chat(msg["prompt"])}

    def prepare(self, msg: dict) -> dict:
        """Untimed, before the warm-up: every graph a request ending below `end` can meet
        (stock's Engine.prepare; with `max_batch`, the batched engine's BatchEngine.prepare,
        building that engine; a checkout whose stock has none prepares nothing)."""
        compiled = sys.modules.get("stock.compiled")
        seconds = getattr(compiled, "compile_seconds", lambda: 0.0)   # an older stock: none
        before = seconds()
        if msg.get("max_batch"):   # throughput mode: the batched engine's slots
            prep = getattr(self._batcher(int(msg["max_batch"])), "prepare", None)
            n = prep(int(msg["end"])) if prep is not None else 0
        else:
            prep = getattr(self.engine, "prepare", None)
            n = prep(self.drafter, int(msg["end"])) if prep is not None else 0
        return {"event": "done", "id": msg.get("id"), "graphs": int(n),
                "compile_s": round(float(seconds() - before), 1)}

    def run(self, msg: dict) -> dict:
        if "ids" in msg:
            ids = list(msg["ids"])
        elif self.tokenizer is not None:
            ids = self.tokenizer.chat(msg["prompt"])
        else:
            raise RuntimeError("this model has no tokenizer: send token ids")
        res = self.engine.generate(ids, int(msg["max_new"]), self.drafter)
        return {"event": "done", "id": msg.get("id"), "tokens": res.tokens,
                "steps": res.steps, "prefill_s": res.prefill_s, "decode_s": res.decode_s}


def main(argv: list[str]) -> int:
    # Replies go out on the pipe the judge gave as stdout, moved to a private descriptor
    # before anything of the system runs; stdout itself then goes where stderr goes (the
    # log), so nothing the system prints can forge or corrupt a reply.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    # every message goes through one queue, read from stdin by a thread: a batch's arrival
    # trace (`submit` messages) then reaches the batch while it steps
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                try:
                    msg = json.loads(line)
                except ValueError:
                    msg = None
                inbox.put(msg if isinstance(msg, dict) else
                          {"cmd": "unreadable", "line": line[:200]})
        inbox.put({"cmd": "quit"})   # end of input

    threading.Thread(target=read, daemon=True).start()
    server = None
    while True:
        msg = inbox.get()
        if msg.get("cmd") == "quit":
            break
        try:
            if msg.get("cmd") == "unreadable":
                raise RuntimeError(f"not a JSON message: {msg['line']!r}")
            if server is None:
                server = Server(msg)
                reply(server.ready() if not msg.get("hold") else
                      {**server.ready(), "event": "options"})
            elif msg.get("cmd") == "load":
                server.load()
                reply(server.ready())
            elif msg.get("cmd") in ("run", "force", "reference", "tokenize", "registry",
                                    "measure", "timed", "batch", "prepare", "serve"):
                t0 = time.perf_counter()
                result = (server.batch(msg, inbox) if msg["cmd"] == "batch"
                          else server.serve(msg, inbox, reply) if msg["cmd"] == "serve"
                          else getattr(server, msg["cmd"])(msg))
                result["worker_s"] = time.perf_counter() - t0
                reply(result)
            else:
                raise RuntimeError(f"unknown message {msg!r}")
        except Exception as exc:  # reported over the channel, then the worker ends
            reply({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
            return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Nothing is left to do once the channel is done (replies sent, the judge removes the
    # scratch folder): the interpreter's own teardown of torch and the system's modules
    # (static destructors, ~1700 modules) took 0.5 s a worker on the 2-core CPU, paid by
    # every judge's stop(). What the system printed is flushed to the log first.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
