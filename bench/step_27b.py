"""27B-class random-weight dense target on one GPU: AR step against its weight-bytes floor,
and verify steps of T = 1, 8, 16, 32, 64 tokens, replayed from CUDA graphs.

Parts (each in its own try, so one failure keeps the rest):
  1. device copy bandwidth: a 1 GiB device-to-device copy, median of 10; bandwidth counts the
     bytes read plus the bytes written (2 GiB per copy), as the copy-bandwidth figure in
     docs/ARCHITECTURE's facts does;
  2. the model: Transformer.random(PRESETS[preset], cuda, bf16), checked to be allocated on
     the GPU in bf16 directly (peak memory about the parameter bytes, no fp32 copy);
  3. the floor: every parameter byte read once per step at the copy bandwidth. The embedding
     table is excluded (a step reads one row per token); lm_head is included. The KV cache
     read at the context is reported beside it;
  4. correctness at a context of --context tokens: graph replay against the eager static
     forward (bit for bit) for T = 1 and 16, and the static forward against the dynamic one;
  5. timings: the AR step eager (the dynamic forward, as the engine ran before graphs) and
     from a graph, then verify steps of each T from graphs; per-step CUDA events, median and
     p10-p90 of --iters replays;
  6. --w12: stock.w12_linear.convert_model(model) replaces nn.Linear modules in place, the
     graphs are captured again and the same steps timed; both printed side by side;
  7. --profile: GPU time of eager T = 1 and 16 steps by kernel and category (gemm,
     attention, other) and launches per step, for bf16 and for the last W12 kernel (and,
     with --compile on|both, of the compiled static forward run without a graph);
     --profile-graphs (with --trees): the kernels inside graph replays of the last
     compiled runner's chain steps (T = 16, 32) and tree steps of each budget;
  8. --compile both|on|off (default both): the static forward's layers through
     torch.compile'd regions (stock/compiled.py, the engine's option `compile`). Per T the
     first slot's warm-up compiles, then it is captured; that time is reported per T. Before
     timing, the compiled graph's logits are checked against the eager static forward (max
     |diff|, relative error, argmax agreement: bf16 rounding may differ). With `both` the
     table shows eager and compiled side by side (ms, x floor, compiled/eager). With
     --w12 --w12-compiled, each W12 kernel is timed compiled too (a W12Linear is one custom
     op inside the compiled regions, stock/w12_linear.py).
  9. --variants attn,fused_attn,fused: the compiled step again with stock's fast-path
     options (attention_kernel=triton: kernels/attention's split-KV kernel; fuse_projections:
     q/k/v and gate/up as one GEMM each, stock/fused.py), each compiled, checked and timed,
     beside the base compiled step (SDPA, separate projections). The W12 steps compiled
     after them run with the last variant's options: with fuse_projections, one W12 GEMV
     per q/k/v and gate/up group (stock/w12_linear.py); --w12-unfused times them module
     by module too.

    python bench/step_27b.py --out $OUT            # about 60-90 s on an H200 (estimate)
    python bench/step_27b.py --out $OUT --w12
    python bench/step_27b.py --compile both --ts 1,8,16 --iters 20 --out $OUT
    python bench/step_27b.py --compile on --ts 1,16 --iters 20 --variants fused_attn \
        --w12 --w12-kernels gemv --w12-compiled           # stock's default against W12
    python bench/step_27b.py --compile on --ts 1,8,16,32,64 --variants fused_attn \
        --trees 8,16,32,64                                 # tree-verify's verify steps
    python bench/step_27b.py --smoke     # CPU: tiny-qwen3, fp32, eager layers, then W12

Prints progress, then one table: every timed step side by side, one row per (step, T), with
median, p10-p90 and the ratios (see Bench.table); writes step_27b.json to --out (default
$OUT, else cwd). (Before the suite this was bench/gpu_27b.py, which printed the same
timings in three tables; --cpu-smoke is kept as the old name of the CPU path.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import common
from common import GiB, T0, log, print_table

import torch  # noqa: E402

from stock import compiled as compiled_step  # noqa: E402
from stock.cache import KVCache  # noqa: E402
from stock.config import PRESETS, ModelConfig  # noqa: E402
from stock.graphs import GraphRunner  # noqa: E402
from stock.model import Transformer  # noqa: E402

DEV = "cuda"  # --smoke: "cpu" (the script's logic on a tiny preset; timings meaningless)
DTYPE = torch.bfloat16


def sync() -> None:
    common.sync(DEV)


def empty_cache() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


def mem_info() -> tuple[int, int]:
    return torch.cuda.mem_get_info() if DEV == "cuda" else (1 << 50, 1 << 50)


def param_count(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by role, from the config alone (before anything is allocated)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_heads * d * 2 + h * cfg.num_kv_heads * d * 2
    norms = 2 * h + (2 * d if cfg.qk_norm else 0)
    layer = attn + 3 * h * cfg.intermediate_size + norms
    embed = cfg.vocab_size * h
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * h
    return {"layers": cfg.num_layers * layer, "embed": embed, "lm_head": head, "final_norm": h}


def free_bytes() -> int:
    return mem_info()[0]


def need(nbytes: int, what: str) -> None:
    free, total = mem_info()
    if free < nbytes:
        raise MemoryError(f"{what} needs {nbytes / GiB:.1f} GiB but only {free / GiB:.1f} of "
                          f"{total / GiB:.1f} GiB are free")


def timed(fn, iters: int, warmup: int = 3) -> dict:
    """Per-call time (CUDA events on CUDA): median, p10, p90 in ms (common.timed)."""
    return common.timed(fn, iters, DEV, warmup)


def copy_bandwidth(size: int, iters: int = 10) -> dict:
    need(2 * size + GiB, "the copy-bandwidth test")
    return common.copy_bandwidth(size, DEV, iters)


class Bench:
    def __init__(self, args):
        self.args = args
        self.report: dict = {"args": vars(args), "errors": {}}
        self.model = self.cache = self.runner = self.eager = None
        self.crunner = self.ceager = None  # compiled: captured, and run without a graph

    def part(self, name: str, fn):
        log(f"{name} ...")
        try:
            out = fn()
            log(f"{name} done")
            return out
        except Exception as exc:  # noqa: BLE001 - one part's failure must not lose the rest
            self.report["errors"][name] = f"{type(exc).__name__}: {exc}"
            log(f"{name} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            return None

    # -- parts ---------------------------------------------------------------------------------
    def env(self):
        free, total = mem_info()
        name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke run)"
        self.report["env"] = {"device": name, "torch": torch.__version__,
                              "cuda": torch.version.cuda, "free_gib": round(free / GiB, 2),
                              "total_gib": round(total / GiB, 2)}
        log(f"{self.report['env']}")

    def bandwidth(self):
        res = copy_bandwidth(int(self.args.copy_gib * GiB))
        self.report["copy"] = res
        log(f"copy {res['bytes'] / GiB:.0f} GiB: {res['median_ms']:.3f} ms median -> "
            f"{res['read_plus_write_bytes_per_s'] / 1e12:.3f} TB/s (read + write)")

    def build(self):
        cfg = PRESETS[self.args.preset]
        counts = param_count(cfg)
        expect = DTYPE.itemsize * sum(counts.values())
        need(expect + 6 * GiB, f"{self.args.preset} in {DTYPE} plus working memory")
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if DEV == "cuda" else 0
        t0 = time.perf_counter()
        model = Transformer.random(cfg, DEV, DTYPE, seed=0)
        sync()
        build_s = time.perf_counter() - t0
        params = list(model.named_parameters())
        devices = {p.device.type for _, p in params}
        dtypes = {str(p.dtype) for _, p in params}
        nbytes = sum(p.numel() * p.element_size() for _, p in params)
        peak = torch.cuda.max_memory_allocated() - base if DEV == "cuda" else nbytes
        # 5% plus 256 MiB: a model built in fp32 and cast would need twice its bytes; a small
        # model's transient init buffers are not that
        direct = (devices == {DEV} and dtypes == {str(DTYPE)}
                  and peak <= 1.05 * nbytes + 256 * 2**20)
        self.report["model"] = {
            "preset": self.args.preset, "build_s": round(build_s, 2), "param_bytes": nbytes,
            "param_bytes_expected": expect, "peak_alloc_bytes": peak, "devices": sorted(devices),
            "dtypes": sorted(dtypes), "created_directly_on_device_in_dtype": direct,
            "params_by_role": counts}
        log(f"model: {nbytes / 1e9:.2f} GB of parameters ({dtypes}, {devices}), peak "
            f"{peak / 1e9:.2f} GB, built in {build_s:.1f} s; allocated directly on {DEV} in {DTYPE}: {direct}")
        if not direct:
            raise RuntimeError(f"the model was not allocated directly on {DEV} in {DTYPE}")
        self.model = model

    def weight_bytes(self, model=None) -> dict:
        """Bytes a step reads: parameters and buffers except the embedding table."""
        model = model or self.model
        embed = model.model.embed_tokens.weight
        seen, total = set(), 0
        for t in [*model.parameters(), *model.buffers()]:
            if t.data_ptr() in seen or t.data_ptr() == embed.data_ptr():
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        cfg = model.cfg
        ctx = self.args.context
        kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * model.dtype.itemsize
        return {"weight_bytes_excl_embedding": total,
                "embedding_bytes_excluded": embed.numel() * embed.element_size(),
                "kv_bytes_at_context": kv}

    def setup_cache(self):
        m, ctx = self.model, self.args.context
        max_context = ctx + 64
        slots = -(-(max_context + 64) // 64) * 64
        need(2 * m.cfg.num_layers * m.cfg.num_kv_heads * m.cfg.head_dim * slots * 2 + 2 * GiB,
             "the KV cache")
        self.cache = KVCache(m.cfg, slots, 1, DEV, m.dtype)
        ids = torch.randint(0, m.cfg.vocab_size, (1, ctx), device=DEV,
                            generator=torch.Generator(device=DEV).manual_seed(1))
        m(ids, self.cache, 0, logits="none")  # prefill: a real context to attend over
        self.cache.commit(ctx)
        self.runner = GraphRunner(m, self.cache, max_context)
        self.eager = GraphRunner(m, self.cache, max_context, capture=False)
        if self.args.compile != "off":
            self.crunner = GraphRunner(m, self.cache, max_context, capture=DEV == "cuda",
                                       compile=True)
            self.ceager = GraphRunner(m, self.cache, max_context, capture=False, compile=True)
        sync()

    def step_ids(self, t: int) -> list[int]:
        g = torch.Generator().manual_seed(100 + t)
        return torch.randint(0, self.model.cfg.vocab_size, (t,), generator=g).tolist()

    def check(self, tag: str) -> dict:
        """Graph replay against the eager static forward (bit for bit); the static forward
        against the dynamic one (relative error; bf16 kernels differ)."""
        ctx, out = self.args.context, {}
        for t in (1, 16):
            ids = self.step_ids(t)
            want = self.eager.step(ids, ctx).logits[:t].clone()
            got = self.runner.step(ids, ctx).logits[:t].clone()
            dyn = self.model(torch.tensor([ids], device=DEV), self.cache, ctx).logits[0]
            rel = ((want - dyn).norm() / dyn.norm()).item()
            out[t] = {"graph_equals_eager_bitwise": bool(torch.equal(got, want)),
                      "max_abs_graph_vs_eager": (got - want).abs().max().item(),
                      "static_vs_dynamic_rel": rel,
                      "argmax_static_equals_dynamic": bool(torch.equal(want.argmax(-1),
                                                                       dyn.argmax(-1))),
                      "finite": bool(torch.isfinite(got).all())}
            log(f"[{tag}] T={t}: {out[t]}")
        self.report.setdefault("checks", {})[tag] = out
        return out

    def time_steps(self, tag: str, runner: GraphRunner | None = None) -> dict:
        runner = runner or self.runner
        ctx, iters, res = self.args.context, self.args.iters, {}
        if tag == "bf16" or (tag == "bf16_compiled" and self.args.compile == "on"):
            ids = torch.tensor([self.step_ids(1)], device=DEV)
            with torch.inference_mode():
                res["ar_eager"] = timed(lambda: self.model(ids, self.cache, ctx), iters)
            log(f"[{tag}] AR eager (dynamic forward): {res['ar_eager']['median_ms']:.3f} ms")
        for t in self.args.ts:
            s = runner.slot(runner.bucket(t), runner.kv_bucket(ctx + t))
            runner.load(s, self.step_ids(t), ctx)
            res[f"graph_T{t}"] = timed(lambda: runner.launch(s), iters)
            log(f"[{tag}] T={t} (bucket {s.t}, kv {s.kv_len}) graph: "
                f"{res[f'graph_T{t}']['median_ms']:.3f} ms")
        self.report.setdefault("timings", {})[tag] = res
        return res

    def compile_slots(self, tag: str) -> dict:
        """Per T: the compiled runner's first slot (warm-up forwards, which compile, then the
        capture), timed, with the number of graphs compiled."""
        ctx, out = self.args.context, {}
        for t in sorted({*self.args.ts, 1, 16}):
            r = self.crunner
            before = compiled_step.graphs_compiled()
            t0 = time.perf_counter()
            slot = r.slot(r.bucket(t), r.kv_bucket(ctx + t))
            if slot.graph is None:  # no capture (--cpu-smoke): the first step compiles
                r.load(slot, self.step_ids(t), ctx)
                r.launch(slot)
            sync()
            out[t] = {"compile_and_capture_s": round(time.perf_counter() - t0, 2),
                      "graphs": compiled_step.graphs_compiled() - before}
            log(f"[{tag}] T={t}: compiled and captured in {out[t]['compile_and_capture_s']} s "
                f"({out[t]['graphs']} graphs)")
        self.report.setdefault("compile_s", {})[tag] = out
        fb = compiled_step.fallbacks()
        self.report.setdefault("compile_fallbacks", {})[tag] = fb
        if fb:
            log(f"[{tag}] REGIONS FELL BACK TO EAGER: {fb}")
        return out

    def check_compiled(self, tag: str) -> dict:
        """The compiled graph against the eager static forward (bf16 rounding may differ):
        max |diff|, relative error, argmax agreement; and against the compiled forward run
        without a graph (bit for bit expected)."""
        ctx, out = self.args.context, {}
        for t in (1, 16):
            ids = self.step_ids(t)
            want = self.eager.step(ids, ctx).logits[:t].clone()
            got = self.crunner.step(ids, ctx).logits[:t].clone()
            plain = self.ceager.step(ids, ctx).logits[:t].clone()
            out[t] = {"max_abs_compiled_vs_eager": (got - want).abs().max().item(),
                      "rel_compiled_vs_eager": ((got - want).norm() / want.norm()).item(),
                      "argmax_agree": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
                      "graph_equals_compiled_no_graph_bitwise": bool(torch.equal(got, plain)),
                      "finite": bool(torch.isfinite(got).all())}
            log(f"[{tag}] T={t}: {out[t]}")
        self.report.setdefault("checks_compiled", {})[tag] = out
        return out

    def compiled(self, tag: str = "bf16_compiled"):
        self.compile_slots(tag)
        self.check_compiled(tag)
        self.time_steps(tag, self.crunner)
        return True

    def variant(self, tag: str, fuse: bool, attention: str):
        """The compiled step again with stock's fast-path options: `fuse` (option
        fuse_projections: stock/fused.py; the model is fused in place the first time, and a
        later variant without `fuse` runs its projections one by one) and `attention` (option
        attention_kernel), with new runners; compiled, checked, timed."""
        from stock.fused import fuse_projections

        if fuse:
            log(f"[{tag}] fused {fuse_projections(self.model)} projection groups")
        self.new_compiled_runners(attention, fuse)
        self.report.setdefault("variants", {})[tag] = {"fuse": fuse, "attention": attention}
        return self.compiled(tag)

    def new_compiled_runners(self, attention: str, fused: bool) -> None:
        """Drop the compiled runners' graphs and make new ones (graph and eager) with these
        options."""
        for r in (self.crunner, self.ceager):
            if r is not None:
                r.reset()
        empty_cache()
        ctx = self.args.context
        self.crunner = GraphRunner(self.model, self.cache, ctx + 64, capture=DEV == "cuda",
                                   compile=True, attention=attention, fused=fused)
        self.ceager = GraphRunner(self.model, self.cache, ctx + 64, capture=False,
                                  compile=True, attention=attention, fused=fused)

    def tree_steps(self, budgets: list[int]):
        """Verify steps over best-first draft trees of each budget (memory entry tree-verify:
        GraphRunner.tree_step, a graph with the ancestor mask, SDPA, the device walk and the
        K/V compaction) on the last compiled runner, beside its chain steps of the same T.
        Trees from a random lattice of 15 positions x top-4 (block 16's shape)."""
        r = self.crunner or self.runner
        iters, res, shapes = self.args.iters, {}, {}
        for b, (s, tree) in self.tree_slots(budgets).items():
            res[f"graph_T{b}"] = timed(lambda: r.launch(s), iters)
            shapes[b] = {"nodes": len(tree), "depth": tree.max_depth, "bucket": s.t}
            log(f"[tree] budget {b} ({shapes[b]}): {res[f'graph_T{b}']['median_ms']:.3f} ms")
        base = next(reversed(self.report.get("variants", {})), "bf16")
        tag = f"{base}_tree" + ("_compiled" if r is self.crunner else "")
        self.report.setdefault("timings", {})[tag] = res
        self.report.setdefault("trees", {})[tag] = shapes
        return res

    def tree_slots(self, budgets: list[int]) -> dict:
        """Per budget: the last compiled runner's tree slot loaded with a best-first tree
        over a random lattice of 15 positions x top-4 (block 16's shape), and the tree."""
        from stock.tree import build

        r = self.crunner or self.runner
        ctx, out = self.args.context, {}
        g = torch.Generator().manual_seed(5)
        vocab = self.model.cfg.vocab_size
        ids = torch.stack([torch.randperm(vocab, generator=g)[:4] for _ in range(15)])
        lp = torch.log_softmax(2 * torch.randn(15, 4, generator=g), -1)
        lp = lp.sort(-1, descending=True).values
        for b in budgets:
            tree = build(ids, lp, self.step_ids(1)[0], b)
            s = r.slot(r.bucket(b), r.kv_bucket(ctx + b), (), tree=True)
            toks, parents, depths = tree.padded(s.t)
            r.load(s, toks[:len(tree)], ctx, len(tree) - 1, (depths, parents))
            out[b] = (s, tree)
        return out

    def w12(self, kernel: str = "gemm"):
        import stock.w12_linear as w12
        from kernels.w12.ops import chosen_kernels

        # keep the bf16 logits of T=1 and 16 to compare against after the conversion
        ctx = self.args.context
        ref = {t: self.eager.step(self.step_ids(t), ctx).logits[:t].float().cpu()
               for t in (1, 16)}
        self.runner.reset()
        if self.crunner is not None:
            self.crunner.reset()
        empty_cache()
        log(f"free before W12 conversion: {free_bytes() / GiB:.1f} GiB")
        t0 = time.perf_counter()
        stats = w12.convert_model(self.model)
        w12.set_kernel(self.model, kernel)
        sync()
        empty_cache()
        conv_s = time.perf_counter() - t0
        wb = self.weight_bytes()
        self.report["w12"] = {"convert_s": round(conv_s, 2), "stats": _jsonable(stats), **wb}
        bw = self.report.get("copy", {}).get("read_plus_write_bytes_per_s")
        if bw:
            self.report["w12"]["floor_ms"] = wb["weight_bytes_excl_embedding"] / bw * 1e3
        log(f"W12 conversion in {conv_s:.1f} s; weight bytes now "
            f"{wb['weight_bytes_excl_embedding'] / 1e9:.2f} GB; stats {stats}")
        self.runner.reset()
        cmp = {}
        for t in (1, 16):
            got = self.runner.step(self.step_ids(t), ctx).logits[:t].float().cpu()
            cmp[t] = {"max_abs_vs_bf16": (got - ref[t]).abs().max().item(),
                      "identical_to_bf16": bool(torch.equal(got, ref[t])),
                      "argmax_equal": bool(torch.equal(got.argmax(-1), ref[t].argmax(-1)))}
        self.report["w12"]["vs_bf16"] = cmp
        log(f"W12 logits against bf16: {cmp}")
        self.tune_then_time("w12" if kernel == "gemm" else f"w12_{kernel}")
        return True

    def tune_then_time(self, tag: str):
        """Eager steps at every timed T first, so each W12 shape is autotuned outside a
        capture (a shape first met inside one runs its default configuration), then
        re-capture, check and time."""
        t0 = time.perf_counter()
        for t in self.args.ts:
            self.eager.step(self.step_ids(t), self.args.context)
        sync()
        self.report.setdefault("tune_s", {})[tag] = round(time.perf_counter() - t0, 1)
        log(f"[{tag}] eager warm-up/tuning at T={self.args.ts}: "
            f"{time.perf_counter() - t0:.1f} s")
        self.runner.reset()
        self.check(tag)
        self.time_steps(tag)
        if self.crunner is not None and self.args.w12_compiled:  # W12 as a custom op
            self.crunner.reset()
            self.part(f"{tag} compiled", lambda: self.compiled(f"{tag}_compiled"))
            if "gemv" in tag:
                self.record_picks(f"{tag}_compiled")
            if self.args.w12_retune:  # tuned again from scratch: do the picks hold?
                self.part(f"{tag} compiled retuned", lambda: self.retuned(f"{tag}_compiled_retuned"))
                self.record_picks(f"{tag}_compiled_retuned")
            if self.crunner.fused and self.args.w12_unfused:  # groups off: module by module
                self.part(f"{tag} compiled unfused", lambda: self.rerun_compiled(
                    f"{tag}_compiled_unfused", fused=False))

    def record_picks(self, tag: str) -> None:
        """What the GEMV tuner picked per (M bucket, N, K, view), into the report."""
        from dataclasses import asdict

        from kernels.w12.gemv import _TUNED
        picks = {f"M<={k[0]} N{k[1]} K{k[2]} {k[3]}": {a: v for a, v in asdict(c).items()
                                                      if v not in (False, None)}
                 for k, c in _TUNED.items()}
        self.report.setdefault("gemv_picks", {})[tag] = picks
        for name, c in picks.items():
            log(f"[{tag}] gemv pick {name}: {c}")

    def retuned(self, tag: str):
        """The compiled W12 step again after the GEMV's tuner forgot its picks."""
        from kernels.w12 import gemv

        gemv._TUNED.clear()
        return self.rerun_compiled(tag, fused=self.crunner.fused)

    def rerun_compiled(self, tag: str, fused: bool):
        """The compiled step again with new runners that differ only in `fused`."""
        self.new_compiled_runners(self.crunner.attention, fused)
        return self.compiled(tag)

    def w12_kernel(self, kernel: str):
        """The same W12 model on another kernel: gemv (kernels/w12/gemv.py, split-K) or
        auto (the faster of the two per shape and row bucket, as the engine runs it)."""
        import stock.w12_linear as w12
        from kernels.w12.ops import chosen_kernels

        changed = w12.set_kernel(self.model, kernel)
        log(f"W12 kernel -> {kernel} on {changed} linears")
        self.tune_then_time(f"w12_{kernel}")
        if kernel == "auto":
            self.report["w12_auto_choice"] = {"x".join(map(str, k[:3])) + f" {k[3]}": v
                                              for k, v in chosen_kernels().items()}
            log(f"auto picked: {self.report['w12_auto_choice']}")

    def profile(self, tag: str, t: int = 1, steps: int = 3,
                runner: GraphRunner | None = None) -> dict:
        """GPU time of one step by kernel (torch.profiler over `steps` eager static steps):
        totals per category (gemm, attention, other), launches per step, the top kernels.
        Their sum is the step's busy time; the graph step's time minus it is idle time."""
        runner = runner or self.eager
        ctx, ids = self.args.context, self.step_ids(t)
        return self.profile_fn(tag, t, lambda: runner.step(ids, ctx), steps)

    def profile_graphs(self, budgets: list[int], steps: int = 5) -> dict:
        """--profile-graphs: the kernels inside the last compiled runner's graph replays
        (CUPTI sees a graph's kernels), chain steps of T = 16 and 32 beside tree steps of
        each budget: where a tree step's extra time goes, launch by launch."""
        r = self.crunner or self.runner
        ctx, out = self.args.context, {}
        for t in (16, 32):
            s = r.slot(r.bucket(t), r.kv_bucket(ctx + t))
            r.load(s, self.step_ids(t), ctx)
            out[f"chain_T{t}"] = self.profile_fn(f"graph_chain_T{t}", t,
                                                 lambda s=s: r.launch(s), steps, 24)
        for b, (s, _tree) in self.tree_slots(budgets).items():
            out[f"tree_{b}"] = self.profile_fn(f"graph_tree_{b}", b,
                                               lambda s=s: r.launch(s), steps, 24)
        return out

    def profile_fn(self, tag: str, t: int, fn, steps: int = 3, top: int = 14) -> dict:
        from torch.profiler import ProfilerActivity, profile

        fn()
        sync()
        act = ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU  # CPU: smoke
        with profile(activities=[act]) as prof:
            for _ in range(steps):
                fn()
            sync()
        kern = {}
        for e in prof.key_averages():
            us = getattr(e, "device_time_total", None)
            if us is None:
                us = getattr(e, "cuda_time_total", 0.0)
            if DEV != "cuda":
                us = e.self_cpu_time_total
            if us and e.key not in kern:
                kern[e.key] = (us / steps, e.count / steps)
        cats = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
        launches = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
        for name, (us, n) in kern.items():
            low = name.lower()
            c = ("gemm" if any(w in low for w in ("gemm", "gemv", "cutlass", "nvjet", "xmma",
                                                  "cublas", "w12", "splitk"))
                 else "attention" if any(w in low for w in ("flash", "fmha", "attention",
                                                            "sdpa", "softmax"))
                 else "other")
            cats[c] += us
            launches[c] += n
        top = sorted(kern.items(), key=lambda kv: -kv[1][0])[:top]
        res = {"T": t, "busy_ms": sum(cats.values()) / 1e3,
               "ms_by_category": {k: v / 1e3 for k, v in cats.items()},
               "launches_by_category": launches,
               "top": [{"kernel": k[:90], "us": round(v[0], 1), "per_step": v[1]}
                       for k, v in top]}
        self.report.setdefault("profile", {})[tag] = res
        log(f"[{tag}] profile T={t}: busy {res['busy_ms']:.3f} ms; by category (ms) "
            + ", ".join(f"{k} {v / 1e3:.3f} ({launches[k]:.0f} launches)"
                        for k, v in cats.items()))
        for row in res["top"]:
            log(f"    {row['us']:9.1f} us  x{row['per_step']:6.1f}  {row['kernel']}")
        return res

    # -- table ---------------------------------------------------------------------------------
    def table(self):
        """Notes (device, floors, compile times, checks), then one table: every timed step, one
        row per (step, T): median ms, p10-p90, this T over the same step's T = 1, over the
        bf16 weight-bytes floor; "bf16 base / this": the bf16 graph step of the same layers
        (eager or compiled; for the compiled bf16 step, the eager one; for the dynamic
        forward, the graph step timed beside it) over this; and stock's default compiled
        step (fused_attn when timed, else the base compiled one) over this."""
        tim = self.report.get("timings", {})
        bw = self.report.get("copy", {}).get("read_plus_write_bytes_per_s")
        wb = self.report.get("weights", {})
        floor = (wb["weight_bytes_excl_embedding"] / bw * 1e3) if bw and wb else None
        floor_kv = ((wb["weight_bytes_excl_embedding"] + wb["kv_bytes_at_context"]) / bw * 1e3
                    if bw and wb else None)
        self.report["floor_ms"], self.report["floor_with_kv_ms"] = floor, floor_kv
        env = self.report.get("env", {})
        print(f"\n{env.get('device')}  torch {env.get('torch')}  preset {self.args.preset}  "
              f"context {self.args.context}")
        if bw and wb:
            print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write); weight bytes "
                  f"{wb['weight_bytes_excl_embedding'] / 1e9:.2f} GB (embedding table "
                  f"{wb['embedding_bytes_excluded'] / 1e9:.2f} GB excluded, lm_head included); "
                  f"floor {floor:.3f} ms ({floor_kv:.3f} ms with the KV cache read)")
        wq = self.report.get("w12", {})
        if "floor_ms" in wq:
            print(f"W12: weight bytes {wq['weight_bytes_excl_embedding'] / 1e9:.2f} GB, floor "
                  f"{wq['floor_ms']:.3f} ms")
        for tag, per_t in self.report.get("compile_s", {}).items():
            print(f"{tag}: compile + capture per T (s): "
                  + ", ".join(f"T={t} {v['compile_and_capture_s']} ({v['graphs']} graphs)"
                              for t, v in per_t.items()))
        for tag, per_t in self.report.get("checks_compiled", {}).items():
            print(f"{tag} vs eager static forward: "
                  + "; ".join(f"T={t} max|diff| {v['max_abs_compiled_vs_eager']:.3g}, rel "
                              f"{v['rel_compiled_vs_eager']:.3g}, argmax agree "
                              f"{v['argmax_agree']:.3f}" for t, v in per_t.items()))
        fb = {k: v for k, v in self.report.get("compile_fallbacks", {}).items() if v}
        if fb:
            print(f"COMPILED REGIONS THAT FELL BACK TO EAGER: {fb}")
        variants = self.report.get("variants", {})

        def compiled(tag: str) -> bool:
            return (tag == "bf16_compiled" or tag in variants
                    or tag.endswith(("_compiled", "_compiled_unfused", "_compiled_retuned")))

        default = "fused_attn" if "fused_attn" in tim else "bf16_compiled"
        rows, cells = [], []
        for tag, res in tim.items():
            # the bf16 step of the same layers; for the compiled bf16 step itself, the eager one
            base = ("bf16_compiled" if compiled(tag) and tag != "bf16_compiled"
                    and "bf16_compiled" in tim else "bf16")
            keys = (["ar_eager"] if "ar_eager" in res else []) + sorted(
                (k for k in res if k.startswith("graph_T")), key=lambda k: int(k[7:]))
            for key in keys:
                r = res[key]
                t = 1 if key == "ar_eager" else int(key[len("graph_T"):])
                one = res.get("graph_T1", {}).get("median_ms")
                ms = r["median_ms"]
                if key == "ar_eager":  # the dynamic forward: against this tag's graph step
                    name = "bf16 AR step, dynamic forward (no graph, eager layers)"
                    b = one
                    d = tim.get(default, {}).get("graph_T1", {}).get("median_ms")
                else:
                    name = f"{tag} ({'compiled' if compiled(tag) else 'eager'} layers)"
                    b = (tim.get(base, {}).get(key, {}).get("median_ms")
                         if tag != base else None)
                    d = (tim.get(default, {}).get(key, {}).get("median_ms")
                         if compiled(tag) else None)
                row = {"step": name, "tag": tag, "T": t, "ms": ms, "p10": r["p10_ms"],
                       "p90": r["p90_ms"],
                       "x_T1": ms / one if one and key != "ar_eager" else None,
                       "x_floor": ms / floor if floor else None,
                       "bf16_over_this": b / ms if b else None,
                       "default_over_this": d / ms if d else None}
                rows.append(row)
                cells.append([name, t, f"{ms:.3f}", f"{r['p10_ms']:.3f}-{r['p90_ms']:.3f}",
                              _f(row["x_T1"]), _f(row["x_floor"]), _f(row["bf16_over_this"]),
                              _f(row["default_over_this"])])
        self.report["table"] = rows
        cols = ["step", "T", "median ms", "p10-p90 ms", "x its T=1", "x floor",
                "bf16 base / this", f"{default} / this"]
        if default not in tim:  # no compiled step timed: no default column
            cols, cells = cols[:-1], [c[:-1] for c in cells]
        print_table(cols, cells)
        if self.report["errors"]:
            print(f"errors: {self.report['errors']}")


