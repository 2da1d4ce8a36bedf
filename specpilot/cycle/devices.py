"""Devices of a cycle: one environment (slot) per concurrent sub-agent, the device the
judges address for a slot, and where a judge runs when no slot names one."""

from __future__ import annotations

import os


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_device() -> str:
    """Where a judge runs when no slot names a device: the first GPU, else the CPU."""
    return "cuda:0" if cuda_available() else "cpu"


def device_slots(ex) -> list[dict]:
    """One environment per concurrent sub-agent: a CUDA device each, or N CPU slots.

    `CUDA_VISIBLE_DEVICES` in a slot names a device as this process's own environment does
    (an index into its CUDA_VISIBLE_DEVICES list when that is set), so a child started with
    the slot sees exactly that one device."""
    devices = list(ex.devices)
    if not devices:
        try:
            import torch

            devices = [str(i) for i in range(torch.cuda.device_count())]
        except ImportError:
            devices = []
    if devices:
        parent = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                  if d.strip()]
        return [{"CUDA_VISIBLE_DEVICES": parent[int(d)] if parent and d.isdigit()
                 and int(d) < len(parent) else d} for d in devices]
    return [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(ex.parallel_cpu)]


def slot_device(env: dict) -> str:
    """The device a slot's environment names, as this process addresses it: `cuda:N`, or
    `cpu` for a CPU slot. The controller's workers inherit this process's environment, so
    a physical id listed in our own CUDA_VISIBLE_DEVICES maps back to its index there."""
    phys = env.get("CUDA_VISIBLE_DEVICES", "")
    if not phys:
        return "cpu"
    parent = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
              if d.strip()]
    return f"cuda:{parent.index(phys) if phys in parent else phys}"
