"""Compile the W12 kernels for sm_90 on a machine without a GPU and print what ptxas made
of them: registers, stack (spills), shared memory, and global-load widths in the SASS.

    python bench/w12_sass.py                 # the first GEMM's default and both GEMV buckets
    python bench/w12_sass.py --gemv-all      # every GEMV configuration

Uses triton.compile with GPUTarget("cuda", 90, 32) and the cuobjdump in Triton's wheel;
integer arguments and pointers are marked divisible by 16, as Triton specialises them for
the benchmark shapes. This Triton may differ from the H200's (3.6): read the output as a
lead, and confirm on the GPU (TRITON_KERNEL_DUMP / cuobjdump there).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if "kernels" not in sys.modules and not any(Path(p, "kernels").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile90(fn, sig: dict, const: dict, div16, num_warps: int, num_stages: int) -> dict:
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div16}
    t0 = time.perf_counter()
    c = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        Path(path).write_bytes(c.asm["cubin"])
        res = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", path],
                             capture_output=True, text=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "--dump-sass", path],
                              capture_output=True, text=True).stdout
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, res)) else None  # noqa: E731
    loads = collections.Counter(re.findall(r"LDG\.E[.\w]*", sass))
    return {"compile_s": round(time.perf_counter() - t0, 1), "regs": num(r"REG:(\d+)"),
            "loop_instr": main_loop(sass),
            "stack": num(r"STACK:(\d+)"), "shared": c.metadata.shared,
            "loads": dict(loads), "LDGSTS": sass.count("LDGSTS"), "HMMA": sass.count("HMMA"),
            "HGMMA": sass.count("HGMMA"), "BAR": sass.count("BAR.SYNC"),
            "SHFL": sass.count("SHFL")}


def main_loop(sass: str) -> int:
    """SASS instructions in the kernel's main loop: the first backward branch's span (the
    K loop comes first in both kernels; the exception loops follow it)."""
    pat = re.compile(r"^\s+/\*([0-9a-f]{4})\*/\s+(.*?);")
    ins = [(int(m.group(1), 16), m.group(2)) for m in map(pat.match, sass.splitlines()) if m]
    for addr, text in ins:
        m = re.search(r"BRA 0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            return sum(1 for a, _ in ins if int(m.group(1), 16) <= a <= addr)
    return 0


def gemm_rows(block_ms=(16,)):
    from kernels.w12 import gemm

    sig = {"x_ptr": "*bf16", "hi_ptr": "*i16", "lo_ptr": "*u8", "base_ptr": "*u8",
           "rowptr_ptr": "*i32", "eidx_ptr": "*i32", "eval_ptr": "*i16", "y_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_h": "i32",
           "stride_l": "i32", "stride_ym": "i32", "stride_ys": "i32", "k_split": "i32",
           "USE_LO": "constexpr", "F32_DOT": "constexpr", "BLOCK_M": "constexpr",
           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "BLOCK_E": "constexpr"}
    div = [n for n in sig if sig[n] != "constexpr" and n not in ("M", "k_split")]
    cfg = gemm.DEFAULT
    for bm in block_ms:
        const = {"USE_LO": True, "F32_DOT": False, "BLOCK_M": bm, "BLOCK_N": cfg.block_n,
                 "BLOCK_K": cfg.block_k, "BLOCK_E": gemm.BLOCK_E}
        yield f"gemm {cfg} BLOCK_M={bm}", compile90(gemm._w12_gemm_kernel, sig, const, div,
                                                    cfg.num_warps, cfg.num_stages)


def gemv_rows(every: bool):
    from kernels.w12 import gemv

    sig = {"x_ptr": "*i32", "hi_ptr": "*i16", "lo_ptr": "*u8", "base_ptr": "*u8",
           "rowptr_ptr": "*i32", "eidx_ptr": "*i32", "eval_ptr": "*i16", "out_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "KH": "i32", "stride_xm": "i32",
           "stride_h": "i32", "stride_l": "i32", "stride_os": "i32", "stride_om": "i32",
           "split_pairs": "i32", "USE_LO": "constexpr", "X_PAIRS": "constexpr",
           "USE_DOT": "constexpr", "DOT_BF16": "constexpr", "SWAP": "constexpr",
           "SHARED_K": "constexpr", "EVEN_K": "constexpr", "PTX": "constexpr",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
           "BLOCK_E": "constexpr", "PREFETCH_E": "constexpr"}
    div = [n for n in sig if sig[n] != "constexpr" and n != "M"]
    for b, cfgs in gemv.CONFIGS.items():
        for cfg in (cfgs if every else cfgs[:1]):
            bm = max(16, b) if cfg.dot else b
            const = {"USE_LO": True, "X_PAIRS": True, "USE_DOT": cfg.dot, "DOT_BF16": True,
                     "SWAP": cfg.dot and cfg.swap,
                     "SHARED_K": cfg.dot and cfg.swap and cfg.shared_k, "EVEN_K": True,
                     "PTX": True, "BLOCK_M": bm, "BLOCK_N": cfg.block_n,
                     "BLOCK_K": cfg.block_k, "BLOCK_E": gemv.BLOCK_E, "PREFETCH_E": bm <= 16}
            info = compile90(gemv._w12_gemv_kernel, sig, const, div, cfg.num_warps,
                             cfg.num_stages)
            # thread-instructions per weight in the K loop: warps * 32 threads * loop
            # instructions over the [BLOCK_N, BLOCK_K] weights one iteration decodes
            info["loop_per_weight"] = round(info["loop_instr"] * 32 * cfg.num_warps
                                            / (cfg.block_n * cfg.block_k), 2)
            yield f"gemv {cfg} BLOCK_M={bm}", info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemv-all", action="store_true", help="every GEMV configuration")
    ap.add_argument("--no-gemm", action="store_true", help="skip the first GEMM (slow compile)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, target sm_90", flush=True)
    rows = [] if args.no_gemm else list(gemm_rows())
    for name, info in rows:
        print(name, info, flush=True)
    for name, info in gemv_rows(args.gemv_all):
        print(name, info, flush=True)


if __name__ == "__main__":
    main()
