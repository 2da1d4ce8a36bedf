"""Helpers shared by the bench/ suite (import this first: it puts the repository on sys.path).

Every suite script imports `common` before `stock`, `kernels` or `specpilot`: unless a
`stock` package is already importable from a path given on PYTHONPATH (an entry's tree put
first, as bench/gpu_numerics.py --smoke does), the repository this file lives in goes first
on sys.path. Nothing here imports torch at module level.

    log(msg)                      progress line with seconds since start, flushed
    sync(dev)                     torch.cuda.synchronize() on CUDA, nothing on CPU
    kernel_times(fn)              fn() under torch.profiler: device us and calls a kernel name
    timed(fn, iters, dev)         per-call time: CUDA events on CUDA, perf_counter on CPU;
                                  median, p10, p90 (nearest rank), min, max, n (ms)
    copy_bandwidth(nbytes, dev)   device-to-device copy; bytes read + written over time
    first_divergence(a, b)        first index where two token lists differ (None: equal)
    quantile(xs, p)               nearest-rank quantile of a list
    table(cols, rows)             one Markdown table (what each script prints; pastes into
                                  docs/results.md as is)
    write_json(out, name, obj)    $OUT/name (nothing when out is empty)
    entry_tree(entry, dest)       a copy of the system paths with memory/<entry>.patch applied
                                  (its dependencies' patches first: entry_chain)
    smoke_device(args)            "cpu" under --smoke, else the --device asked or cuda
    entry_on_path(argv)           --entry ID: stock imported from a copy with the entry applied
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = time.perf_counter()
GiB = 1 << 30


def _on_path() -> None:
    given = any(Path(p, "stock").is_dir() for p in sys.path[1:] if p)
    if "stock" not in sys.modules and not given:
        sys.path.insert(0, str(ROOT))


_on_path()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def is_cuda(dev) -> bool:
    return str(dev).startswith("cuda")


def sync(dev="cuda") -> None:
    if is_cuda(dev):
        import torch

        torch.cuda.synchronize()


def quantile(xs, p: float) -> float:
    """Nearest rank on the sorted values (p in [0, 1])."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]


def summary(ms: list[float]) -> dict:
    return {"median_ms": statistics.median(ms), "p10_ms": quantile(ms, 0.1),
            "p90_ms": quantile(ms, 0.9), "min_ms": min(ms), "max_ms": max(ms), "n": len(ms)}


def timed(fn, iters: int, dev="cuda", warmup: int = 3, each: bool = False) -> dict:
    """Per-call time of fn: CUDA events around each call on CUDA (device time; calls queued
    back to back, or with `each` the host waits for every call's end event before the next),
    perf_counter on CPU. Median, p10, p90, min, max in ms."""
    for _ in range(warmup):
        fn()
    sync(dev)
    if is_cuda(dev):
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
            if each:
                e.synchronize()
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    else:
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ms.append(1e3 * (time.perf_counter() - t0))
    return summary(ms)


def kernel_times(fn) -> tuple[dict[str, list], float]:
    """`fn()` once under torch.profiler (CUDA): {kernel name: [device us, calls]} and the
    wall seconds (slowed by the profiler). Kernels replayed from CUDA graphs are listed where
    the profiler sees them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    acc: dict[str, list] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            a = acc.setdefault(e.key, [0.0, 0])
            a[0] += e.self_device_time_total
            a[1] += e.count
    return acc, wall


def profiled(fn, top: int) -> tuple[dict, list[list]]:
    """`fn()` once under torch.profiler (CUDA, `kernel_times`): its wall seconds, the sum of
    its kernels' device time, how many distinct kernels, and the `top` kernels by device
    time (name, calls, ms, % of kernel time). The profiler slows the host: the wall time is
    not the run's."""
    acc, wall = kernel_times(fn)
    total_us = sum(us for us, _ in acc.values())
    order = sorted(acc.items(), key=lambda kv: -kv[1][0])
    rows = [[name[:70], n, f"{us / 1e3:.2f}", f"{100 * us / max(total_us, 1e-9):.1f}"]
            for name, (us, n) in order[:top]]
    return {"wall_s": wall, "kernel_s": total_us / 1e6, "kernels": len(acc)}, rows


def parse_mode(mode: str) -> tuple[str, dict]:
    """"block" or "block:admit_chunk=8+node_budget=96": the drafter and engine options."""
    name, _, rest = mode.partition(":")
    opts = dict(kv.split("=", 1) for kv in rest.split("+")) if rest else {}
    return name, opts


def embedded_workload(device: str, max_new: int, n: int, target: str = "embedded"):
    """(model, n requests [(chat-templated prompt ids, max_new)], stop ids) of `target` (a
    model stock.system.load_system knows: the embedded default) on the dev requests, the categories taken in turn (the dev file is stored a
    category at a time, and a run of 2C requests at C = 16 took its first 32, all code,
    until 2026-12-06, session 28), repeated where n is more than the set."""
    from specpilot.requests import interleaved, load_dev
    from stock.options import Options
    from stock.system import load_system

    system = load_system(target, Options(), device=device, max_context=4096)
    tok = system.tokenizer
    reqs = [(tok.chat(r.prompt), min(max_new, r.max_new_tokens))
            for r in interleaved(load_dev())]
    return (system.engine.model, [reqs[i % len(reqs)] for i in range(n)],
            frozenset(system.engine.stop_ids))


