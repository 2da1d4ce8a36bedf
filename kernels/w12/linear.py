"""W12Linear: an nn.Linear whose weight is stored as W12 planes, and `convert_model`.

On CUDA the forward runs the fused GEMM (kernels/w12/gemm.py) on the planes. On the CPU
the weight is decoded once at load into a dense tensor (bit-identical to the bf16 weight)
and the forward is F.linear: exact, with no speed gain.

`view` selects what the fused forward multiplies by: "w12" (exact) or "w8" (the nested
8-bit view; see kernels/w12/reference.py). `kernel` selects the CUDA kernel: "gemm" (the
first, kernels/w12/gemm.py), "gemv" (split-K, kernels/w12/gemv.py; the default: the faster
end to end at every step size measured on the H200, bench/NOTES.md) or "auto" (per weight
shape and row bucket, both kernels are tuned and timed once, outside any CUDA graph capture,
and the faster one is kept; a shape first met inside a capture runs "gemm"). Both kernels
compute the same products with a different fp32 summation order, so "auto" is not
deterministic across processes or GPUs: its timed choice can differ, and with it the
outputs at near-ties (the controller saw one system give two outputs on two GPUs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.w12.format import W12Tensor, decode, decode_w8, encode

PLANES = ("hi", "lo", "base", "exc_idx", "exc_val")
KERNELS = ("gemm", "gemv", "auto")
_CHOICE: dict[tuple, str] = {}   # (row bucket, N, K, view, dtype, device) -> kernel


class W12Linear(nn.Module):
    # stock/compiled.py traces modules that declare it: under torch.compile the CUDA forward
    # is the custom op specpilot_w12::matmul below (dynamo keeps it whole)
    compile_traceable = True
    # their lengths differ from layer to layer: dynamic in the compiled graphs, so that one
    # graph serves every layer (stock/compiled.py, _mark_dynamic_buffers)
    compile_dynamic_buffers = ("exc_idx", "exc_val")

    def __init__(self, t: W12Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, dense: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = t.shape
        for name in PLANES:
            self.register_buffer(name, getattr(t, name))
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.dtype = dtype      # the compute dtype of the dense path (the source layer's)
        self.view = "w12"
        self.kernel = "gemv"    # the CUDA kernel: "gemm" | "gemv" | "auto"
        self._t = None          # the W12Tensor over the buffers (cached; rebuilt after .to())
        self._dense = dense     # the source weight (keep_dense) or the CPU decode
        if self._dense is None and self.hi.device.type != "cuda":
            self._dense = self.decode().to(dtype)
        # derived now (never inside a CUDA graph capture); a buffer so that it follows .to()
        # and the compiled forward can pass it without touching the W12Tensor cache
        self.register_buffer("row_ptr", self.w12.row_ptr(), persistent=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear, keep_dense: bool = False) -> "W12Linear":
        w = lin.weight.detach()
        t = encode(w.to(torch.bfloat16))
        return cls(t, lin.bias, w.dtype, dense=w if keep_dense else None)

    @property
    def w12(self) -> W12Tensor:
        t = self._t
        if t is None or t.hi.data_ptr() != self.hi.data_ptr() or t.device != self.hi.device:
            t = self._t = W12Tensor(*(getattr(self, n) for n in PLANES),
                                    shape=(self.out_features, self.in_features))
            rp = getattr(self, "row_ptr", None)  # absent only while __init__ derives it
            if rp is not None and rp.device == t.device:
                t._row_ptr = rp
        return t

    def decode(self) -> torch.Tensor:
        """The bf16 weight [out, in], bit-identical to the encoded one."""
        return decode(self.w12)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in PLANES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.hi.is_cuda:
            if torch.compiler.is_compiling():  # one opaque op for torch.compile (see below)
                y = torch.ops.specpilot_w12.matmul(x, self.hi, self.lo, self.base, self.exc_idx,
                                                   self.exc_val, self.row_ptr,
                                                   self.in_features, self.view, self.kernel)
            else:
                y = fused_matmul(self.kernel)(x, self.w12, self.view)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self._dense_weight(x.device).to(x.dtype), bias)

    def _dense_weight(self, device) -> torch.Tensor:
        """CPU path: the decoded weight (or its 8-bit view), decoded once and cached."""
        if self.view == "w8":
            if getattr(self, "_dense_w8", None) is None or self._dense_w8.device != device:
                self._dense_w8 = decode_w8(self.w12).to(device=device, dtype=self.dtype)
            return self._dense_w8
        if self._dense is None or self._dense.device != device:
            self._dense = self.decode().to(device=device, dtype=self.dtype)
        return self._dense

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, exceptions={self.exc_idx.numel()}, "
                f"view={self.view}, kernel={self.kernel}")


def fused_matmul(kernel: str):
    """The CUDA entry point of a W12 kernel: "gemm", "gemv" or "auto" (same signature)."""
    if kernel == "auto":
        return auto_matmul
    if kernel == "gemm":
        from kernels.w12.gemm import w12_matmul

        return w12_matmul
    if kernel == "gemv":
        from kernels.w12.gemv import w12_gemv

        return w12_gemv
    raise ValueError(f"W12 kernel must be one of {KERNELS}, not {kernel!r}")


# The fused kernels as one custom op, so that torch.compile (stock's `compile` option) treats
# a W12 layer as an opaque call with a known output shape instead of tracing into the tuner's
# Python and the Triton launches (graph breaks). Eager calls skip the op's dispatch cost and
# call fused_matmul directly; both run the same kernels on the same planes.
@torch.library.custom_op("specpilot_w12::matmul", mutates_args=())
def w12_matmul_op(x: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, base: torch.Tensor,
                  exc_idx: torch.Tensor, exc_val: torch.Tensor, row_ptr: torch.Tensor,
                  in_features: int, view: str, kernel: str) -> torch.Tensor:
    t = W12Tensor(hi, lo, base, exc_idx, exc_val, shape=(base.shape[0], in_features))
    t._row_ptr = row_ptr
    return fused_matmul(kernel)(x, t, view)


@w12_matmul_op.register_fake
def _(x, hi, lo, base, exc_idx, exc_val, row_ptr, in_features, view, kernel):
    return x.new_empty((*x.shape[:-1], base.shape[0]))


def auto_matmul(x: torch.Tensor, t: W12Tensor, view: str = "w12") -> torch.Tensor:
    """The faster of the two kernels for this shape and row count (chosen once, timed)."""
    from kernels.w12.gemm import MAX_M
    from kernels.w12.gemv import bucket

    m = x.numel() // max(1, x.shape[-1])
    key = (bucket(min(m, MAX_M)), t.shape[0], t.shape[1], view, x.dtype, x.device)
    kernel = _CHOICE.get(key)
    if kernel is None:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            kernel = "gemm"
        else:
            kernel = _CHOICE[key] = choose(x, t, view)
    return fused_matmul(kernel)(x, t, view)


def choose(x: torch.Tensor, t: W12Tensor, view: str) -> str:
    """Tune both kernels on x (their own caches), then time each once more; the faster."""
    if not x.is_cuda:
        return "gemm"
    from triton.testing import do_bench

    times = {}
    for name in ("gemm", "gemv"):
        fn = fused_matmul(name)
        fn(x, t, view)   # tunes its configuration for this shape
        times[name] = do_bench(lambda: fn(x, t, view), warmup=5, rep=20)
    return min(times, key=times.get)


def chosen_kernels() -> dict[tuple, str]:
    """What "auto" picked so far, for reports: {(rows, N, K, view): kernel}."""
    return {k[:4]: v for k, v in _CHOICE.items()}


def set_kernel(model: nn.Module, kernel: str) -> int:
    """Select the CUDA kernel of every W12Linear in `model`; returns how many changed."""
    fused_matmul(kernel)  # validates the name
    mods = [m for m in model.modules() if isinstance(m, W12Linear)]
    for m in mods:
        m.kernel = kernel
    return len(mods)


def convert_model(model: nn.Module, include_lm_head: bool = True,
                  keep_dense: bool = False) -> dict:
    """Replace the nn.Linear modules of `model` (a stock.model.Transformer) by W12Linear in
    place, encoding on the weights' device (CUDA: the GPU encoder). The bf16 weight is freed
    unless keep_dense (a weight tied to the embedding stays alive through the embedding).
    Weights that are not bf16 are rounded to bf16 first (their params are counted in
    `cast_to_bf16`). Returns stats: linears, params, bytes_before, bytes_after, exceptions,
    bits_per_param, exception_rate, cast_to_bf16."""
    names = [name for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and (include_lm_head or name != "lm_head")]
    stats = {"linears": 0, "params": 0, "bytes_before": 0, "bytes_after": 0,
             "exceptions": 0, "cast_to_bf16": 0}
    for name in names:  # one layer at a time: each bf16 weight is freed once replaced
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lin = getattr(parent, child)
        numel, size, dtype = lin.weight.numel(), lin.weight.element_size(), lin.weight.dtype
        new = W12Linear.from_linear(lin, keep_dense=keep_dense)
        setattr(parent, child, new)
        del lin
        stats["linears"] += 1
        stats["params"] += numel
        stats["bytes_before"] += numel * size
        stats["bytes_after"] += new.nbytes
        stats["exceptions"] += int(new.exc_idx.numel())
        stats["cast_to_bf16"] += int(dtype != torch.bfloat16) * numel
    stats["bits_per_param"] = 8.0 * stats["bytes_after"] / max(1, stats["params"])
    stats["exception_rate"] = stats["exceptions"] / max(1, stats["params"])
    if any(p.is_cuda for p in model.parameters()):
        torch.cuda.empty_cache()
    return stats
