"""Fused projection weights (option `fuse_projections`): q/k/v as one matrix, gate/up as one.

At one to a few rows a GEMM's time is its weight bytes plus a fixed cost per launch; the
small k and v projections of a grouped-query model (an eighth of q's bytes each in the
27B-class config) run at half the copy bandwidth, and cuBLAS splits them over K with a reduction kernel each. On the H200
the three q/k/v GEMMs of the 27B-class config took 39.3 µs a layer, one GEMM over the
concatenated weight 28.3 µs (bench/archive/NOTES-2026.md, `bench/gpu_layer_ops.py`).

`fuse_projections(model)` stores each layer's q/k/v weights as consecutive row blocks of one
tensor (and gate/up likewise) and makes each module's weight a view of its block: the
modules, their names and their outputs are unchanged, no byte is duplicated, and code that
multiplies by the modules one by one (the eager forwards, a patch) still works. The compiled
static step (stock/compiled.py, with `fused=True`: the option on) asks `fused_qkv` /
`fused_gate_up` for the matrix and runs one GEMM, then splits its output. They answer None as soon as any module no longer
multiplies by its block (replaced by another type, given a bias, re-assigned a weight,
moved to another device), so a patch that swaps a projection is never bypassed.

A patch whose projections are not plain linears can fuse them its own way: it builds one
module whose output is the group's outputs concatenated (W12: one W12Linear over the
concatenated planes, the members row slices of it, stock/w12_linear.py) and installs it
with `install_group(owner, names, module)`. `fused_qkv` / `fused_gate_up` then return that
module (the compiled step calls it instead of multiplying by a matrix) for as long as every
name still holds the very module object it held at installation and the group lives on
the members' device; replacing a member disables the group. Groups are plain attributes
too (not submodules: no state dict entries, not in `model.modules()`); `groups(model)`
lists them for code that must reach every module (W12's kernel choice, compile marks).
"""

from __future__ import annotations

import torch
from torch import nn

from stock.linear import Linear

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
GDN_IN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")   # a hybrid's GDN layers
_ATTR = "_fused_weight"  # plain attribute of the owning module (not a buffer: no state dict)
_GROUP = "_fused_group"  # (module, members) installed by a patch; plain attribute as well


def _plain(mod: nn.Module) -> bool:
    return type(mod) in (Linear, nn.Linear) and mod.bias is None


def _fuse(owner: nn.Module, names: tuple[str, ...]) -> bool:
    mods = [getattr(owner, n) for n in names]
    if not all(_plain(m) for m in mods) or _fused(owner, names) is not None:
        return False
    weights = [m.weight for m in mods]
    if len({(w.device, w.dtype, w.shape[1]) for w in weights}) != 1:
        return False
    with torch.no_grad():
        fused = torch.cat([w.detach() for w in weights])
    off = 0
    for m, w in zip(mods, weights):
        m.weight = nn.Parameter(fused[off:off + w.shape[0]], requires_grad=w.requires_grad)
        off += w.shape[0]
    owner.__dict__.pop(_GROUP, None)
    owner.__dict__[_ATTR] = fused
    return True


def _device(mod: nn.Module) -> torch.device | None:
    t = next(iter(mod.parameters()), None)
    if t is None:
        t = next(iter(mod.buffers()), None)
    return None if t is None else t.device


def install_group(owner: nn.Module, names: tuple[str, ...], module: nn.Module) -> None:
    """Make `module` the fused form of owner's `names` (module docstring): the caller
    guarantees that module(x) equals the members' outputs concatenated in `names` order.
    A fused matrix the owner held for the previous members is dropped (its bytes freed)."""
    owner.__dict__.pop(_ATTR, None)
    owner.__dict__[_GROUP] = (module, tuple(getattr(owner, n) for n in names))


def _group(owner: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    module, members = owner.__dict__[_GROUP]
    if len(members) != len(names) or any(getattr(owner, n) is not m
                                         for n, m in zip(names, members)):
        return None
    return module if _device(module) == _device(members[0]) else None


def groups(model) -> list[nn.Module]:
    """The group modules installed in model's decoder layers (valid or not)."""
    return [owner.__dict__[_GROUP][0] for owner, _ in _owners(model)
            if _GROUP in owner.__dict__]


def _fused(owner: nn.Module, names: tuple[str, ...]) -> torch.Tensor | nn.Module | None:
    if _GROUP in owner.__dict__:
        return _group(owner, names)
    fused = owner.__dict__.get(_ATTR)
    if fused is None:
        return None
    row = fused.stride(0) * fused.element_size()
    off = 0
    for n in names:
        m = getattr(owner, n)
        if not _plain(m):
            return None
        w = m.weight
        if (w.device != fused.device or w.dtype != fused.dtype or w.shape[1] != fused.shape[1]
                or w.data_ptr() != fused.data_ptr() + off * row):
            return None
        off += w.shape[0]
    return fused if off == fused.shape[0] else None


def fuse_projections(model) -> int:
    """Fuse q/k/v (a GDN layer's input projections) and gate/up of every decoder layer whose
    modules are plain bias-free linears (module docstring); returns the number of groups fused now."""
    n = 0
    for owner, names in _owners(model):
        n += _fuse(owner, names)
    if n and any(p.is_cuda for p in model.parameters()):
        # the separate weights' blocks are free now but stay reserved by the caching
        # allocator, which cannot join them into blocks for the larger fused matrices: on
        # the 27B-class target the process then held 93 GiB for 64 GB of weights, and a
        # second system on the same GPU (the controller's B) ran out of memory
        torch.cuda.empty_cache()
    return n


def unfuse(model) -> int:
    """Drop every layer's fused matrix (the modules keep their weights, views of it, so no
    output changes; the matrix's bytes are freed once no module views them any more: a
    patch that replaces the modules calls this so the old weights do not stay alive).
    Returns the number of matrices dropped."""
    return sum(owner.__dict__.pop(_ATTR, None) is not None for owner, _ in _owners(model))


def _owners(model) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """Every fusable group of the decoder layers: (owner, member names). A hybrid target's
    GDN layers have their four input projections instead of q/k/v; a gated attention's
    q_proj (queries and gate) fuses with k and v like any q_proj."""
    out = []
    for layer in model.model.layers:
        if hasattr(layer, "linear_attn"):
            out.append((layer.linear_attn, GDN_IN))
        else:
            out.append((layer.self_attn, QKV))
        out.append((layer.mlp, GATE_UP))
    return out


def fused_qkv(attn: nn.Module) -> torch.Tensor | nn.Module | None:
    """The layer's [Nq + 2 Nkv, H] q/k/v matrix, or the group module a patch installed, or
    None if its projections are neither (never fused, or a module was replaced since)."""
    return _fused(attn, QKV)


def fused_gdn_in(gdn: nn.Module) -> torch.Tensor | nn.Module | None:
    """A GDN layer's [conv_dim + Hv Dv + 2 Hv, H] input matrix (stock/gdn.py's project), or
    its group module, or None (as `fused_qkv`)."""
    return _fused(gdn, GDN_IN)


def fused_gate_up(mlp: nn.Module) -> torch.Tensor | nn.Module | None:
    """The layer's [2 I, H] gate/up matrix, or its group module, or None (as `fused_qkv`)."""
    return _fused(mlp, GATE_UP)
