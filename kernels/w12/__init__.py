"""W12: lossless 12-bit bf16 weights, a fused GEMM that decodes them in registers, and the
nested 8-bit view. See kernels/w12/format.py for the layout and docs/w12.md."""

from kernels.w12.format import (FORMAT, VERSION, W12Error, W12Tensor, decode, decode_w8,
                                encode)

__all__ = ["FORMAT", "VERSION", "W12Error", "W12Tensor", "decode", "decode_w8", "encode"]
