"""One device a sub-agent: slot environments and the device the judges use for each."""

from __future__ import annotations

from types import SimpleNamespace

from specpilot.cycle.devices import device_slots, slot_device


def _ex(devices=(), parallel_cpu=1):
    return SimpleNamespace(devices=list(devices), parallel_cpu=parallel_cpu)


def test_each_listed_gpu_is_one_slot_and_the_controller_addresses_the_same_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    slots = device_slots(_ex(["0", "1"]))
    assert slots == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert [slot_device(s) for s in slots] == ["cuda:0", "cuda:1"]


def test_slots_respect_the_parents_own_visible_devices(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=4,6 this process calls them cuda:0 and cuda:1; a child
    given the slot must see physical 6 for our cuda:1, and the controller (which inherits
    our environment) must address it as cuda:1."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    slots = device_slots(_ex(["0", "1"]))
    assert slots == [{"CUDA_VISIBLE_DEVICES": "4"}, {"CUDA_VISIBLE_DEVICES": "6"}]
    assert [slot_device(s) for s in slots] == ["cuda:0", "cuda:1"]


def test_cpu_slots_run_their_judges_on_the_cpu(monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)   # as on a machine without
    slots = device_slots(_ex([], parallel_cpu=2))
    assert len(slots) == 2 and {slot_device(s) for s in slots} == {"cpu"}
