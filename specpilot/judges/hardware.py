"""Peak compute and memory bandwidth: a table for known GPUs, measured ceilings otherwise.

Dense (no structured sparsity) tensor-core peaks in FLOP/s and peak memory bandwidth in
bytes/s, each with its source. Where a datasheet quotes only the 2:4-sparse figure, the
dense figure is half of it and the source says so. CPUs and unknown devices get measured
ceilings (a large copy, a large matmul in the compute dtype), cached under
.specpilot/cache/hardware/ keyed by the machine, torch, threads and the day, with the
conditions they were measured under; a measurement taken while the machine was busy (other
tasks holding a core, or its repeats more than 1.5x apart) is used once and never cached.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path

from pydantic import BaseModel

from specpilot import threads

SCHEMA_VERSION = 1
CACHE_DIR = Path(".specpilot") / "cache" / "hardware"
T = 1e12


class Hardware(BaseModel):
    schema_version: int = SCHEMA_VERSION
    name: str
    bf16_flops: float | None      # dense FLOP/s
    fp8_flops: float | None
    fp32_flops: float | None = None  # measured devices: the matmul ceiling in fp32
    bandwidth: float              # bytes/s
    source: str
    measured: bool = False
    conditions: str = ""          # measured: when, threads, load, spread between repeats
    contended: bool = False       # measured while the machine was busy: not cached

    def peak_flops(self, dtype: str) -> float:
        value = {"bf16": self.bf16_flops, "fp16": self.bf16_flops, "fp8": self.fp8_flops,
                 "fp32": self.fp32_flops or self.bf16_flops}.get(dtype)
        if value is None:
            raise ValueError(f"{self.name}: no peak for {dtype}")
        return value


TABLE: dict[str, Hardware] = {
    "H100 SXM": Hardware(
        name="H100 SXM", bf16_flops=989.4 * T, fp8_flops=1978.9 * T, bandwidth=3.35e12,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 / FP8 3,958 TFLOPS "
               "with sparsity -> dense = half; HBM3 3.35 TB/s"),
    "H200": Hardware(
        name="H200", bf16_flops=989.4 * T, fp8_flops=1978.9 * T, bandwidth=4.8e12,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 / FP8 3,958 TFLOPS "
               "with sparsity -> dense = half; HBM3e 4.8 TB/s"),
    "B200": Hardware(
        name="B200", bf16_flops=2250 * T, fp8_flops=4500 * T, bandwidth=8.0e12,
        source="NVIDIA HGX B200 datasheet (per GPU): FP16/BF16 4.5 / FP8 9 PFLOPS with "
               "sparsity -> dense = half; HBM3e 8 TB/s"),
    "RTX PRO 6000 Blackwell": Hardware(
        name="RTX PRO 6000 Blackwell", bf16_flops=503.8 * T, fp8_flops=1007.6 * T,
        bandwidth=1.792e12,
        source="NVIDIA RTX Blackwell GPU architecture whitepaper, RTX PRO 6000 Blackwell "
               "Workstation: FP16/BF16 tensor (FP32 accumulate) 503.8 dense, FP8 1,007.6 "
               "dense TFLOPS; GDDR7 512-bit at 28 Gbps = 1,792 GB/s"),
    "A100": Hardware(
        name="A100", bf16_flops=312 * T, fp8_flops=None, bandwidth=2.039e12,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS dense "
               "(624 sparse); no FP8; HBM2e 2,039 GB/s"),
    "L40S": Hardware(
        name="L40S", bf16_flops=362.05 * T, fp8_flops=733 * T, bandwidth=0.864e12,
        source="NVIDIA L40S datasheet: BF16 362.05 / FP8 733 TFLOPS dense (733 / 1,466 "
               "with sparsity); GDDR6 864 GB/s"),
}

# torch.cuda.get_device_name() substrings -> table key, most specific first
NAMES = [("H100 PCIe", None), ("H100", "H100 SXM"), ("H200", "H200"), ("B200", "B200"),
         ("RTX PRO 6000", "RTX PRO 6000 Blackwell"), ("A100", "A100"), ("L40S", "L40S")]


def lookup(device_name: str) -> Hardware | None:
    for needle, key in NAMES:
        if needle.lower() in device_name.lower():
            return TABLE[key] if key else None
    return None


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def for_device(device: str, cache_root: Path | None = None, measure_size: str = "large") -> Hardware:
    """The table entry for a known GPU; measured (and cached) ceilings otherwise."""
    name = device_name(device)
    known = lookup(name) if device.startswith("cuda") else None
    if known is not None:
        return known
    import torch

    key = {"name": name, "device": device.split(":")[0], "torch": torch.__version__,
           "threads": torch.get_num_threads(), "size": measure_size,
           "day": time.strftime("%Y-%m-%d")}
    path = None
    if cache_root is not None:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        path = Path(cache_root) / CACHE_DIR / f"{digest}.json"
        if path.is_file():
            try:
                return Hardware.model_validate_json(path.read_text())
            except ValueError:
                pass
    hw = measure(device, name, measure_size)
    if path is not None and not hw.contended:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(hw.model_dump_json(indent=1))
    return hw


def measure(device: str, name: str, size: str = "large") -> Hardware:
    """Ceilings by measurement: the best of a few large copies and large matmuls."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    n_bytes = (1 << 30) if cuda else (256 << 20) if size == "large" else (32 << 20)
    mm = 8192 if cuda else 2048 if size == "large" else 512
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    others, load1 = threads.measure_load()
    copy_s, worst = _best(lambda: dst.copy_(src), dev)
    flops = {}
    for dtype in ((torch.bfloat16, torch.float32) if cuda else (torch.float32,)):
        a = torch.randn(mm, mm, device=dev, dtype=dtype)
        b = torch.randn(mm, mm, device=dev, dtype=dtype)
        best, spread = _best(lambda: a @ b, dev)
        flops[dtype], worst = 2 * mm ** 3 / best, max(worst, spread)
    cpus = threads.cpus_here()
    busy = (not cuda and threads.contended(cpus, others, load1)) or worst > threads.SPREAD_LIMIT
    return Hardware(
        name=f"{name} (measured)", bf16_flops=flops.get(torch.bfloat16),
        fp8_flops=None, fp32_flops=flops[torch.float32], bandwidth=2 * n_bytes / copy_s,
        source=f"measured on this machine: copy of {n_bytes >> 20} MiB (read + write), "
               f"{mm}^3 matmul; best of 5", measured=True, contended=busy,
        conditions=f"{time.strftime('%Y-%m-%d %H:%M')}, {torch.get_num_threads()} threads, "
                   f"{others:g} other runnable on {cpus} cores, load {load1:.2f}, repeats "
                   f"{worst:.2f}x apart{' (busy: not cached)' if busy else ''}")


def _best(fn, dev, repeats: int = 5) -> tuple[float, float]:
    """The fastest of `repeats` timings of fn, and how far apart they were (slowest over
    fastest)."""
    import torch

    fn()
    seen = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seen.append(time.perf_counter() - t0)
    return min(seen), threads.spread(seen)
