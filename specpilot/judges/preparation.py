"""A run's workers started and made ready before anything is timed: one worker a label on
its device (`spawn_workers`), every CUDA graph a request of the job can meet captured
(`prepare`), the processes grouped into sessions where only `controller.resident` pairs fit
at once (`session_groups`), and, with `controller.prepare_beside_reference`, all of it
started while stock's reference is computed (`Ahead`). The controller (controller.py)
measures them; nothing here is timed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from specpilot.config import Config
from specpilot.judges.design import Job, device_of
from specpilot.judges.eta import Clock
from specpilot.judges.worker_proc import Checkout, Worker


def session_groups(job: Job, cfg: Config) -> list[tuple[int, ...]]:
    """The process indices of each session: `controller.resident` pairs alive at a time."""
    k = cfg.controller.resident or job.processes
    return [tuple(range(i, min(i + k, job.processes))) for i in range(0, job.processes, k)]


class Ahead:
    """controller.prepare_beside_reference: every side's workers started from the calling
    thread once stock's reference has tokenized the prompts (`start`, stock_outputs'
    `beside`), their untimed preparation in a thread of its own while the references are
    computed; `join` waits for it (re-raising its failure); `stop` stops every worker
    started (idempotent: run_sides stops them after measuring). Nothing is timed before
    `join`, and no candidate learns more than before: the prompts' lengths (`prepare`'s
    end), never stock's outputs."""

    def __init__(self, systems: dict[str, tuple[Checkout, dict]], cfg: Config, log_dir: Path,
                 progress: Callable[[str], None], clock: Clock | None = None,
                 held: dict[str, Worker] | None = None):
        self.systems, self.cfg, self.log_dir, self.progress = systems, cfg, log_dir, progress
        self.held = held   # hold_workers' processes, options checked: they load, not start
        self.clock = clock or Clock()
        self.workers: dict[str, Worker] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, job: Job) -> None:
        self.progress("every side's workers started, to prepare beside stock's reference")
        with self.clock.phase("workers started"):
            spawn_workers(self.workers, self.systems, job, self.cfg, self.log_dir, self.held)

        def run() -> None:
            try:
                with self.clock.phase("graphs (beside the reference)"):
                    prepare(self.workers, job, self.progress)
            except BaseException as exc:   # noqa: BLE001 - re-raised by join
                self._error = exc

        self._thread = threading.Thread(target=run, name="prepare-ahead", daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        for w in self.workers.values():   # a worker stopped mid-call fails that call
            w.stop()
        if self._thread is not None:
            self._thread.join()


def worker_of(label: str, systems: dict[str, tuple[Checkout, dict]], job: Job, cfg: Config,
              log_dir: Path, hold: bool = False) -> Worker:
    """The worker of `label` (A0, B1, ...): its side's checkout and options, its device, its
    drafter, the job's model and context; not started."""
    co, opts = systems[label[0]]
    device = device_of(label, job.devices)
    return Worker(label, co, cfg.system_paths, job.model, dict(opts), device,
                  log_dir / f"{label}-{device.replace(':', '')}.log",
                  None if job.drafter_of(label) == "ar" else job.drafter_of(label),
                  job.max_context, cfg.judges.confine, hold=hold)


def hold_workers(sides: list[tuple[str, str]], systems: dict[str, tuple[Checkout, dict]],
                 job: Job, cfg: Config, log_dir: Path) -> dict[str, Worker]:
    """Each named side's first worker (`side`0), started to check its options with its own
    registry and then held, no model loaded, until spawn_workers loads it: a bad option
    fails in seconds, before stock's reference, by the process that then serves the side,
    not by one more process. `sides`: (side letter, the label its errors carry). Returns
    the held workers by label; on a refusal every one started is stopped and the first
    refusal (in `sides`' order) raised."""
    held: dict[str, Worker] = {}
    try:
        for side, said in sides:
            w = worker_of(f"{side}0", systems, job, cfg, log_dir, hold=True)
            w.label = said   # the refusal names the side as the user wrote it
            held[f"{side}0"] = w
            w.begin()   # side by side: each is seconds of imports, no model
        for label, w in held.items():
            w.held()
            w.label = label
        return held
    except BaseException:
        for w in held.values():
            w.stop()
        raise


def spawn_workers(workers: dict, systems: dict[str, tuple[Checkout, dict]], job: Job,
                  cfg: Config, log_dir: Path, held: dict[str, Worker] | None = None) -> None:
    """One worker per label, on its device (`device_of`), into `workers` (filled as they
    start, so the caller stops whatever started if a later one fails); `systems`: each
    side's checkout and options, by side letter; `held`: workers already started and
    options-checked (hold_workers), taken from it (the caller stops what is left) and
    told to load instead of started anew. On CPU devices every
    process is started before any is waited for: a start is seconds of single-threaded
    imports and model construction, so the processes start side by side on the cores
    instead of one after another (on a 2-core CPU a compare's four workers of the tiny
    target took ~7 s in turn, ~4 s together). On CUDA they start one at a time, each ready
    before the next loads its model (a model load's transient memory is never stacked on
    another's). Every process is spawned from this thread (lifeline: a child dies with the
    thread that started it) and nothing is measured before all are ready."""
    together = all(d.startswith("cpu") for d in job.devices)
    for label in job.names:
        w = (held or {}).pop(label, None)
        if w is not None:
            workers[label] = w
            w.load()
        else:
            w = worker_of(label, systems, job, cfg, log_dir)
            workers[label] = w
            w.begin()
        if not together:
            w.finish()
    if together:
        for label in job.names:
            workers[label].finish()


def prepare(workers: dict, job: Job, progress: Callable[[str], None] = lambda s: None) -> None:
    """Before the warm-up, untimed: each worker captures every graph a request of this job
    can meet (stock's Engine.prepare, up to the longest prompt + max_new + a step's largest
    bucket), so a shape's first use (a capture, a compile) is never inside a timed request.
    Without it a side whose steps have more shapes (a tree's slots beside the chain's) paid
    them in whichever timed request first reached a new KV bucket: on the H200, 0.6 s in one
    request of 12, which turned a faster tree-verify into a 9.8% loss. Batched rounds
    (throughput mode) prepare the batched engine of their concurrency (BatchEngine.prepare:
    every requests, tokens and KV bucket). The workers prepare in waves, one process of
    each side a wave (A0 with B0, then A1 with B1, ...), each in a thread of its own
    (nothing is timed yet): a side's processes share their tree's compile cache
    (worker_proc.compile_cache), so its first process compiles and the others read. A
    throughput verdict's four workers (H100, embedded default, C = 16) took 96, 162, 32 and
    42 s one after another (session 23), and all four at once no less: A0 and A1 193 s, B0
    and B1 331 s (session 26; presumably each pair compiling the same shapes side by
    side; the waves not yet timed)."""
    lengths = [len(ids) for row in job.round_requests for _rid, _p, ids in row
               if ids is not None]
    if not lengths:
        return
    end = max(lengths) + job.max_new + 64
    extra = {"max_batch": job.batch} if job.batch else {}
    progress(f"graphs up to a context of {end}" + (f", batches of {job.batch}" if job.batch
                                                    else ""))
    t0 = time.perf_counter()

    def one(label: str) -> None:
        rep = workers[label].call("prepare", f"prepare-{label}", end=end, **extra)
        if rep.get("graphs"):
            took = f", {rep['compile_s']:.0f} s of it compiling" if rep.get("compile_s") else ""
            progress(f"  {label}: {rep['graphs']} graphs in {time.perf_counter() - t0:.0f} s"
                     + took)

    waves: dict[str, list[str]] = {}
    for label in job.names:   # "A1" -> wave "1"
        waves.setdefault(label[1:], []).append(label)
    for wave in waves.values():
        with ThreadPoolExecutor(len(wave)) as pool:
            for fut in [pool.submit(one, label) for label in wave]:
                fut.result()   # a worker's failure is raised here, after its wave returned