def copy_bandwidth(nbytes: int, dev="cuda", iters: int = 10) -> dict:
    """A device-to-device copy of `nbytes`: bandwidth counts the bytes read plus the bytes
    written (2 * nbytes per copy), as the copy figure in docs/ARCHITECTURE's facts does."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    src.random_(0, 255)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), iters, dev)
    del src, dst
    if is_cuda(dev):
        torch.cuda.empty_cache()
    return {"bytes": nbytes, **t, "read_plus_write_bytes_per_s": 2 * nbytes / (t["median_ms"] / 1e3)}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First index where a and b differ; the shorter length if one is a prefix of the
    other; None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def fmt(v, spec: str = ".3f") -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return format(v, spec)


def table(cols: list[str], rows: list[list], title: str | None = None) -> str:
    """One Markdown table; cells are str() of the values (None: blank)."""
    lines = [title, ""] if title else []
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        lines.append("| " + " | ".join("" if c is None else str(c) for c in r) + " |")
    return "\n".join(lines)


def print_table(cols: list[str], rows: list[list], title: str | None = None) -> None:
    print("\n" + table(cols, rows, title), flush=True)


def write_json(out: str | os.PathLike | None, name: str, obj) -> Path | None:
    if not out:
        return None
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str))
    return path


def device_name(dev) -> str:
    if is_cuda(dev):
        import torch

        return torch.cuda.get_device_name(torch.device(dev))
    return "cpu"


def smoke_device(args) -> str:
    """--smoke runs on the CPU; otherwise --device, defaulting to cuda when present."""
    if getattr(args, "smoke", False):
        return "cpu"
    if getattr(args, "device", None):
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def entry_tree(entry: str, dest: str | os.PathLike, root: Path = ROOT) -> Path:
    """`dest`/ with copies of the system paths (stock/, kernels/) and memory/<entry>.patch
    applied to them, its dependencies' patches first: put it first on PYTHONPATH (the
    repository second) to run an entry's code from this checkout without a git worktree.
    An entry of several dependencies (two-level) holds a patch made on a tree where its
    siblings were already applied: where a plain `git apply` fails, dest/ becomes a git
    repository and the chain is applied as bench/stage.sh's stage_repo applies it (3-way,
    then a union of conflicts where both sides only added lines)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for part in ("stock", "kernels"):
        shutil.copytree(root / part, dest / part, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    # outside any repository (GIT_CEILING_DIRECTORIES), git apply patches dest's files
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.parent)}
    chain = entry_chain(entry, root)     # its dependencies first, then the entry
    patches = [str(root / "memory" / f"{name}.patch") for name in chain]
    plain = subprocess.run(["git", "apply", "--check", *patches], cwd=dest, env=env,
                           capture_output=True)
    if plain.returncode == 0:
        subprocess.run(["git", "apply", *patches], cwd=dest, check=True, env=env)
        return dest
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "stock"]):
        subprocess.run(git + cmd, cwd=dest, check=True, env=env, capture_output=True)
    stage = root / "bench" / "stage.sh"
    for name, patch in zip(chain, patches):
        done = subprocess.run(
            ["bash", "-c", f'source "{stage}" && {{ git apply "$1" 2>/dev/null || '
             'git apply --3way "$1" 2>/dev/null || stage_union; }', "_", patch],
            cwd=dest, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"entry_tree: memory/{name}.patch (for {entry}) did not apply"
                               f" onto this tree's stock/ and kernels/: {done.stdout.strip()}")
        subprocess.run(git + ["add", "-A"], cwd=dest, check=True, env=env)
        subprocess.run(git + ["commit", "-qm", name, "--allow-empty"], cwd=dest, check=True,
                       env=env)
    shutil.rmtree(dest / ".git")
    return dest


def entry_chain(entry: str, root: Path = ROOT) -> list[str]:
    """The entry and its dependencies (memory/<id>.toml's deps), dependencies first, in the
    order `git specpilot replay` applies them (specpilot/memory/dag.py's topo_order: ties
    broken by id), so that patches of an entry of several dependencies compose as there."""
    import heapq
    import tomllib

    deps: dict[str, list[str]] = {}
    todo = [entry]
    while todo:
        e = todo.pop()
        if e not in deps:
            meta = tomllib.loads((root / "memory" / f"{e}.toml").read_text())
            deps[e] = list(meta.get("deps", []))
            todo += deps[e]
    left = {e: len(set(d)) for e, d in deps.items()}
    ready = [e for e, n in left.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        e = heapq.heappop(ready)
        out.append(e)
        for child, ds in deps.items():
            if e in ds:
                left[child] -= 1
                if left[child] == 0:
                    heapq.heappush(ready, child)
    return out


def entry_on_path(argv: list[str]) -> str | None:
    """`--entry ID` in argv: the entry (with its dependencies) applied to a copy of the
    system paths in a temporary folder, put first on sys.path so that `stock` is imported
    from there (call before anything imports stock). Returns the entry id or None."""
    if "--entry" not in argv:
        return None
    entry = argv[argv.index("--entry") + 1]
    import tempfile

    dest = entry_tree(entry, Path(tempfile.mkdtemp(prefix=f"entry-{entry}.")) / "tree")
    sys.path.insert(0, str(dest))
    return entry
