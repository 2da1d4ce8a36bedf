"""Clean checkouts of a commit's system paths, and a system served by a worker process.

A checkout is exported from git objects (never from a live worktree) into
`.specpilot/cache/checkouts/<system tree hash>/`, checked against that hash, and made
read-only. A `Worker` runs `specpilot/judges/worker_main.py` with PYTHONPATH set to the
checkout alone, requests on its stdin and replies on a private pipe; it checks the
worker's report of options and tree hash. The worker runs confined (specpilot/judges/
confine.py: bubblewrap, a read-only view of its checkout and model, private scratch, no
network, no secrets) unless the user opted out; `ready["confined"]` says which.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specpilot import lifeline, links
from specpilot.errors import SpecPilotError
from specpilot.gitstore import GitStore
from specpilot.judges import confine as confinement
from specpilot.judges.worker_main import tree_hash

WORKER = Path(__file__).with_name("worker_main.py")
CHECKOUTS = Path(".specpilot") / "cache" / "checkouts"
COMPILES = Path(".specpilot") / "cache" / "compile"   # the compilers' caches, a folder a tree
SCRUB_ENV = ("SPECPILOT_OPTS", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")


class WorkerError(SpecPilotError):
    pass


@dataclass(frozen=True)
class Checkout:
    commit: str
    tree: str  # git tree hash of the system paths
    path: Path


def clean_checkout(store: GitStore, rev: str, system_paths: list[str],
                   cache_root: Path) -> Checkout:
    commit = store.must_resolve(rev)
    tree = store.system_tree(commit, system_paths)
    # A link leading out of the system paths would reach what nobody hashed, and the
    # read-only pass below must never reach through one: refused before anything is used.
    links.check(store.links(commit, system_paths), system_paths, f"checkout of {commit[:12]}")
    dest = cache_root / CHECKOUTS / tree
    if dest.is_dir() and tree_hash(dest, system_paths) == tree:
        return Checkout(commit, tree, dest)
    if dest.exists():  # damaged or half-written: rebuild
        _make_writable(dest)
        shutil.rmtree(dest)
    tmp = dest.with_name(f"{tree}.tmp{os.getpid()}")
    if tmp.exists():
        _make_writable(tmp)
        shutil.rmtree(tmp)
    store.export(commit, system_paths, tmp)
    got = tree_hash(tmp, system_paths)
    if got != tree:
        raise WorkerError(f"checkout of {commit[:12]} hashes to {got[:12]}, not {tree[:12]}")
    _make_readonly(tmp)
    os.replace(tmp, dest)
    return Checkout(commit, tree, dest)


def _make_readonly(root: Path) -> None:
    """Clear the write bits of every file under `root`; links are never followed (their
    targets may lie anywhere), so only the checkout's own files change mode."""
    for folder, dirs, files in os.walk(root):
        for name in files:
            p = Path(folder) / name
            st = p.lstat()
            if not stat.S_ISLNK(st.st_mode):
                p.chmod(st.st_mode & ~0o222)


def _make_writable(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in files + dirs:
            p = Path(folder) / name
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | 0o200)


def _same(effective, asked) -> bool:
    """Does the worker's parsed option value match what was asked (text or typed)?"""
    if isinstance(effective, bool):
        text = str(asked).strip().lower()
        return text in (("1", "true", "yes", "on") if effective else ("0", "false", "no", "off"))
    if isinstance(effective, (int, float)) and not isinstance(asked, bool):
        try:
            return type(effective)(str(asked).strip()) == effective
        except ValueError:
            return False
    return str(effective) == str(asked)


@dataclass
class Reply:
    tokens: list[int]
    seconds: float  # measured by the controller around the channel
    worker_s: float
    steps: int


