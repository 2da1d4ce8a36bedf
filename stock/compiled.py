"""The static forward with its elementwise work fused by torch.compile (option `compile`).

On the H200 the 27B-class step in a CUDA graph spent about a fifth of its time in some
3,000 small kernels around the GEMMs (norms, RoPE, the K/V cache write, SiLU * up, residual
adds, casts; bench/archive/NOTES-2026.md, "Where the 27B-class AR step goes"). Here each decoder layer
runs as two compiled regions with eager attention between them, the way gpt-fast does it:

- region A (`attn_in`): input RMSNorm, q/k/v projections, q/k norm, RoPE, and the K/V
  write at the step's positions (`index_copy_` into the layer's cache buffers, passed in);
  it returns the queries folded onto their K/V heads;
- attention, eager: kernels/attention's split-KV Triton kernel (option `attention_kernel`,
  "triton" by default on CUDA), or SDPA over the first `kv_len` cache slots with the step's
  mask. `kv_len` never enters a compiled region, so compiled code depends on T (and the
  model's shapes) only, not on the KV bucket;
- region B (`attn_out_mlp`): the attention output's reshape, o_proj, residual add,
  post-attention RMSNorm, the MLP and its residual add;
- the head (`head`): final norm, lm_head and the fp32 cast.

Between two layers, region B of the first and region A of the next run as one graph
(`attn_out_mlp_next`), so the residual add fuses with the next input norm: a step runs
A, then (attention, B+A) per layer but the last, then (attention, B), then the head.

Each region is one function compiled once (inductor, `dynamic=False`, default mode: the
GraphRunner captures its own CUDA graphs, and its warm-up forwards, which run before the
capture, are where compilation happens). A layer's modules and K/V buffers are arguments,
never looked up by layer index, so one compiled graph per region and T serves every layer
(`graphs_compiled()` counts them: 4 per T; tests check that it does not grow with the layer
count). A batched step (`rows`: stock/batch_graphs.py, and the batched block drafter's
regions) marks its requests and tokens dimensions dynamic (`requests_dynamic`), so one
graph per region serves every (requests, tokens) bucket pair of two or more.
GEMMs stay cuBLAS (inductor's default for mm). Where a layer's q/k/v (gate/up) weights are
views of one matrix (option `fuse_projections`, stock/fused.py), the region is handed that
matrix and runs one GEMM for the group, then splits its output; where a patch installed a
group module for them instead (W12), the region calls that module once.

Modules: the compiled regions call the layer's own modules, so a module swapped in place is
used. Types stock knows (its Linear, nn.Linear, RMSNorm, and MLP when its linears are of
those) are traced; a module of any other type runs eagerly between compiled pieces (a graph
break, no tracing of its code), and so does an MLP holding one, unless the module sets
`compile_traceable = True` (say, because its forward is a torch.library custom op that
dynamo can trace). A module whose buffers differ in length from layer to layer (W12's
exception lists) names them in `compile_dynamic_buffers`: their first dimension is then
dynamic, so one graph per region and T still serves every layer.

Failure is loud, never silent: if compiling a region fails, or dynamo would give up on it
(its recompile limit, raised here for these functions and turned into an error), the region
is logged once (logger `stock.compiled`, level WARNING) and runs eagerly from then on in
this process; `fallbacks()` lists such regions. Profiling (stock/profile.py) runs the eager
static forward, whose regions synchronise.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

import torch
from torch import nn

from stock import body
from stock import gdn as gdn_body
from stock.cache import KVCache
from stock.fused import fused_gate_up, fused_gdn_in, fused_qkv, groups
from stock.layers import MLP, OffsetRMSNorm, RMSNorm
from stock.linear import Linear
from stock.model import Output

log = logging.getLogger("stock.compiled")

BACKEND = "inductor"  # tests may count graphs with "eager" (no code generation)
RECOMPILE_LIMIT = 256  # per region: T buckets x models x caches in one process
DYNAMIC_SIZES = True  # requests_dynamic's marks; bench/batch_prepare.py compares with False
# with DYNAMIC_SIZES, which marks (bench/batch_step.py --static turns each off):
DYNAMIC_REQUESTS = True  # requests dims, the batched block drafter's rows too
DYNAMIC_TOKENS = True  # tokens dims
DYNAMIC_DRAFTER = True  # the batched block drafter's marks at all
_TRACED_TYPES = (Linear, nn.Linear, RMSNorm, OffsetRMSNorm)

_graphs = 0
_compile_s = 0.0   # seconds in the backend (inductor's code generation), this process
_fallbacks: dict[str, str] = {}
_compiled: dict[tuple[str, str], object] = {}


def compile_enabled(options, device: torch.device | str) -> bool:
    """The engine's decision: compiled static steps on CUDA with option `compile` on; never
    on another device (the option is ignored there, as `cuda_graphs` is)."""
    return torch.device(device).type == "cuda" and bool(options["compile"])


def graphs_compiled() -> int:
    """FX graphs handed to the backend so far in this process (graph breaks count each)."""
    return _graphs


def compile_seconds() -> float:
    """Seconds this process spent in the backend compiling graphs (dynamo's tracing not
    included): how much of a worker's preparation was compilation."""
    return _compile_s


