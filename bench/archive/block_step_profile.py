"""Per engine step on CPU: aten ops and host synchronisations for ar / ngram / block.

What a GPU step pays besides its arithmetic is kernel launches and host synchronisations;
both can be counted on CPU. The engine runs its static step path eagerly (`static=True`, the
logic the CUDA-graph path replays; on the GPU the whole verify forward is one graph replay),
and the drafter as it runs on the GPU (eagerly). For every mode this prints, per decoding
step (prefill excluded):

- aten ops: torch.profiler events, split into the drafter (its `draft` call, context
  update included), the context update alone (`BlockDrafter.extend`), and the rest of the
  step (verify forward + engine bookkeeping). "launching" counts top-level aten ops (called
  from Python, not from inside another aten op) that are not pure view/metadata ops: each is
  one dispatcher round trip that launches at least one kernel on a GPU (a linear one GEMM,
  an attention one or a few), the proxy for launch overhead; "all" counts every aten event.
- host syncs: reads of a tensor that would live on the accelerator (`.item()`, `.tolist()`,
  `.cpu()`, `bool()/int()/float()`, `.numpy()`, and data-dependent shapes such as
  `torch.nonzero`), found by tracking residency with a TorchFunctionMode: parameters, buffers
  and tensors made with an explicit `device=` are "device" tensors, results of `.cpu()` and
  factories without `device=` are host tensors, and any result inherits "device" from its
  inputs. A read of a host tensor (e.g. the lattice already moved to the host) is free and
  not counted. Also counted: host-to-device copies of host data (`torch.tensor(list,
  device=...)`, `.to(device)`: blocking on CUDA, a stream sync), listed apart from `copy_` of
  a host tensor into a device buffer (the graph runner and the block drafter stage theirs in
  pinned memory on CUDA and copy asynchronously; CPU has no pinned memory, so the copy
  appears here as well). The profiler's `aten::_local_scalar_dense`
  events (what `.item()` runs) are printed as a cross-check.

    python bench/block_step_profile.py --weights /work/notes/gpu/call3 --max-new 48

CPU only, fp32; counts, not times (no speed claim is made from this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

if "stock" not in sys.modules and not any(Path(p, "stock").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from stock.engine import Engine  # noqa: E402
from stock.options import resolve  # noqa: E402
from specpilot.requests import load_dev, select  # noqa: E402
from stock.system import load_system, make_drafter  # noqa: E402

# aten ops that only make views or read metadata: no kernel on a GPU
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::as_strided", "aten::slice",
    "aten::select", "aten::transpose", "aten::t", "aten::permute", "aten::expand",
    "aten::unsqueeze", "aten::squeeze", "aten::alias", "aten::detach", "aten::lift_fresh",
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::split",
    "aten::chunk", "aten::unbind", "aten::narrow", "aten::view_as", "aten::expand_as",
    "aten::result_type", "aten::is_nonzero", "aten::size", "aten::stride", "aten::numel",
    "aten::dim", "aten::is_floating_point", "aten::_reshape_alias", "aten::unflatten",
    "aten::flatten", "aten::contiguous", "aten::to", "aten::_has_compatible_shallow_copy_type",
    "aten::set_", "aten::lift", "aten::detach_", "aten::_nested_tensor_from_mask_left_aligned",
    "aten::_shape_as_tensor", "aten::item",  # item is counted as a sync, below
    "aten::split_with_sizes", "aten::unsafe_split", "aten::_unsafe_split",
}


def _launches(ev) -> bool:
    """A top-level op launches work unless it is a view/metadata op that made no copy (a
    `.to()` or `.contiguous()` that converted runs a copying child such as _to_copy)."""
    if ev.name not in NO_KERNEL:
        return True
    return any(c.name.startswith("aten::") and _launches(c) for c in ev.cpu_children)
READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
DATA_SHAPED = {"nonzero", "masked_select", "unique", "argwhere", "nonzero_static"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand",
             "randint", "linspace", "zeros_like", "ones_like", "empty_like", "full_like"}


def _is_host(t) -> bool:
    while t is not None:
        if getattr(t, "_sp_host", False):
            return True
        t = getattr(t, "_base", None)
    return False


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _mark(out, host: bool):
    if not host:
        return
    for t in _tensors(out):
        try:
            t._sp_host = True
        except (AttributeError, RuntimeError):
            pass


class Residency(TorchFunctionMode):
    """Counts host reads of (would-be) device tensors and host-to-device copies."""

    def __init__(self):
        super().__init__()
        self.where = "other"  # "drafter" while a drafter runs
        self.syncs: Counter = Counter()
        self.h2d: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        ins = list(_tensors(args)) + list(_tensors(kwargs))
        host_in = bool(ins) and all(_is_host(t) for t in ins)
        if name in READS and ins and not _is_host(ins[0]):
            self.syncs[(self.where, name)] += 1
        if name in DATA_SHAPED and ins and not host_in:
            self.syncs[(self.where, name)] += 1
        if name == "copy_" and len(ins) >= 2 and _is_host(ins[1]) and not _is_host(ins[0]) \
                and not ins[1].is_pinned():
            self.h2d[(self.where, "copy_")] += 1
        out = func(*args, **(kwargs or {}))
        if name == "cpu" or name == "numpy":
            host = True
        elif name in FACTORIES and not any(_tensors(args)):
            host = kwargs.get("device") is None or kwargs.get("pin_memory", False)
            if not host and name in ("tensor", "as_tensor"):
                self.h2d[(self.where, "tensor(device=)")] += 1
        elif name == "to" and ins and _is_host(ins[0]) and (
                kwargs.get("device") is not None or any(
                    isinstance(a, (torch.device, str)) for a in args[1:])):
            host = False
            self.h2d[(self.where, "to(device)")] += 1
        else:
            host = host_in and "device" not in kwargs
        _mark(out, host)
        return out


def _under(ev, names) -> str | None:
    p = ev.cpu_parent
    while p is not None:
        if p.name in names:
            return p.name
        p = p.cpu_parent
    return None


def profile_mode(system, mode: str, prompt: list[int], max_new: int, opts: dict) -> dict:
    model = system.engine.model
    engine = Engine(model, system.engine.options.__class__({**system.engine.options.as_dict(),
                                                             **opts}),
                    system.engine.max_context, system.engine.stop_ids, static=True)
    drafter = make_drafter(None if mode == "ar" else mode, engine)
    rmode = Residency()
    if drafter is not None:  # label the drafter's work (and its context update)
        draft = drafter.draft

        def labelled_draft(ctx, k, _draft=draft):
            rmode.where = "drafter"
            try:
                with record_function("sp::drafter"):
                    return _draft(ctx, k)
            finally:
                rmode.where = "other"
        drafter.draft = labelled_draft
        if hasattr(drafter, "extend"):
            extend = drafter.extend

            def labelled_extend(*a, _extend=extend, **kw):
                with record_function("sp::context_update"):
                    return _extend(*a, **kw)
            drafter.extend = labelled_extend
    prefill = engine._prefill

    def labelled_prefill(*a, **kw):
        rmode.where = "prefill"
        try:
            with record_function("sp::prefill"):
                return prefill(*a, **kw)
        finally:
            rmode.where = "other"
    engine._prefill = labelled_prefill
    engine.generate(prompt, 4, drafter)  # warm-up: allocator, first shapes
    with profile(activities=[ProfilerActivity.CPU]) as prof, rmode:
        res = engine.generate(prompt, max_new, drafter)
    steps = res.steps
    ops = Counter()
    scalar_dense = Counter()
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        region = _under(ev, ("sp::prefill",))
        if region:
            continue
        where = _under(ev, ("sp::context_update",)) and "context_update" or (
            _under(ev, ("sp::drafter",)) and "drafter" or "verify+engine")
        ops[(where, "all")] += 1
        top = ev.cpu_parent is None or not ev.cpu_parent.name.startswith("aten::")
        if top and _launches(ev):
            ops[(where, "launching")] += 1
        if ev.name == "aten::_local_scalar_dense":
            scalar_dense[where] += 1
    # the drafter total includes its context update (extend runs inside draft)
    for kind in ("all", "launching"):
        ops[("drafter", kind)] += ops[("context_update", kind)]
    per = lambda c: round(c / max(steps, 1), 2)  # noqa: E731
    syncs_prefill_free = {k: v for k, v in rmode.syncs.items() if k[0] != "prefill"}
    return {
        "mode": mode, "steps": steps, "tokens": len(res.tokens), "tau": round(res.tau, 3),
        "ops_per_step": {f"{w}/{k}": per(v) for (w, k), v in sorted(ops.items())},
        "host_syncs_per_step": {f"{w}/{n}": per(v) for (w, n), v in
                                sorted(syncs_prefill_free.items())},
        "host_syncs_total": dict((f"{w}/{n}", v) for (w, n), v in sorted(rmode.syncs.items())),
        "h2d_per_step": {f"{w}/{n}": per(v) for (w, n), v in sorted(rmode.h2d.items())
                         if w != "prefill"},
        "local_scalar_dense_per_step": {w: per(v) for w, v in sorted(scalar_dense.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="", help="block-drafter folder")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--request", default="code-001", help="dev request id")
    ap.add_argument("--modes", default="ar,ngram,block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    opts = [f"block_weights={args.weights}"] if args.weights else []
    system = load_system("embedded", resolve(opts), device="cpu", max_context=1024)
    req = next((r for r in load_dev() if r.id == args.request), None) or select(load_dev(),
                                                                               None, 1)[0]
    prompt = system.tokenizer.chat(req.prompt)
    per_mode = {"ar": {}, "ngram": {}, "block": {"block_size": 16, "draft_len": 15}}
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        try:
            row = profile_mode(system, mode, prompt, args.max_new, per_mode.get(mode, {}))
        except Exception as exc:  # one failure must not lose the rest
            print(f"{mode}: {exc!r}", flush=True)
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nCPU fp32, request {req.id} ({len(prompt)} prompt tokens), ≤{args.max_new} new; "
          "per decoding step (prefill excluded); engine static path run eagerly")
    print(f"{'mode':<7}{'steps':>6}{'tau':>7}{'drafter ops':>13}{'ctx-upd ops':>13}"
          f"{'verify ops':>12}{'drafter syncs':>15}{'all syncs':>11}{'sync H2D':>9}")
    for r in rows:
        o, s = r["ops_per_step"], r["host_syncs_per_step"]
        dsync = sum(v for k, v in s.items() if k.startswith("drafter/"))
        print(f"{r['mode']:<7}{r['steps']:>6}{r['tau']:>7}"
              f"{o.get('drafter/launching', 0):>13}{o.get('context_update/launching', 0):>13}"
              f"{o.get('verify+engine/launching', 0):>12}{dsync:>15}{sum(s.values()):>11}"
              f"{sum(v for k, v in r['h2d_per_step'].items() if 'copy_' not in k):>9}")
    print("ops: top-level aten ops that launch work (views/metadata excluded); syncs: host reads "
          "of device-resident tensors;\nsync H2D: torch.tensor(list, device=)/.to(device) of host data, "
          "blocking on CUDA; the graph runner's and the block drafter's step inputs (copy_) "
          "are staged in pinned memory there and not counted")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "block_step_profile.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
