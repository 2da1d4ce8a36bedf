"""Device facts: every visible GPU's copy bandwidth and bf16 matmul rate, alone and together.

For every visible GPU, alone: name, memory, SMs; device-to-device copy bandwidth (1 GiB,
read + write counted, median of 20) and a bf16 8192^3 matmul rate (median of 10 after
warm-up). Then all GPUs at once (one thread each, the same loops): how much each slows when
the others work, which is what side-by-side paired runs assume is small (issue 8). Also
whether the GPUs can reach each other's memory (peer access) and the link matrix from
nvidia-smi. The copy figure is the bandwidth every weight-bytes floor in the suite uses.

    python3 bench/device_facts.py [--out DIR]     # prints one table, writes device_facts.json
    python3 bench/device_facts.py --smoke         # CPU: 16 MiB copy, fp32 256^3 matmul

(Before the suite this was bench/gpu_devices.py, same measurements.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time

from common import GiB, print_table, timed, write_json

import torch  # noqa: E402


def measure(dev: str, copy_bytes: int = GiB, n: int = 8192, iters: int = 20) -> dict:
    """Copy bandwidth and matmul rate of one device (medians, with spread)."""
    cuda = dev.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    ctx = torch.cuda.device(torch.device(dev)) if cuda else _nullcontext()
    with ctx:
        src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy = timed(lambda: dst.copy_(src), iters, dev, each=True)
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        mm = timed(lambda: a @ b, 10, dev, each=True)
        del src, dst, a, b
        if cuda:
            torch.cuda.empty_cache()
    cm, mmm = copy["median_ms"], mm["median_ms"]
    return {"copy_ms": cm, "copy_TBps": 2 * copy_bytes / cm / 1e9, "copy_min_ms": copy["min_ms"],
            "copy_max_ms": copy["max_ms"], "mm_ms": mmm, "mm_TFLOPs": 2 * n ** 3 / mmm / 1e9,
            "mm_min_ms": mm["min_ms"], "mm_max_ms": mm["max_ms"], "dtype": str(dtype)}


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def together(devs: list[str], **kw) -> dict:
    """Every device runs `measure` at the same time, one thread each."""
    out: dict[str, dict] = {}
    barrier = threading.Barrier(len(devs))

    def work(dev):
        barrier.wait()
        out[dev] = measure(dev, **kw)
    threads = [threading.Thread(target=work, args=(d,)) for d in devs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check, seconds")
    args = ap.parse_args()
    kw = {}
    if args.smoke or not torch.cuda.is_available():
        if not args.smoke:
            raise SystemExit("device_facts: needs a CUDA device (or --smoke)")
        devs, kw = ["cpu"], {"copy_bytes": 16 << 20, "n": 256, "iters": 5}
    else:
        devs = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    rep: dict = {"count": len(devs), "torch": torch.__version__, "devices": {}, "peer": {}}
    for d in devs:
        if d == "cpu":
            rep["devices"][d] = {"name": "cpu", "memory_GiB": None, "sms": os.cpu_count()}
            continue
        p = torch.cuda.get_device_properties(torch.device(d))
        rep["devices"][d] = {"name": p.name, "memory_GiB": round(p.total_memory / GiB, 1),
                             "sms": p.multi_processor_count}
    for d in devs:
        for e in devs:
            if d != e:
                rep["peer"][f"{d}->{e}"] = torch.cuda.can_device_access_peer(
                    torch.device(d), torch.device(e))
    try:
        rep["topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True,
                                     text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        rep["topo"] = f"nvidia-smi topo failed: {exc}"
    t0 = time.perf_counter()
    rep["alone"] = {d: measure(d, **kw) for d in devs}
    rep["together"] = together(devs, **kw) if len(devs) > 1 else {}
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{len(devs)} device(s), torch {torch.__version__}; peer access {rep['peer'] or 'n/a'}")
    print(rep["topo"].strip())
    rows = []
    for d in devs:
        a, t = rep["alone"][d], rep["together"].get(d)
        rows.append([d, rep["devices"][d]["name"], rep["devices"][d]["memory_GiB"],
                     f"{a['copy_TBps']:.3f}", f"{a['copy_min_ms']:.3f}-{a['copy_max_ms']:.3f}",
                     f"{a['mm_TFLOPs']:.1f}",
                     f"{t['copy_TBps'] / a['copy_TBps']:.3f}x" if t else "-",
                     f"{t['mm_TFLOPs'] / a['mm_TFLOPs']:.3f}x" if t else "-"])
    mm_name = "bf16 TFLOP/s" if devs[0] != "cpu" else "fp32 TFLOP/s"
    print_table(["device", "name", "GiB", "copy TB/s (read + write)", "copy ms (min-max)",
                 mm_name, "together: copy", "together: matmul"], rows)
    if len(devs) > 1:
        cps = [rep["alone"][d]["copy_TBps"] for d in devs]
        mms = [rep["alone"][d]["mm_TFLOPs"] for d in devs]
        rep["copy_spread"] = max(cps) / min(cps) - 1
        rep["mm_spread"] = max(mms) / min(mms) - 1
        print(f"difference between GPUs: copy {rep['copy_spread']:.2%}, "
              f"bf16 matmul {rep['mm_spread']:.2%} (fastest over slowest)")
    write_json(args.out, "device_facts.json", rep)


if __name__ == "__main__":
    main()
