"""Compile every configuration the W12 kernels may tune over, in parallel worker
processes, into Triton's on-disk cache (used by bench/gpu_w12.py before it tunes).

Each task runs one (kernel, view, config, M) once on a small stand-in shape whose integer
arguments fall in the same specialisation classes as the benchmark shapes (every dimension
divisible by 16, every GEMV chunk full), so the main process later finds the compiled
kernel in the cache instead of compiling it: Triton compiles one kernel at a time per
process, and the first GEMM's kernels take seconds each. Workers are spawned, each with
its own CUDA context; a task that fails only costs the main process that compile.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch

PRE_N, PRE_K = 1024, 2048   # stand-in shape (N, K)


@functools.lru_cache(maxsize=2)
def _standin(n: int, k: int, dev: str):
    """The stand-in weight, encoded on the CPU once per worker and copied over: a worker
    puts little more than the kernels themselves on the GPU while the main process times
    (each process is its own CUDA context)."""
    from kernels.w12 import encode

    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    t_cpu = encode(w)
    ptr = t_cpu.row_ptr()
    t = t_cpu.to(dev)
    t._row_ptr = ptr.to(dev)
    return t


def compile_task(task, dev: str = "cuda", n: int = PRE_N, k: int = PRE_K,
                 xdtype: torch.dtype = torch.bfloat16):
    """Worker: run one (kernel, view, config, M) on the stand-in shape. Returns (task,
    seconds, error or None)."""
    kernel, view, cfg, m = task
    t0 = time.perf_counter()
    try:
        from kernels.w12.ops import fused_matmul

        t = _standin(n, k, dev)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(xdtype).to(dev)
        fused_matmul(kernel)(x, t, view, cfg)
        if dev == "cuda":
            torch.cuda.synchronize()
        return task, time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001
        return task, time.perf_counter() - t0, repr(exc)[:300]


def tasks_for(ms) -> list:
    """(kernel, view, config, M) for every configuration either kernel may use at these M,
    in the order they are needed: kernels that write fp32 partials (split > 1: every shape
    but the LM head) first, the slowest compiles (the first GEMM) first within each."""
    from kernels.w12 import gemm, gemv

    # split > 1 writes fp32 partials, split 1 writes y: two signatures per configuration
    def variants(cfg):
        return [dataclasses.replace(cfg, split=2), dataclasses.replace(cfg, split=1)]

    tasks = []
    for m in sorted({1 if m <= 16 else m for m in ms}):  # gemm: M is not specialised
        for cfg in gemm.CONFIGS:
            for rank, c in enumerate(variants(cfg)):
                for view in ("w12", "w8"):
                    tasks.append((rank, 0, ("gemm", view, c, m)))
    for m in ms:
        for cfg in gemv.CONFIGS[gemv.bucket(m)]:
            for rank, c in enumerate(variants(cfg)):
                for view in ("w12", "w8"):
                    tasks.append((rank, 1, ("gemv", view, c, m)))
    tasks.sort(key=lambda t: (t[0], t[1], -t[2][3]))
    return list(dict.fromkeys(t for _, _, t in tasks))  # without repeats, in order


def _nice() -> None:
    try:
        import os

        os.nice(10)   # the main process, which launches and times, comes first
    except OSError:
        pass


class Precompiler:
    """Compile every task in `workers` spawned processes (each with its own CUDA context),
    niced. `wait` blocks until all are done or a timeout passes; the rest go on compiling in
    the background until `close`, which cancels what has not started and ends the workers.
    dev="cpu" (--smoke): `limit` tasks under the interpreter on a tiny stand-in."""

    def __init__(self, ms, workers: int, log=print, limit: int | None = None,
                 dev: str = "cuda", xdtype: torch.dtype = torch.bfloat16):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.log, self.t0, self.workers = log, time.perf_counter(), workers
        self.tasks = tasks_for(ms)[:limit]
        run = functools.partial(compile_task, dev=dev, xdtype=xdtype,
                                **({"n": 48, "k": 64} if dev == "cpu" else {}))
        self.ex = cf.ProcessPoolExecutor(max_workers=workers, initializer=_nice,
                                         mp_context=mp.get_context("spawn"))
        self.futs = [self.ex.submit(run, task) for task in self.tasks]

    def summary(self) -> dict:
        done = [f.result() for f in self.futs if f.done() and not f.cancelled()]
        errors = [f"{t[0]} {t[1]} {t[2]} M={t[3]}: {e}" for t, _s, e in done if e]
        return {"tasks": len(self.tasks), "done": len(done), "workers": self.workers,
                "s": time.perf_counter() - self.t0, "errors": errors}

    def wait(self, timeout_s: float) -> dict:
        import concurrent.futures as cf

        cf.wait(self.futs, timeout=timeout_s)
        info = self.summary()
        rest = "" if info["done"] == info["tasks"] else "; the rest go on in the background"
        self.log(f"precompile: {info['done']}/{info['tasks']} kernels in {info['s']:.1f} s with "
                 f"{self.workers} workers, {len(info['errors'])} errors{rest}")
        for e in info["errors"][:6]:
            self.log(f"  precompile error: {e}")
        return info

    def close(self) -> dict:
        info = self.summary()
        procs = list((getattr(self.ex, "_processes", None) or {}).values())  # our workers
        self.ex.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        return info