def _f(x) -> str:
    return "" if x is None else f"{x:.3f}"


# --variants: name -> (fuse_projections, attention_kernel)
VARIANTS = {"attn": (False, "triton"), "fused_attn": (True, "triton"), "fused": (True, "sdpa")}


def _jsonable(obj):
    try:
        json.dumps(obj)
        return obj
    except TypeError:
        return repr(obj)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="dense-27b", choices=sorted(PRESETS))
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--ts", default="1,8,16,32,64")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--copy-gib", type=float, default=1.0)
    ap.add_argument("--w12", action="store_true", help="also time stock.w12_linear")
    ap.add_argument("--w12-kernels", default="gemm,gemv,auto",
                    help="W12 kernels to time with --w12, in order (gemm, gemv, auto)")
    ap.add_argument("--profile", action="store_true",
                    help="GPU time by kernel of eager T=1 and 16 steps (bf16, and the last "
                         "W12 kernel with --w12)")
    ap.add_argument("--profile-graphs", action="store_true",
                    help="with --trees: kernels inside chain and tree graph replays")
    ap.add_argument("--compile", choices=("both", "on", "off"), default="both",
                    help="static steps with compiled layers (option compile), eager, or both "
                         "side by side")
    ap.add_argument("--w12-compiled", action="store_true",
                    help="with --w12 and --compile on|both: time each W12 kernel compiled too")
    ap.add_argument("--w12-unfused", action="store_true",
                    help="with --w12-compiled after a fused variant: also time W12 compiled "
                         "with its q/k/v and gate/up groups off (one GEMV per module)")
    ap.add_argument("--w12-retune", action="store_true",
                    help="with --w12-compiled: tune the GEMV again from scratch and time it again")
    ap.add_argument("--w12-extra", default="",
                    help="M=CONFIGS: add candidates to a GEMV bucket before tuning, e.g. "
                         "'1=4,16' offers the tensor-core candidates of buckets 4 and 16 at M = 1")
    ap.add_argument("--variants", default="",
                    help="with --compile on|both: compiled variants to time after the base, in "
                         f"order ({', '.join(VARIANTS)})")
    ap.add_argument("--trees", default="",
                    help="budgets of tree verify steps to time (entry tree-verify applied)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the script's logic on CPU in fp32 (use a tiny --preset)")
    ap.add_argument("--smoke", action="store_true",
                    help="--cpu-smoke on tiny-qwen3, context 64, T = 1 and 16, 3 iterations, "
                         "a 16 MiB copy, eager layers, W12 (CPU decode) with the gemv kernel")
    args = ap.parse_args()
    if args.smoke:
        args.cpu_smoke, args.preset, args.context, args.ts, args.iters = (
            True, "tiny-qwen3", 64, "1,16", 3)
        args.copy_gib, args.compile, args.w12, args.w12_kernels = 1 / 64, "off", True, "gemv"
    args.ts = [int(t) for t in args.ts.split(",")]
    global DEV, DTYPE
    if args.cpu_smoke:
        DEV, DTYPE = "cpu", torch.float32
    elif not torch.cuda.is_available():
        sys.exit("step_27b: needs a CUDA device (or --smoke)")
    for spec in filter(None, args.w12_extra.split(";")):
        from kernels.w12 import gemv
        m, _, srcs = spec.partition("=")
        extra = tuple(c for b in srcs.split(",") for c in gemv.CONFIGS[int(b)])
        gemv.CONFIGS[int(m)] = tuple(dict.fromkeys(gemv.CONFIGS[int(m)] + extra))
    b = Bench(args)
    b.part("env", b.env)
    b.part("bandwidth", b.bandwidth)
    if b.part("build", b.build) is None and b.model is None:
        b.table()
        return _write(b)
    b.report["weights"] = b.weight_bytes()
    if b.part("cache", b.setup_cache) is not None or b.runner is not None:
        b.part("check bf16", lambda: b.check("bf16"))
        if args.compile != "on":
            b.part("time bf16", lambda: b.time_steps("bf16"))
        if args.compile != "off":
            b.part("compiled bf16", lambda: b.compiled("bf16_compiled"))
        for v in [v for v in args.variants.split(",") if v and args.compile != "off"]:
            fuse, attention = VARIANTS[v]
            b.part(f"variant {v}", lambda v=v, f=fuse, a=attention: b.variant(v, f, a))
        if args.trees:
            budgets = [int(x) for x in args.trees.split(",")]
            b.part("tree steps", lambda: b.tree_steps(budgets))
        if args.profile_graphs and args.trees:
            b.part("profile graphs", lambda: b.profile_graphs(budgets))
        if args.profile:
            for t in (1, 16):
                b.part(f"profile bf16 T={t}", lambda t=t: b.profile(f"bf16_T{t}", t))
                if b.ceager is not None:
                    b.part(f"profile compiled T={t}",
                           lambda t=t: b.profile(f"bf16_compiled_T{t}", t, runner=b.ceager))
        kernels = [k for k in args.w12_kernels.split(",") if k]
        if args.w12 and b.part("w12", lambda: b.w12(kernels[0])) is not None:
            for k in kernels[1:]:
                b.part(f"w12 {k}", lambda k=k: b.w12_kernel(k))
            if args.profile:
                for t in (1, 16):
                    b.part(f"profile w12 T={t}",
                           lambda t=t: b.profile(f"w12_{kernels[-1]}_T{t}", t))
    b.table()
    _write(b)


def _write(b: Bench) -> None:
    out = Path(b.args.out)
    out.mkdir(parents=True, exist_ok=True)
    b.report["total_s"] = round(time.perf_counter() - T0, 1)
    (out / "step_27b.json").write_text(json.dumps(b.report, indent=1, default=str))
    log(f"wrote {out / 'step_27b.json'}")


if __name__ == "__main__":
    main()
