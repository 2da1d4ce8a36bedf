"""Attention over the static KV cache for the few query rows of a decode or verify step:
a split-KV Triton kernel (decode.py) and its plain-PyTorch reference (reference.py)."""

from kernels.attention.decode import decode_attention, supported
from kernels.attention.reference import reference_attention

__all__ = ["decode_attention", "reference_attention", "supported"]
