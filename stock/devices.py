"""Device names a user gives (`--device`, load_system's `device`): checked before use, so a
typo or a missing GPU is one error that names it rather than a torch traceback."""

from __future__ import annotations

from stock.errors import StockError

KINDS = ("cpu", "cuda")


class DeviceError(StockError):
    pass


def check_device(name: str | None) -> str | None:
    """`name` unchanged if it names a device that exists here (cpu, cpu:N, cuda, cuda:N);
    None stays None (the default device)."""
    if name is None:
        return None
    import torch

    text = str(name).strip()
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"device {name!r}: not a device name (cpu, cuda or cuda:N)") from None
    if dev.type not in KINDS:
        raise DeviceError(f"device {name!r}: unsupported type {dev.type!r} (cpu, cuda or cuda:N)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {name!r}: CUDA is not available here")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"device {name!r}: only {count} CUDA device(s) here")
    return text


def check_context(max_context: int | None) -> int | None:
    """A KV cache size in tokens: None (the model's context) or at least 1."""
    if max_context is None:
        return None
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        raise DeviceError(f"max_context must be a positive number of tokens, got {max_context!r}")
    return max_context