def fallbacks() -> dict[str, str]:
    """Regions that fell back to eager in this process, with the reason."""
    return dict(_fallbacks)


def reset() -> None:
    """Forget compiled code, counts and fallbacks (tests)."""
    global _graphs, _compile_s
    _graphs, _compile_s = 0, 0.0
    _fallbacks.clear()
    _compiled.clear()
    torch._dynamo.reset()


# -- calling modules -----------------------------------------------------------------------
def _opaque(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """mod(x) run eagerly; wrapped in torch.compiler.disable on first compile (importing
    dynamo takes seconds: not at import of the engine)."""
    return mod(x)


def _traceable(mod: nn.Module) -> bool:
    """Whether dynamo should trace mod's forward: a type stock knows (its MLP only when its
    three linears are), or a module that says so. Under dynamo these tests are guards on
    types, the same for every layer."""
    if getattr(mod, "compile_traceable", False):
        return True
    if type(mod) is MLP:
        return (_traceable(mod.gate_proj) and _traceable(mod.up_proj)
                and _traceable(mod.down_proj))
    return type(mod) in _TRACED_TYPES


def _call(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """mod(x): traced if `_traceable(mod)`, else run eagerly through a graph break."""
    return mod(x) if _traceable(mod) else _opaque(mod, x)


# -- the regions (plain functions: also the eager fallback) --------------------------------
# Each is stock/body.py's pieces called with `_call`: the layer's math is written there once.
def attn_in(x, ln, attn, cos, sin, positions, k_buf, v_buf, qkv=None, rows=None,
            split=False):
    """Region A: x [B, T, H] -> queries [B, Hkv, G*T, D], or with `split` (where
    kernels/attention runs) the view [B, Hkv, G, T, D] it reads in place (body.split_heads);
    writes K/V at `positions` (a batched step: cache rows `rows` [B], each row at its own
    positions [B, T]). `qkv`: the layer's fused q/k/v matrix (stock/fused.py) or None."""
    q, k, v = body.qkv(_call, attn, _call(ln, x), qkv)
    q, k, v = body.rotate(_call, attn, q, k, v, cos, sin)
    if rows is None:
        body.write_kv(k_buf, v_buf, positions, k, v)
    else:
        body.write_rows(k_buf, v_buf, rows, positions, k, v)
    return body.split_heads(attn, q) if split else body.fold(attn, q)


def attn_out_mlp(x, out, attn, ln, mlp, gate_up=None, gate=None):
    """Region B: attention output [B, Hkv, G*T, D] (or [B, T, H*D], body.merge) -> the
    layer's output x [B, T, H].
    `gate_up`: the layer's fused gate/up matrix (stock/fused.py) or None; `gate`: a gated
    attention's output gate (gated_attn_in's)."""
    b, t, _ = x.shape
    out = body.merge(attn, out, b, t)
    if gate is not None:
        out = out * torch.sigmoid(gate)
    x = x + _call(attn.o_proj, out)
    return x + body.mlp(_call, mlp, _call(ln, x), gate_up)


def gated_attn_in(x, ln, attn, cos, sin, positions, k_buf, v_buf, qkv=None, rows=None):
    """Region A of a gated attention (hybrid targets): (folded queries, output gate); K/V
    written as attn_in writes them (a batched step: into cache rows `rows`)."""
    q, gate, k, v = body.gated_qkv(_call, attn, _call(ln, x), qkv)
    q, k, v = body.rotate(_call, attn, q, k, v, cos, sin)
    if rows is None:
        body.write_kv(k_buf, v_buf, positions, k, v)
    else:
        body.write_rows(k_buf, v_buf, rows, positions, k, v)
    return body.fold(attn, q), gate


def gdn_in(x, ln, gdn, fused=None):
    """A GDN layer's region before its recurrence: input norm and projections (stock/gdn.py's
    project): mixed, z, beta, g."""
    return gdn_body.project(_call, gdn, _call(ln, x), fused)


def gdn_out_mlp(x, out, z, gdn, ln, mlp, gate_up=None):
    """A GDN layer's region after its recurrence: gated norm, out_proj, residual, the MLP."""
    x = x + gdn_body.finish(_call, gdn, out, z)
    return x + body.mlp(_call, mlp, _call(ln, x), gate_up)


def attn_out_mlp_next(x, out, attn, ln, mlp, next_ln, next_attn, cos, sin, positions,
                      k_buf, v_buf, gate_up=None, next_qkv=None, rows=None, split=False):
    """Region B of one layer and region A of the next in one graph, so the residual add
    fuses with the next input norm: (the layer's output x, the next layer's queries)."""
    x = attn_out_mlp(x, out, attn, ln, mlp, gate_up)
    return x, attn_in(x, next_ln, next_attn, cos, sin, positions, k_buf, v_buf, next_qkv,
                      rows, split)


def head(x, norm, lm_head):
    """Final norm, lm_head, fp32 logits."""
    return _call(lm_head, _call(norm, x)).float()


REGIONS = {"attn_in": attn_in, "attn_out_mlp": attn_out_mlp,
           "attn_out_mlp_next": attn_out_mlp_next, "head": head,
           "gated_attn_in": gated_attn_in, "gdn_in": gdn_in, "gdn_out_mlp": gdn_out_mlp}


def register_region(name: str, fn) -> None:
    """Another module's region (the block drafter's: stock/drafters/block_step.py), compiled
    and run by `run_region` like stock's own. Registering the same function again is a no-op."""
    if REGIONS.get(name, fn) is not fn:
        raise ValueError(f"region {name!r} is already registered to another function")
    REGIONS[name] = fn


# -- compilation ---------------------------------------------------------------------------
def _counting(backend: str):
    def compile_graph(gm, example_inputs):
        global _graphs, _compile_s
        _graphs += 1
        if backend != "inductor":
            return gm.forward  # "eager": the traced graph as is
        from torch._inductor.compile_fx import compile_fx

        t0 = time.perf_counter()
        try:
            return compile_fx(gm, example_inputs)
        finally:
            _compile_s += time.perf_counter() - t0
    return compile_graph


def _region(name: str):
    global _opaque
    key = (name, BACKEND)
    fn = _compiled.get(key)
    if fn is None:
        if not hasattr(_opaque, "_torchdynamo_disable"):
            _opaque = torch.compiler.disable(_opaque)
        fn = _compiled[key] = torch.compile(REGIONS[name], backend=_counting(BACKEND),
                                            dynamic=False, fullgraph=False)
    return fn


def dynamo_limits():
    """A recompile limit our regions do not reach, and reaching it an error (so the fallback
    below logs it) instead of dynamo's silent switch to eager. Names differ across torch
    versions (recompile_limit from 2.6, cache_size_limit before); only existing ones are set."""
    cfg = torch._dynamo.config
    patch = {}
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            patch[name] = RECOMPILE_LIMIT
            break
    for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            patch[name] = max(getattr(cfg, name), 4 * RECOMPILE_LIMIT)
            break
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, name):
            patch[name] = True
            break
    if hasattr(cfg, "suppress_errors"):  # errors reach run_region (and dynamo asserts that
        patch["suppress_errors"] = False  # it is off together with fail_on_..._limit_hit)
    if hasattr(cfg, "force_parameter_static_shapes"):  # honour _mark_dynamic_buffers' marks
        patch["force_parameter_static_shapes"] = False  # (unmarked tensors stay static)
    return cfg.patch(patch) if patch else nullcontext()


def run_region(name: str, *args):
    """The compiled region, or its eager function after a (logged) failure. Callers run it
    under `dynamo_limits()`."""
    if name in _fallbacks:
        return REGIONS[name](*args)
    try:
        return _region(name)(*args)
    except Exception as exc:  # noqa: BLE001 - any compile failure: loud eager fallback
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise  # inside a capture nothing can be retried; the capture fails instead
        _fallbacks[name] = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("stock.compiled: region %s fell back to eager for the rest of this "
                    "process: %s", name, _fallbacks[name])
        return REGIONS[name](*args)


def _mark_dynamic_buffers(model) -> None:
    """Buffers a module names in `compile_dynamic_buffers` get a dynamic first dimension, so
    that one graph per region and T still serves every layer when their lengths differ from
    layer to layer (W12's exception lists, stock/w12_linear.py). Marks live on the tensor
    objects; this runs in the compiled forward, which only warm-ups and captures call."""
    for mod in (*model.modules(), *groups(model)):
        for name in getattr(mod, "compile_dynamic_buffers", ()):
            buf = getattr(mod, name)
            if buf.dim() and buf.shape[0] > 1:  # 0 and 1 are specialised by dynamo anyway
                torch._dynamo.maybe_mark_dynamic(buf, 0)


def requests_dynamic(*tensors) -> None:
    """(tensor, dims) pairs of a batched step (rows, positions, RoPE rows, activations): the
    dims named, the requests bucket and the tokens bucket, made dynamic where their size
    is over one (dynamo specialises 0 and 1 anyway), so one graph per region serves every
    bucket pair of two or more. Compiled code then takes its sizes as arguments; each slot
    still captures its own CUDA graph. Static, the batched engine compiled every region
    once per (requests, tokens) bucket pair: 140 graphs for up to 16 requests and 64 tokens
    on the tiny model (24 dynamic), and on the H100 a throughput verdict's worker spent
    90-200 s preparing its graphs, most of it compiling. Each pair's dims name the
    requests dim first, then the tokens dim if it has one; DYNAMIC_REQUESTS or
    DYNAMIC_TOKENS off leaves that dim static, so each of its buckets compiles its own
    graph (whose code then knows the size)."""
    if not DYNAMIC_SIZES:
        return
    for t, dims in tensors:
        for i, d in enumerate(dims):
            if t.shape[d] > 1 and (DYNAMIC_TOKENS if i else DYNAMIC_REQUESTS):
                torch._dynamo.maybe_mark_dynamic(t, d)


def uses_kernel(attention: str, device: torch.device, head_dim: int) -> bool:
    """Whether `attention` ("triton" or "sdpa") runs kernels/attention's split-KV kernel: on
    CUDA, for the head dims it takes; SDPA otherwise."""
    if attention not in ("triton", "sdpa"):
        raise ValueError(f"attention must be 'triton' or 'sdpa', not {attention!r}")
    if attention == "sdpa" or device.type != "cuda":
        return False
    from kernels.attention import supported  # lazy: Triton kernels, CUDA only

    return supported(head_dim)


def forward(model, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, kv_len: int,
            hidden_layers: tuple[int, ...] = (), logits: bool = True, attention: str = "sdpa",
            fused: bool = False, rope: torch.Tensor | None = None,
            seen: torch.Tensor | None = None, tree: torch.Tensor | None = None,
            rows: torch.Tensor | None = None):
    """static_forward's contract (see stock/static_step.py), through the compiled regions.
    `attention`: "triton" runs the eager attention between the regions through
    kernels/attention's split-KV kernel where `uses_kernel` says so, "sdpa" through
    F.scaled_dot_product_attention with the step's mask. `fused`: multiply by a layer's
    fused q/k/v and gate/up matrices where stock/fused.py has them (option
    fuse_projections); off, the projections run one by one even on a fused model. `rope`
    and `seen` (a tree's RoPE positions and visibility, static_forward's): attention is
    SDPA with that mask, or the split-KV kernel with `tree` (the same visibility as bits)
    where the kernel runs. `rows` [B] (a batched step, stock/batch_graphs.py): request b's
    tokens at its own positions[b] in cache row rows[b], `seen` [B, T, kv_len] its causal
    mask; attention is the split-KV kernel reading each request's own row where the kernel
    runs (`attention`), else SDPA over the rows gathered (the model's batched forward's)."""
    layers = list(model.model.layers)
    head_dim = next(la.self_attn.d for la in layers if hasattr(la, "self_attn"))
    if rows is not None and (seen is None or rope is not None or tree is not None):
        raise ValueError("a batched step gives its rows' causal mask and no RoPE or tree of "
                         "its own")
    # a batched step's mask is its rows' causal one (stock/batch_graphs.py's row_steps),
    # which the kernel reads from each request's positions itself
    kernel = ((rows is not None or seen is None or tree is not None)
              and uses_kernel(attention, ids.device, head_dim))
    if kernel:
        from kernels.attention import decode_attention  # lazy: Triton, CUDA only
    cos, sin, mask_g, x = body.step_inputs(model, ids, positions if rope is None else rope,
                                           kv_len, None if kernel else seen, mask=not kernel)
    hidden = {}
    dyn = requests_dynamic if rows is not None else (lambda *t: None)
    dyn((x, (0, 1)), (cos, (0, 2)), (sin, (0, 2)), (positions, (0, 1)), (rows, (0,)))

    def buffers(layer):
        return cache.k[layer.self_attn.layer], cache.v[layer.self_attn.layer]

    def qkv(layer):
        return fused_qkv(layer.self_attn) if fused else None

    def attend(qg, k_buf, v_buf):
        if kernel:   # [B, T, H*D]: what o_proj reads, no transposing copy
            out = decode_attention(qg, k_buf, v_buf, positions, kv_len, tree=tree,
                                   rows_of=rows, merged=True)
            dyn((out, (0, 1)))
        else:
            out = body.attend(qg, k_buf, v_buf, kv_len, mask_g, rows)
            dyn((out, (0, 2)))
        return out

    with dynamo_limits():
        _mark_dynamic_buffers(model)
        if model.cfg.hybrid:
            if seen is not None and rows is None:
                raise ValueError("a hybrid target's GDN layers take no tree (stock/model.py)")
            x = _hybrid_layers(layers, x, cos, sin, positions, cache, buffers, attend,
                               fused, hidden_layers, hidden, rows, dyn)
            if not logits:
                return Output(None, hidden)
            return Output(run_region("head", x, model.model.norm, model.lm_head), hidden)
        first = layers[0]
        qg = run_region("attn_in", x, first.input_layernorm, first.self_attn, cos, sin,
                        positions, *buffers(first), qkv(first), rows, kernel)
        for i, layer in enumerate(layers):
            out = attend(qg, *buffers(layer))
            gate_up = fused_gate_up(layer.mlp) if fused else None
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                x, qg = run_region("attn_out_mlp_next", x, out, layer.self_attn,
                                   layer.post_attention_layernorm, layer.mlp,
                                   nxt.input_layernorm, nxt.self_attn, cos, sin, positions,
                                   *buffers(nxt), gate_up, qkv(nxt), rows, kernel)
                dyn((x, (0, 1)))
            else:
                x = run_region("attn_out_mlp", x, out, layer.self_attn,
                               layer.post_attention_layernorm, layer.mlp, gate_up)
                dyn((x, (0, 1)))
            if i in hidden_layers:
                hidden[i] = x
        if not logits:
            return Output(None, hidden)
        return Output(run_region("head", x, model.model.norm, model.lm_head), hidden)


def _hybrid_layers(layers, x, cos, sin, positions, cache, buffers, attend, fused,
                   hidden_layers, hidden, rows=None, dyn=lambda *t: None):
    """A hybrid target's layers (called by forward, under dynamo_limits): per GDN layer its
    two regions around the eager recurrence (conv and delta rule: kernels/gdn, stock/gdn.py's
    recur, staging the commit; a static step's start is trusted, as in the eager forward;
    a batched step's rows read and stage their own states), per gated attention layer
    region A, attention, region B with the gate. Regions are not joined across layers here
    (four kinds of neighbours)."""
    for i, layer in enumerate(layers):
        ln, mlp = layer.post_attention_layernorm, layer.mlp
        gate_up = fused_gate_up(mlp) if fused else None
        if hasattr(layer, "linear_attn"):
            gdn = layer.linear_attn
            mixed, z, beta, g = run_region("gdn_in", x, layer.input_layernorm, gdn,
                                           fused_gdn_in(gdn) if fused else None)
            out = gdn_body.recur(gdn, mixed, beta, g, cache, None, rows)
            dyn((out, (0, 1)), (z, (0, 1)))
            x = run_region("gdn_out_mlp", x, out, z, gdn, ln, mlp, gate_up)
        else:
            attn = layer.self_attn
            qkv = fused_qkv(attn) if fused else None
            if attn.gated:
                qg, gate = run_region("gated_attn_in", x, layer.input_layernorm, attn, cos,
                                      sin, positions, *buffers(layer), qkv, rows)
            else:
                qg, gate = run_region("attn_in", x, layer.input_layernorm, attn, cos, sin,
                                      positions, *buffers(layer), qkv, rows), None
            out = attend(qg, *buffers(layer))
            if gate is not None:
                dyn((gate, (0, 1)))
            x = run_region("attn_out_mlp", x, out, attn, ln, mlp, gate_up, gate)
        dyn((x, (0, 1)))
        if i in hidden_layers:
            hidden[i] = x
    return x
