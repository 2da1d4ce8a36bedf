"""W12Linear: an nn.Linear whose weight is stored as W12 planes, and `convert_model` (model
surgery lives in stock/; the kernels and their custom op in kernels/w12, which imports
nothing of the project).

On CUDA the forward runs the fused GEMM (kernels/w12/gemm.py) on the planes. On the CPU
the weight is decoded once at load into a dense tensor (bit-identical to the bf16 weight)
and the forward is stock's `linear` (F.linear, or W @ x^T for 2-16 rows as stock's own
layers take it, stock/linear.py): exact, with no speed gain.

`view` selects what the fused forward multiplies by: "w12" (exact) or "w8" (the nested
8-bit view; see kernels/w12/reference.py). `kernel` selects the CUDA kernel: "gemm" (the
first, kernels/w12/gemm.py), "gemv" (split-K, kernels/w12/gemv.py), "mma" (tensor cores
in CUDA C++, kernels/w12/mma.py, built by nvcc at first use), "gemv+mma" (the default: the
GEMV for one row, mma for more, the GEMV alone where mma cannot run; the faster end to end
on the H200, 1.20x the GEMV at 16 verify rows, kernels/w12/ops.py) or "auto" (per weight
shape and row bucket, "gemm" and "gemv" are tuned and timed once, outside any CUDA graph
capture, and the faster one is kept; a shape first met inside a capture runs "gemm").
Both kernels compute the same products with a different fp32
summation order, so "auto" is not deterministic across processes or GPUs: its timed choice
can differ, and with it the outputs at near-ties (the controller saw one system give two
outputs on two GPUs).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.w12.format import W12Tensor, decode, decode_w8, encode
from kernels.w12.ops import DEFAULT, fused_matmul
from stock.fused import groups, install_group, unfuse
from stock.linear import linear

PLANES = ("hi", "lo", "base", "exc_idx", "exc_val")


class W12Linear(nn.Module):
    # stock/compiled.py traces modules that declare it: under torch.compile the CUDA forward
    # is the custom op specpilot_w12::matmul (kernels/w12/ops.py) (dynamo keeps it whole)
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
        self.kernel = DEFAULT   # the CUDA kernel: one of kernels/w12/ops.py KERNELS
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

    def rows(self, r0: int, r1: int) -> "W12Linear":
        """A W12Linear over output rows [r0, r1) that shares this module's planes (views:
        no byte copied but its own exception indices, rebased to its rows). Its kernel and
        view start as this module's."""
        if self.bias is not None:
            raise ValueError("W12Linear.rows: a module with a bias is not sliced")
        if not 0 <= r0 < r1 <= self.out_features:
            raise ValueError(f"W12Linear.rows: [{r0}, {r1}) outside 0..{self.out_features}")
        k = self.in_features
        ptr = self.row_ptr
        p0, p1 = (int(v) for v in ptr[[r0, r1]].tolist())
        t = W12Tensor(self.hi[r0:r1], self.lo[r0:r1], self.base[r0:r1],
                      self.exc_idx[p0:p1] - r0 * k, self.exc_val[p0:p1], shape=(r1 - r0, k))
        dense = None if self._dense is None else self._dense[r0:r1]
        part = W12Linear(t, None, self.dtype, dense=dense)
        part.view, part.kernel = self.view, self.kernel
        return part

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
        return linear(x, self._dense_weight(x.device).to(x.dtype), bias)

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


def w12_modules(model: nn.Module) -> list[W12Linear]:
    """Every W12Linear of `model`: its modules, then its fused groups (stock/fused.py)."""
    mods = [m for m in model.modules() if isinstance(m, W12Linear)]
    if hasattr(model, "model") and hasattr(model.model, "layers"):
        mods += [g for g in groups(model) if isinstance(g, W12Linear)]
    return mods


def set_kernel(model: nn.Module, kernel: str) -> int:
    """Select the CUDA kernel of every W12Linear in `model`, fused groups included; returns
    how many modules (groups count one each)."""
    fused_matmul(kernel)  # validates the name
    mods = w12_modules(model)
    for m in mods:
        m.kernel = kernel
    return len(mods)