def isolate_device(device: str, visible: str | None) -> tuple[str | None, str]:
    """A worker for `cuda:N` sees that one GPU alone, as its cuda:0: returns the worker's
    CUDA_VISIBLE_DEVICES (N's entry in ours when we have one) and the device name it uses.
    Inside one process a second GPU is never the current device by default, and kernels
    launched there (graph capture, Triton) then run against the wrong device; a process
    that sees one GPU cannot get that wrong. CPU devices pass through unchanged."""
    if not device.startswith("cuda"):
        return None, device
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    ours = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if ours and index >= len(ours):
        raise WorkerError(f"{device}: only {len(ours)} visible device(s) ({visible})")
    return (ours[index] if ours else str(index)), "cuda:0"


def model_reads(model: str, options: dict) -> list[tuple[Path, Path]]:
    """What a confined worker must read besides its checkout, as (host path, path it sees):
    the model (resolved here, by the project's own stock: a GGUF is converted here once, and
    the converted folder is shown where the worker's own cache lookup lands) and a
    block-drafter weights folder given as an option."""
    reads: list[tuple[Path, Path]] = []
    if not model.startswith("random:"):
        # lazy: stock.weights imports torch (seconds); only a real model's files need it
        from stock.gguf_convert import cache_root
        from stock.weights import resolve

        folder = resolve(model)
        if folder.resolve().parent == cache_root().resolve():
            reads.append((folder.resolve(), confinement.MODEL_CACHE / folder.name))
        else:
            reads += _seen(folder)
        if Path(model).expanduser().is_file():  # a GGUF: its path is the converted folder's key
            reads += _seen(Path(model).expanduser())
    weights = Path(str(options.get("block_weights") or "")).expanduser()
    if str(weights) not in ("", ".") and weights.exists():
        reads += _seen(weights)
    return reads


def _seen(path: Path) -> list[tuple[Path, Path]]:
    """`path` shown read-only at its real place and, if it differs, where it was named."""
    real = path.resolve()
    return [(real, real)] + ([(real, path.absolute())] if path.absolute() != real else [])


