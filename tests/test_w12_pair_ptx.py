"""The GEMV's inline-PTX pair decode (kernels/w12/gemv.py `_pair_asm`), run on the CPU by a
small emulator of the six PTX instructions it uses, against the format's own decoder.

The interpreter cannot run inline assembly, so the CUDA path's byte-permute selectors and
lop3 truth tables are checked here, bit for bit, and on the GPU by tests/gpu/test_gpu_w12.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels.w12.gemv builds its kernels

import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.w12 import decode, encode  # noqa: E402
from kernels.w12.gemv import _pair_asm  # noqa: E402
from w12_weights import adversarial, gaussian  # noqa: E402

MASK = 0xFFFFFFFF


def _prmt(a: int, b: int, sel: int) -> int:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:  # sign-replicate mode
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def run_ptx(asm: str, operands: dict[int, int]) -> dict[int, int]:
    """Executes `asm` (the subset _pair_asm emits) on 32-bit values; returns every $k."""
    regs: dict[str, int] = {f"${k}": v & MASK for k, v in operands.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & MASK

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [t.strip() for t in args.split(",")]
        v = [val(t) for t in src]
        if op == "prmt.b32":
            r = _prmt(*v)
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "shr.u32":
            r = v[0] >> v[1]
        elif op in ("add.u32", "mul.lo.u32"):
            r = (v[0] + v[1]) if op == "add.u32" else (v[0] * v[1])
        elif op == "lop3.b32":
            r = _lop3(*v)
        else:
            raise AssertionError(f"instruction the emulator does not know: {op}")
        regs[dst] = r & MASK
    return regs


def test_emulator_knows_the_ptx_semantics():
    assert _prmt(0x44332211, 0x88776655, 0x1404) == 0x22551155  # selector 4: b's byte 0
    assert _prmt(0x44332211, 0, 0x3424) == 0x44003300
    assert _prmt(0x000000F0, 0, 0x4448) == 0x000000FF  # sign replicate of byte 0
    assert _lop3(0xF0F0, 0xCCCC, 0xAAAA, 0xE4) == (0xF0F0 & 0xAAAA) | (0xCCCC & ~0xAAAA & 0xFFFF)
    assert _lop3(0xF0F0, 0xCCCC, 0xAAAA, 0xF8) == 0xF0F0 | (0xCCCC & 0xAAAA)
    assert set(re.findall(r"^([a-z][a-z0-9.]+) ", _pair_asm(True), re.M)) == {
        "prmt.b32", "and.b32", "shr.u32", "add.u32", "mul.lo.u32", "lop3.b32"}


@pytest.mark.parametrize("use_lo", [True, False])
@pytest.mark.parametrize("weights", ["gaussian", "adversarial"])
def test_pair_asm_decodes_every_weight(use_lo, weights):
    w = gaussian(24, 64, seed=3) if weights == "gaussian" else adversarial(24, 64)
    t = encode(w)
    bits = decode(t).view(torch.int16).to(torch.int32) & 0xFFFF
    if not use_lo:  # the nested 8-bit view: the low mantissa nibble reads as 0
        bits = bits & ~0xF
    exc = torch.zeros(bits.numel(), dtype=torch.bool)
    exc[t.exc_idx.long()] = True
    exc = exc.view(bits.shape)
    hi, lo, base = t.hi.tolist(), t.lo.tolist(), t.base.tolist()
    asm = _pair_asm(use_lo)
    checked = 0
    for n in range(t.shape[0]):
        b72 = (base[n] << 7) | (base[n] << 23)
        for j0 in range(0, t.shape[1] // 2, 4):  # four pairs per asm call, as pack=4
            h = [hi[n][2 * j] | hi[n][2 * j + 1] << 8 for j in range(j0, j0 + 4)]
            ops = {4: h[0] | h[1] << 16, 5: h[2] | h[3] << 16,
                   6: sum(lo[n][j0 + i] << (8 * i) for i in range(4)),
                   **{7 + i: b72 for i in range(4)}}
            out = run_ptx(asm, ops)
            for i in range(4):
                k = 2 * (j0 + i)
                for half, kk in ((0, k), (1, k + 1)):
                    got = (out[f"${i}"] >> (16 * half)) & 0xFFFF
                    if exc[n, kk]:  # an exception's slot decodes to w0 = 2**(b-127)
                        assert got == base[n] << 7
                    else:
                        assert got == int(bits[n, kk]), (n, kk, hex(got), hex(int(bits[n, kk])))
                    checked += 1
    assert checked == t.shape[0] * t.shape[1]
