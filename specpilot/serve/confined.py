"""`specpilot serve --system`: a system other than this checkout's stock, decoded by a
confined worker process and served over HTTP by this one.

The system's code (a memory entry's, the validated best, any commit's) is agent-written:
it runs only in the judges' worker (specpilot/judges/worker_main.py, "serve" command) on
a clean read-only checkout of its commit, under bubblewrap (no network, no project tree,
private scratch), as every judge runs it. This process keeps the HTTP server, the
tokenizer (this checkout's stock, the same model's) and the detokenizer; the worker gets
token ids and sends back each step's accepted tokens of each request.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from specpilot.errors import SpecPilotError
from specpilot.judges.worker_proc import Worker, WorkerError, clean_checkout
from specpilot.memory.store import Memory
from specpilot.serve.backend import Text, drafter_in_use
from specpilot.serve.systems import Named
from stock.system import default_device
from stock.tokenizer import Tokenizer
from stock.weights import resolve


class ConfinedBackend(Text):
    """A Backend whose engine is `worker`'s system, started here with the "serve" command;
    `ready` is the worker's ready report (tree, options in effect, confinement)."""

    def __init__(self, worker: Worker, tokenizer, name: str, max_batch: int,
                 prepare: bool = False):
        self.worker = worker
        try:
            self.ready = worker.start()
            worker.send({"cmd": "serve", "id": "serve", "max_batch": max_batch,
                         "prepare": prepare})
            serving = worker.next_event()
            if serving.get("event") != "serving":
                raise WorkerError(f"{worker.label}: expected serving, got "
                                  f"{serving.get('event')}")
        except BaseException:
            worker.stop()
            raise
        super().__init__(tokenizer, worker.drafter, name, int(serving["max_context"]),
                         serving["stop_ids"])
        self.drafter_name = drafter_in_use(worker.drafter, serving.get("drafter"),
                                           serving.get("batch_drafter"))
        self.max_batch = max_batch
        self.prepared = int(serving.get("graphs", 0))
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._queues: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._error: str | None = None
        threading.Thread(target=self._read, name="confined-replies", daemon=True).start()

    def stream(self, prompt_ids: list[int], max_new: int) -> Iterator[list[int]]:
        rid = f"r{next(self._ids)}"
        out: queue.Queue = queue.Queue()
        with self._lock:
            if self._error is not None:
                raise SpecPilotError(f"the served system stopped: {self._error}")
            self._queues[rid] = out
        try:
            try:
                with self._send_lock:
                    self.worker.send({"cmd": "submit", "id": rid, "ids": list(prompt_ids),
                                      "max_new": int(max_new)})
            except (WorkerError, OSError, ValueError) as exc:   # it exited: the pipe is shut
                raise SpecPilotError(f"the served system stopped: {exc}") from None
            while True:
                msg = out.get()
                if msg.get("event") == "tokens":
                    yield [int(t) for t in msg["tokens"]]
                elif msg.get("reason") == "refused":
                    raise ValueError(msg.get("message") or "the engine refused the request")
                elif msg.get("event") == "end":
                    return
                else:   # the worker failed: every waiting request hears of it
                    raise SpecPilotError(f"the served system stopped: {msg.get('message')}")
        finally:
            with self._lock:
                self._queues.pop(rid, None)

    def _read(self) -> None:
        """The worker's replies, in order, to the request each names."""
        while True:
            try:
                msg = self.worker.next_event()
            except (WorkerError, ValueError, OSError) as exc:
                with self._lock:
                    self._error = str(exc)
                    waiting = list(self._queues.values())
                for q in waiting:
                    q.put({"event": "error", "message": str(exc)})
                return
            with self._lock:
                q = self._queues.get(msg.get("id"))
            if q is not None:
                q.put(msg)

    def close(self) -> None:
        self.worker.stop()


def start_named(memory: Memory, named: Named, options: dict[str, str], model: str,
                model_name: str, drafter: str, max_batch: int, prepare: bool,
                max_context: int | None, device: str | None, say
                ) -> tuple[ConfinedBackend, str]:
    """(backend, its description for the ready line) for `specpilot serve --system NAME`:
    the named system's clean checkout (serve/systems.py, `resolve_named`) decoding in a
    confined worker, this process tokenizing with this checkout's stock."""
    checkout = clean_checkout(memory.store, named.commit, memory.system_paths, memory.root)
    device = device or str(default_device())
    log = log_path(memory.root, checkout.tree)
    worker = Worker("served system", checkout, memory.system_paths, model, options, device,
                    log, drafter=drafter, max_context=max_context,
                    confine=memory.config.judges.confine)
    say(f"starting {named.what} (tree {checkout.tree[:12]}"
        + (", " + ", ".join(f"{k}={v}" for k, v in options.items()) if options else "")
        + f"; log {log}) ...")
    backend = ConfinedBackend(worker, Tokenizer(resolve(model)), model_name, max_batch,
                              prepare=prepare)
    return backend, (f"{device}; {named.what}, tree {checkout.tree[:12]}, "
                     f"confined: {backend.ready['confined']}")


def log_path(root: Path, tree: str) -> Path:
    """Where the served system's worker writes what it prints."""
    return root / ".specpilot" / "runs" / "serve" / f"{tree[:12]}.log"
