"""Memory entry tree-verify-gdn: the Triton WY tree kernel against the plain-PyTorch
ancestor-masked form (CPU: TRITON_INTERPRET=1; CUDA: the real kernel). Runs where the entry
is applied (tests/test_entry_tests.py replays it onto stock)."""

from __future__ import annotations

import os

import pytest
import torch

# CPU only, before kernels.gdn.tree_kernel builds it: on a GPU machine the variable would
# also put every later test of the same process (fla's kernels in the captured tree steps)
# into the interpreter, as it did on the H200 on 2026-12-05
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

tree_kernel = pytest.importorskip("kernels.gdn.tree_kernel",
                                  reason="the WY tree kernel comes with tree-verify-gdn")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from kernels.gdn.tree import plan, tree_recurrent_reference, tree_wy_reference  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [   # (parents, key heads, value heads, head dim)
    ([-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 0, 10], 2, 4, 16),   # branching, GVA
    (list(range(-1, 32)), 1, 2, 32),                     # a chain 33 deep: 64 padded nodes
    ([-1] + [0] * 19, 2, 2, 16),                         # a star
    ([-1, 0], 1, 1, 16),                                 # the smallest tree
]


@pytest.mark.parametrize("kernel", ["one-pass", "two-pass"])
@pytest.mark.parametrize("parents,hk,hv,d", SHAPES)
def test_kernel_equals_the_ancestor_masked_reference_and_the_per_path_oracle(parents, hk, hv, d,
                                                                            kernel):
    gen = torch.Generator().manual_seed(len(parents))
    n = len(parents)
    q, k = (torch.randn(2, n, hk, d, generator=gen) for _ in range(2))
    v = torch.randn(2, n, hv, d, generator=gen)
    g, beta = -torch.rand(2, n, hv, generator=gen), torch.rand(2, n, hv, generator=gen)
    s0 = 0.1 * torch.randn(2, hv, d, d, generator=gen)
    args = [x.to(DEV) for x in (q, k, v, g, beta)]
    tree = plan(parents, 4, DEV)
    cfg = tree_kernel.launch_config(max(16, 1 << (n - 1).bit_length()), d, d, kernel=kernel)
    got = tree_kernel.tree_wy(*args, tree.anc8, s0.to(DEV), config=cfg).cpu()
    want = tree_wy_reference(q, k, v, g, beta, parents, s0)
    oracle = tree_recurrent_reference(q, k, v, g, beta, parents, s0)
    scale = want.abs().max()
    assert float((got - want).abs().max() / scale) <= 1e-5
    assert float((got - oracle).abs().max() / scale) <= 1e-5


def test_shapes_the_kernel_does_not_take_are_said():
    q = torch.zeros(1, 8, 1, 24)
    assert not tree_kernel.supported(q, q, 8)           # head dim 24: not a power of two
    q = torch.zeros(1, 8, 1, 16)
    assert tree_kernel.supported(q, q, 64) and not tree_kernel.supported(q, q, 65)


CHILD = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.gdn import tree_kernel as K

sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "b_ptr", "o_ptr")}
sig.update({"g_ptr": "*fp32", "anc_ptr": "*i8", "s_ptr": "*fp32", "scale": "fp32"})
sig.update({n: "i32" for n in ("N", "HV", "REP", "sq_b", "sq_n", "sq_h", "sk_b", "sk_n",
                               "sk_h", "sv_b", "sv_n", "sv_h", "sg_b", "sg_n", "sg_h",
                               "ss_b", "ss_h", "so_b", "so_n", "so_h")})
bin_ = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
ptxas = next((p for p in (os.path.join(bin_, "ptxas-blackwell"), os.path.join(bin_, "ptxas"))
              if os.path.isfile(p)), None)
out = {}
for name, np_ in [(n, p) for n in K.KERNELS for p in (16, 64)]:
    cfg = K.launch_config(np_, 128, 128, name)   # what tree_wy launches at the hybrid-27b's dims
    const = dict(DK=128, DV=128, NP=np_, LOG=(np_ - 1).bit_length(), BV=cfg["BV"], BK=cfg["BK"])
    k = triton.compile(ASTSource(fn=K.KERNELS[name], constexprs=const,
                                 signature={**sig, **{c: "constexpr" for c in const}}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"]})
    ptx = k.asm["ptx"]
    spill = None
    if ptxas:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                              capture_output=True, text=True).stderr
        found = re.findall(r"(\d+) bytes spill stores", info)
        spill = int(found[0]) if found else None
    out[f"{name}:{np_}"] = {"cubin": bool(k.asm.get("cubin")), "mma": ptx.count("mma."),
                "fma": ptx.count("fma.rn.f32"), "spill": spill}
print(json.dumps(out))
"""


def test_the_kernel_compiles_for_hopper_with_tensor_core_products():
    """At the hybrid-27b's GDN head dims (128), 16 and 64 nodes, with the tiles and warps
    tree_wy launches, through Triton's own compiler for sm_90 (no GPU): a cubin whose block
    products are tensor-core MMAs, and where Triton carries ptxas, its spills. The
    first version's IEEE fp32 dots compiled to scalar FMAs only (3040 fma.rn.f32 and no
    mma at 16 nodes), and its 64-node variant took 87.5 s to compile on a 2-core CPU."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.compiler", reason="this Triton has no GPUTarget")
    root = Path(tree_kernel.__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, text=True,
                         capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.splitlines()[-1])
    for nodes, res in got.items():
        assert res["cubin"], nodes
        assert res["mma"] > 0, f"{nodes} nodes: no tensor-core MMA in the PTX ({res})"
    # spills (ptxas -v, bytes of spill stores a thread), where Triton carries a ptxas: at
    # most a few words at 16 nodes (0 with this CPU's Triton 3.9; 8 with the H200 image's
    # 3.6); at 64 the one-pass kernel's inverse spills (2624 here, 2528 on the H200, where
    # it took 8x its 32-node time), the two-pass kernel (the default; 4 warps at 64 nodes)
    # a few hundred (408 here, 508 with the H200's Triton)
    if got["one-pass:16"]["spill"] is not None:
        assert max(got[f"{k}:16"]["spill"] for k in ("one-pass", "two-pass")) <= 32, got
        assert got["one-pass:64"]["spill"] < 3500 and got["two-pass:64"]["spill"] < 1000, got