def set_view(model: nn.Module, view: str) -> int:
    """Select what every W12Linear multiplies by ("w12" or "w8"), fused groups included."""
    if view not in ("w12", "w8"):
        raise ValueError(f"W12 view must be 'w12' or 'w8', not {view!r}")
    mods = w12_modules(model)
    for m in mods:
        m.view = view
    return len(mods)


GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def _group(owner: nn.Module, names: tuple[str, ...], keep_dense: bool) -> W12Linear | None:
    """Encode owner's linears `names` as one W12Linear over their concatenated weights and
    make each a row slice of it (module docstring of stock/fused.py); None if they are not
    bias-free nn.Linear layers of one input width, device and dtype."""
    lins = [getattr(owner, n) for n in names]
    if not all(isinstance(m, nn.Linear) and m.bias is None for m in lins):
        return None
    if len({(m.weight.device, m.weight.dtype, m.in_features) for m in lins}) != 1:
        return None
    w = torch.cat([m.weight.detach() for m in lins])
    dense = w if keep_dense else None
    group = W12Linear(encode(w.to(torch.bfloat16)), None, w.dtype, dense=dense)
    del w
    r0 = 0
    for name, lin in zip(names, lins):
        setattr(owner, name, group.rows(r0, r0 + lin.out_features))
        r0 += lin.out_features
    install_group(owner, names, group)
    return group


def convert_model(model: nn.Module, include_lm_head: bool = True,
                  keep_dense: bool = False, group: bool | None = None) -> dict:
    """Replace the nn.Linear modules of `model` (a stock.model.Transformer) by W12Linear in
    place, encoding on the weights' device (CUDA: the GPU encoder). The bf16 weight is freed
    unless keep_dense (a weight tied to the embedding stays alive through the embedding).
    Weights that are not bf16 are rounded to bf16 first (their params are counted in
    `cast_to_bf16`).

    `group` (default: when the model is on CUDA): each decoder layer's q/k/v and gate/up are
    encoded as one W12Linear over their concatenated weights, installed as the layer's fused
    group (stock/fused.py), and the modules become row slices of it (shared planes): the
    compiled step with option fuse_projections runs one W12 GEMV per group, everything else
    still sees q_proj, k_proj, ... as before. Each row's encoding is that of the weight alone
    (the format is per output channel), so slices decode to the same bits. Off the CUDA
    path the groups would only cost a second decoded copy, so they are not built there.

    Returns stats: linears (modules replaced), groups, params, bytes_before, bytes_after,
    exceptions, bits_per_param, exception_rate, cast_to_bf16."""
    if group is None:
        group = any(p.is_cuda for p in model.parameters())
    stats = {"linears": 0, "groups": 0, "params": 0, "bytes_before": 0, "bytes_after": 0,
             "exceptions": 0, "cast_to_bf16": 0}

    def count(lins: list[nn.Module], new: W12Linear) -> None:
        for lin in lins:
            numel = lin.weight.numel()
            stats["linears"] += 1
            stats["params"] += numel
            stats["bytes_before"] += numel * lin.weight.element_size()
            stats["cast_to_bf16"] += int(lin.weight.dtype != torch.bfloat16) * numel
        stats["bytes_after"] += new.nbytes
        stats["exceptions"] += int(new.exc_idx.numel())

    layers = getattr(getattr(model, "model", None), "layers", None)
    if group and layers is not None:
        for layer in layers:
            for owner_name, names in GROUPS:
                owner = getattr(layer, owner_name)
                lins = [getattr(owner, n) for n in names]
                new = _group(owner, names, keep_dense)
                if new is not None:
                    count(lins, new)
                    stats["groups"] += 1
    if layers is not None:  # a bf16 fused matrix of members replaced above or below
        unfuse(model)
    names = [name for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and (include_lm_head or name != "lm_head")]
    for name in names:  # one layer at a time: each bf16 weight is freed once replaced
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lin = getattr(parent, child)
        new = W12Linear.from_linear(lin, keep_dense=keep_dense)
        setattr(parent, child, new)
        count([lin], new)
        del lin
    stats["bits_per_param"] = 8.0 * stats["bytes_after"] / max(1, stats["params"])
    stats["exception_rate"] = stats["exceptions"] / max(1, stats["params"])
    if any(p.is_cuda for p in model.parameters()):
        torch.cuda.empty_cache()
    return stats
