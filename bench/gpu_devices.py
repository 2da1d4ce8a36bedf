"""Device facts of a multi-GPU machine, before any paired run on it (issue 8).

For every visible GPU, alone: name, memory, SMs; device-to-device copy bandwidth (1 GiB,
read + write counted, median of 20) and a bf16 8192^3 matmul rate (median of 10 after
warm-up). Then all GPUs at once (one thread each, the same loops): how much each slows when
the others work, which is what side-by-side paired runs assume is small. Also whether the
GPUs can reach each other's memory (peer access) and the link matrix from nvidia-smi.

    python3 bench/gpu_devices.py [--out DIR]        # prints a table, writes gpu_devices.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

GiB = 1 << 30


def _events_ms(fn, dev: int, iters: int, warmup: int = 3) -> list[float]:
    with torch.cuda.device(dev):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(dev)
        out = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return out


def measure(dev: int, iters: int = 20) -> dict:
    """Copy bandwidth and bf16 matmul rate of one device (medians, with spread)."""
    d = torch.device("cuda", dev)
    src = torch.empty(GiB, dtype=torch.uint8, device=d)
    dst = torch.empty_like(src)
    copy = _events_ms(lambda: dst.copy_(src), dev, iters)
    n = 8192
    a = torch.randn(n, n, device=d, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=d, dtype=torch.bfloat16)
    mm = _events_ms(lambda: a @ b, dev, 10)
    del src, dst, a, b
    torch.cuda.empty_cache()
    cm, mmm = statistics.median(copy), statistics.median(mm)
    return {"copy_ms": cm, "copy_TBps": 2 * GiB / cm / 1e9, "copy_min_ms": min(copy),
            "copy_max_ms": max(copy), "mm_ms": mmm, "mm_TFLOPs": 2 * n ** 3 / mmm / 1e9,
            "mm_min_ms": min(mm), "mm_max_ms": max(mm)}


def together(devs: list[int]) -> dict:
    """Every device runs `measure` at the same time, one thread each."""
    out: dict[int, dict] = {}
    barrier = threading.Barrier(len(devs))

    def work(dev):
        barrier.wait()
        out[dev] = measure(dev)
    threads = [threading.Thread(target=work, args=(d,)) for d in devs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    n = torch.cuda.device_count()
    devs = list(range(n))
    rep: dict = {"count": n, "torch": torch.__version__, "devices": {}, "peer": {}}
    for d in devs:
        p = torch.cuda.get_device_properties(d)
        rep["devices"][d] = {"name": p.name, "memory_GiB": round(p.total_memory / GiB, 1),
                             "sms": p.multi_processor_count}
    for d in devs:
        for e in devs:
            if d != e:
                rep["peer"][f"{d}->{e}"] = torch.cuda.can_device_access_peer(d, e)
    try:
        rep["topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                     text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        rep["topo"] = f"nvidia-smi topo failed: {exc}"
    t0 = time.perf_counter()
    rep["alone"] = {d: measure(d) for d in devs}
    rep["together"] = together(devs) if n > 1 else {}
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{n} GPU(s), torch {torch.__version__}; peer access {rep['peer'] or 'n/a'}")
    print(rep["topo"].strip())
    print(f"{'gpu':>3} {'name':<14} {'copy TB/s':>10} {'copy spread ms':>16} {'bf16 TFLOP/s':>13}"
          f" {'together copy':>14} {'together mm':>12}")
    for d in devs:
        a, t = rep["alone"][d], rep["together"].get(d)
        tc = f"{t['copy_TBps'] / a['copy_TBps']:.3f}x" if t else "-"
        tm = f"{t['mm_TFLOPs'] / a['mm_TFLOPs']:.3f}x" if t else "-"
        print(f"{d:>3} {rep['devices'][d]['name'][:14]:<14} {a['copy_TBps']:>10.3f} "
              f"{a['copy_min_ms']:>7.3f}-{a['copy_max_ms']:<8.3f} {a['mm_TFLOPs']:>13.1f} "
              f"{tc:>14} {tm:>12}")
    if n > 1:
        cps = [rep["alone"][d]["copy_TBps"] for d in devs]
        mms = [rep["alone"][d]["mm_TFLOPs"] for d in devs]
        rep["copy_spread"] = max(cps) / min(cps) - 1
        rep["mm_spread"] = max(mms) / min(mms) - 1
        print(f"difference between GPUs: copy {rep['copy_spread']:.2%}, "
              f"bf16 matmul {rep['mm_spread']:.2%} (fastest over slowest)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_devices.json").write_text(json.dumps(rep, indent=1, default=str))


if __name__ == "__main__":
    main()