def compile_cache(checkout: Checkout) -> Path | None:
    """The compilers' cache of `checkout`'s system tree, shared by every confined worker of
    that tree (from run to run: a worker's compiles, minutes on a GPU, are then mostly cache
    reads) and by no worker of another tree: .specpilot/cache/compile/<tree>, beside the
    clean checkouts. None (a cache inside the worker's own scratch) for a checkout that is
    not one of them."""
    if checkout.path.parent.name != CHECKOUTS.name:
        return None
    folder = checkout.path.parent.with_name(COMPILES.name) / checkout.tree
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def launch(checkout: Checkout, device: str, model: str, options: dict,
           mode: str) -> tuple[list[str], dict, str, Path, Path | None]:
    """The command line, environment, device name, checkout path as the worker sees it and
    private scratch folder (None unconfined) of every process that runs a system: gates,
    references, the controller and the cycle's measurements all start `worker_main.py`
    through here, so a candidate cannot tell which judge started it from its argv, its
    environment or its parent's command line (nothing in them names the judge; the scratch
    folder's name is random; nothing of specpilot is on its path)."""
    visible, name = isolate_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    argv = [sys.executable, "-P", "-B", "-s", str(WORKER)]
    if mode == confinement.CONFINED:
        scratch = lifeline.track_folder(Path(tempfile.mkdtemp(prefix="specpilot-worker-")))
        argv = confinement.command(
            argv, WORKER, checkout.path, scratch, model_reads(model, options), device,
            {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {},
            compile_cache=compile_cache(checkout))
        return argv, confinement.outer_env(), name, confinement.CHECKOUT, scratch
    # opted out: the candidate runs with the user's rights
    env = {k: v for k, v in os.environ.items() if k not in SCRUB_ENV}
    env.update(PYTHONPATH=str(checkout.path), PYTHONDONTWRITEBYTECODE="1",
               PYTHONNOUSERSITE="1")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return argv, env, name, checkout.path.resolve(), None


@dataclass
class Worker:
    """One system on one device, served from a clean checkout by a separate process."""

    label: str
    checkout: Checkout
    system_paths: list[str]
    model: str
    options: dict
    device: str
    log_path: Path
    drafter: str | None = None
    max_context: int | None = None
    confine: bool = True   # [judges] confine; SPECPILOT_UNCONFINED=1 also opts out
    hold: bool = False   # reply "options" first (held()), load the model at load()
    ready: dict = field(default_factory=dict)

    def start(self, timeout: float = 600.0) -> dict:
        self.begin()
        return self.finish()

    def begin(self) -> None:
        """Start the process and send its setup; `finish()` waits for its report."""
        mode = confinement.policy(self.confine)  # before anything is opened: it may refuse
        self._mode = mode
        argv, env, device, self._inside, self._scratch = launch(
            self.checkout, self.device, self.model, self.options, mode)
        read_fd, write_fd = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        # replies: the child's stdout, which the worker moves to a private descriptor
        # before anything of the system is imported (its own stdout then goes to the log)
        # its own session, killed with this process (lifeline: even by SIGKILL; SIGTERM and
        # SIGINT also remove its scratch folder)
        self.proc = lifeline.spawn(argv, stdin=subprocess.PIPE, stdout=write_fd,
                                   stderr=self._log, cwd=self.checkout.path, env=env,
                                   text=True)
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self._send({"checkout": str(self._inside), "system_paths": self.system_paths,
                    "model": self.model, "options": self.options, "device": device,
                    "drafter": self.drafter, "max_context": self.max_context,
                    "hold": self.hold})

    def held(self) -> dict:
        """A `hold` worker's first report: the options in effect once the checkout's own
        registry checked them (a bad one is this WorkerError), tree and stock checked as
        `ready`'s; no model is loaded until `load()`."""
        said = self._receive("options")
        self._check_ready(said)
        return said["options"]

    def load(self) -> None:
        """A `hold` worker, its options checked (`held()`), loads its model; `finish()`
        waits for its `ready`."""
        self._send({"cmd": "load"})

    def finish(self) -> dict:
        self.ready = self._receive("ready")
        self.ready["confined"] = self._mode  # the parent's word, not the worker's
        self._check_ready(self.ready)
        return self.ready

    def _check_ready(self, said: dict) -> None:
        if said.get("tree") != self.checkout.tree:
            raise WorkerError(f"{self.label}: worker reports tree {said.get('tree')}, "
                              f"asked for {self.checkout.tree}")
        effective = said.get("options", {})
        for name, value in self.options.items():
            if name not in effective or not _same(effective[name], value):
                raise WorkerError(f"{self.label}: option {name} in effect is "
                                  f"{effective.get(name)!r}, asked for {value!r}")
        if Path(said.get("stock_file", "/")).parents[1] != self._inside:
            raise WorkerError(f"{self.label}: stock ran from {said.get('stock_file')}")

    def run(self, request_id: str, max_new: int, prompt: str | None = None,
            ids: list[int] | None = None) -> Reply:
        msg = {"cmd": "run", "id": request_id, "max_new": max_new}
        msg.update({"ids": ids} if ids is not None else {"prompt": prompt})
        t0 = time.perf_counter()
        self._send(msg)
        rep = self._receive("done")
        seconds = time.perf_counter() - t0
        if rep.get("id") != request_id:
            raise WorkerError(f"{self.label}: reply for {rep.get('id')!r}, sent {request_id!r}")
        return Reply(rep["tokens"], seconds, rep.get("worker_s", 0.0), rep.get("steps", 0))

    def batch(self, batch_id: str, items: list[tuple[str, list[int]]], max_new: int,
              max_batch: int, arrivals: list[float] | None = None
              ) -> tuple[dict[str, list[int]], float]:
        """Every item served together by the system's batched engine: (tokens per request
        id, seconds measured here around the channel, the whole batch's). `arrivals`: each
        item's offset in seconds from the batch's start; each is sent only then (the worker
        cannot see a request before it arrives), the first with the batch's header."""
        t0 = time.perf_counter()
        if arrivals is None:
            self._send({"cmd": "batch", "id": batch_id, "max_new": max_new,
                        "max_batch": max_batch,
                        "items": [{"id": rid, "ids": ids} for rid, ids in items]})
        else:
            if len(arrivals) != len(items) or sorted(arrivals) != list(arrivals):
                raise WorkerError(f"{self.label}: batch {batch_id}: one rising arrival time an "
                                  "item")
            self._send({"cmd": "batch", "id": batch_id, "max_new": max_new,
                        "max_batch": max_batch, "count": len(items), "items": []})
            for (rid, ids), at in zip(items, arrivals):
                time.sleep(max(0.0, t0 + at - time.perf_counter()))
                self._send({"cmd": "submit", "id": batch_id, "item": {"id": rid, "ids": ids}})
        rep = self._receive("done")
        seconds = time.perf_counter() - t0
        if rep.get("id") != batch_id:
            raise WorkerError(f"{self.label}: reply for {rep.get('id')!r}, sent {batch_id!r}")
        outputs = rep.get("outputs") or {}
        if sorted(outputs) != sorted(rid for rid, _ in items):
            raise WorkerError(f"{self.label}: batch {batch_id} answered other requests")
        return {rid: list(toks) for rid, toks in outputs.items()}, seconds

    def call(self, cmd: str, request_id: str, **fields) -> dict:
        """Any other command of the worker (force, reference, tokenize); the raw reply."""
        self._send({"cmd": cmd, "id": request_id, **fields})
        rep = self._receive("done")
        if rep.get("id") != request_id:
            raise WorkerError(f"{self.label}: reply for {rep.get('id')!r}, sent {request_id!r}")
        return rep

    def send(self, msg: dict) -> None:
        """One message as is (a streaming caller: `specpilot serve --system`'s submits)."""
        self._send(msg)

    def next_event(self) -> dict:
        """The worker's next reply, whatever its event (a streaming caller reads them in
        order from one thread); WorkerError when the worker reported an error or exited."""
        return self._receive(None)

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"{self.label}: worker exited; see {self.log_path}") from None

    def _receive(self, event: str | None) -> dict:
        line = self._replies.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise WorkerError(f"{self.label}: worker exited with {self.proc.returncode}; "
                              f"see {self.log_path}")
        msg = json.loads(line)
        if msg.get("event") == "error":
            raise WorkerError(f"{self.label}: {msg.get('message')} (log: {self.log_path})")
        if event is not None and msg.get("event") != event:
            raise WorkerError(f"{self.label}: expected {event}, got {msg.get('event')}")
        return msg

    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        try:
            if proc is not None and proc.poll() is None:
                self._send({"cmd": "quit"})
                proc.stdin.close()
                proc.wait(timeout=30)
        except (WorkerError, subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.wait()
        finally:
            if proc is not None:
                lifeline.forget(proc)
                self._replies.close()
                self._log.close()
                self.proc = None
            if getattr(self, "_scratch", None) is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                lifeline.forget_folder(self._scratch)
                self._scratch = None


def deal(workers: list, items: list, work: Callable[[object, object], None]) -> None:
    """`work(worker, item)` for every item, the items dealt out among the started `workers`
    (worker k takes items k, k + n, ...), each worker in a thread of its own (the threads
    wait on the workers' replies); a failure is raised once every thread has returned.
    Stock's references and the forced passes of outputs go through here."""
    n = min(len(workers), len(items))

    def run(k: int) -> None:
        for item in items[k::len(workers)]:
            work(workers[k], item)

    with ThreadPoolExecutor(max(1, n)) as pool:
        for fut in [pool.submit(run, k) for k in range(n)]:
            fut.result()


def check_options(label: str, co: Checkout, system_paths: list[str], options: dict,
                  log_path: Path, confine: bool = True) -> dict:
    """The options in effect once `co`'s own registry has checked `options` (an unknown
    name or a value out of range is a one-line WorkerError), in a `hold` worker that is
    stopped before it loads a model: seconds, so that a judge fails on a bad --opt before
    it loads a model."""
    w = Worker(label, co, system_paths, "random:", dict(options), "cpu", log_path,
               confine=confine, hold=True)
    try:
        w.begin()
        return w.held()
    finally:
        w.stop()
