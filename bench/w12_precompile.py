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
import time

import torch

PRE_N, PRE_K = 1024, 2048   # stand-in shape (N, K)


def compile_task(task, dev: str = "cuda", n: int = PRE_N, k: int = PRE_K,
                 xdtype: torch.dtype = torch.bfloat16):
    """Worker: run one (kernel, view, config, M) on the stand-in shape. Returns (task,
    seconds, error or None)."""
    kernel, view, cfg, m = task
    t0 = time.perf_counter()
    try:
        from kernels.w12 import encode
        from kernels.w12.linear import fused_matmul

        g = torch.Generator(device=dev).manual_seed(0)
        w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
        x = torch.randn(m, k, device=dev, generator=g).to(xdtype)
        fused_matmul(kernel)(x, encode(w), view, cfg)
        if dev == "cuda":
            torch.cuda.synchronize()
        return task, time.perf_counter() - t0, None
    except Exception as exc:  # noqa: BLE001
        return task, time.perf_counter() - t0, repr(exc)[:300]


def tasks_for(ms) -> list:
    """(kernel, view, config, M) for every configuration either kernel may use at these M."""
    from kernels.w12 import gemm, gemv

    tasks = []
    for m in sorted({1 if m <= 16 else m for m in ms}):  # gemm: M is not specialised
        for cfg in gemm.CONFIGS:
            # split > 1 writes fp32 partials, split 1 writes y: two signatures per config
            for c in {cfg, dataclasses.replace(cfg, split=1)}:
                for view in ("w12", "w8"):
                    tasks.append(("gemm", view, c, m))
    for m in ms:
        for cfg in gemv.CONFIGS[gemv.bucket(m)]:
            for view in ("w12", "w8"):
                tasks.append(("gemv", view, cfg, m))
    tasks.sort(key=lambda t: (t[0] != "gemm", -t[3]))  # the slowest compiles first
    return tasks


def precompile(ms, result: dict, workers: int, timeout_s: float, log=print,
               limit: int | None = None, dev: str = "cuda",
               xdtype: torch.dtype = torch.bfloat16) -> None:
    """Run the tasks in `workers` spawned processes, waiting at most `timeout_s`; records
    counts, errors and seconds in result["precompile"]. dev="cpu" (--smoke): `limit`
    tasks under the interpreter on a tiny stand-in, to check the plumbing."""
    import concurrent.futures as cf
    import functools
    import multiprocessing as mp

    tasks = tasks_for(ms)[:limit]
    run = functools.partial(compile_task, dev=dev, xdtype=xdtype,
                            **({"n": 48, "k": 64} if dev == "cpu" else {}))
    t0 = time.perf_counter()
    done, errors = 0, []
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    try:
        futs = [ex.submit(run, task) for task in tasks]
        for fut in cf.as_completed(futs, timeout=timeout_s):
            task, _sec, err = fut.result()
            done += 1
            if err:
                errors.append(f"{task[0]} {task[1]} {task[2]} M={task[3]}: {err}")
    except cf.TimeoutError:
        log(f"precompile: stopped waiting after {timeout_s:.0f} s")
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    result["precompile"] = {"tasks": len(tasks), "done": done, "workers": workers,
                            "s": time.perf_counter() - t0, "errors": errors}
    log(f"precompile: {done}/{len(tasks)} kernels in {time.perf_counter() - t0:.1f} s "
        f"with {workers} workers, {len(errors)} errors")
    for e in errors[:6]:
        log(f"  precompile error: {e}")
