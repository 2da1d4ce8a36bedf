"""The split-KV attention kernels (and the device tree build) compile for Hopper (sm_90)
through Triton's own compiler, with no GPU: the interpreter runs a kernel's Python as
Python and accepts code the compiler refuses (2026-12-03: a loop-carried name reused with
another type passed every CPU test and failed every GPU one; 2026-12-04: a plain global in
the tree build). Each variant the engine launches (a chain step, a tree step, a batched
step, a batched tree step; bf16, head dims 64 and 128; the tree build at T 16-64) goes
through the whole pipeline to a cubin, in a child process without TRITON_INTERPRET (other
test modules set it, and the interpreter replaces @triton.jit at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.attention import decode as D

def compile_(fn, types, const):
    sig = dict(types)
    sig.update({k: "constexpr" for k in const})
    try:
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                           target=GPUTarget("cuda", 90, 32))
        return "cubin" if k.asm.get("cubin") else "no cubin"
    except Exception as e:   # the compiler's message, first lines
        return f"{type(e).__name__}: " + " | ".join(str(e).splitlines()[-3:])

ints = lambda *names: {n: "i32" for n in names}
partial = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "pos_ptr": "*i64",
           "tree_ptr": "*i64", "row_ptr": "*i64", "m_ptr": "*fp32", "l_ptr": "*fp32",
           "acc_ptr": "*fp32", **ints("R", "T", "HKV", "kv_len", "chunk", "splits",
                                        "row_blocks", "tree_chunks"), "scale": "fp32",
           **ints("sq_b", "sq_h", "sq_g", "sq_t", "sk_b", "sk_h", "sk_s", "sv_b", "sv_h", "sv_s")}
combine = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "o_ptr": "*bf16",
           "tree_ptr": "*i64", **ints("R", "T", "HKV", "chunk", "splits"),
           **ints(*(n for n in D._combine.arg_names if n.startswith("so_")))}   # its strides
out = {}
# an entry may widen a kernel (batch-tree-verify: _combine's ROWS, _tree_build's strides):
# the variants follow the kernels' own parameters
combine_rows = "ROWS" in D._combine.arg_names
for d in (64, 128):
    for tree, rows in ((False, False), (True, False), (False, True), (True, True)):
        out[f"_partial D={d} TREE={tree} ROWS={rows}"] = compile_(
            D._partial, partial, dict(D=d, BLOCK_R=D.BLOCK_R, BLOCK_N=D.BLOCK_N, TREE=tree,
                                      ROWS=rows))
        if rows and not combine_rows:
            continue
        out[f"_combine D={d} TREE={tree} ROWS={rows}"] = compile_(
            D._combine, combine, dict(D=d, BLOCK_R=D.BLOCK_R, TREE=tree,
                                      **({"ROWS": rows} if combine_rows else {})))
from kernels.tree_build import build as B
tree = {"lat_ptr": "*fp64", "ctl_ptr": "*i64", "out_ptr": "*i64", "scr_ptr": "*i64",
        **ints(*(n for n in ("ctl_stride", "scr_stride") if n in B._tree_build.arg_names))}
for t in (16, 32, 64):   # the block drafter's lattice: 16 positions, top 4
    dt = triton.next_power_of_2(16 * t)
    out[f"_tree_build T={t}"] = compile_(B._tree_build, tree,
                                         dict(D=16, K=4, KP=4, T=t, DT=dt, SB=max(4 * t, dt)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=600)
    if run.returncode != 0 and "GPUTarget" in run.stderr:
        pytest.skip(f"this Triton has no GPUTarget: {run.stderr.splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_every_attention_variant_compiles_to_a_hopper_cubin(compiled):
    assert len(compiled) >= 15   # 8 _partial, 4 _combine (8 where it takes ROWS), 3 builds
    bad = {k: v for k, v in compiled.items() if v != "cubin"}
    assert not bad, bad
