"""Gated DeltaNet (GDN) layers' sequence mixing: the gated delta rule and the short causal
conv, in plain PyTorch (reference.py) and, on CUDA, through flash-linear-attention where it
is installed (ops.py)."""

from kernels.gdn.ops import causal_conv, chunk_rule, fla_available, recurrent_rule
from kernels.gdn.reference import (causal_conv_reference, chunk_reference, l2norm,
                                   recurrent_reference)

__all__ = ["causal_conv", "causal_conv_reference", "chunk_reference", "chunk_rule",
           "fla_available", "l2norm", "recurrent_reference", "recurrent_rule"]
