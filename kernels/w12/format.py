"""W12: lossless 12-bit storage of bf16 weights (encoder and decoder in plain PyTorch).

A weight matrix W [N, K] (N output channels, K inputs, nn.Linear layout) is stored as:

- ``base``  uint8 [N]: per output channel a base exponent b in 1..239, chosen so that the
  16-value window of bf16 exponent fields [b, b+15] holds the most weights of the row
  (ties go to the highest b, so the largest weights stay in the window).
- a 12-bit code per weight: ``sign(1) | exponent offset e-b (4) | mantissa (7)``, stored in
  two planes:
  - ``hi`` uint8 [N, Kp]: the top 8 bits, ``sign | offset | mantissa[6:4]`` (sign in bit 7).
    Read alone it is the *nested 8-bit view*: the weight with its low 4 mantissa bits zeroed.
  - ``lo`` uint8 [N, Kp/2]: the low 4 mantissa bits, two weights per byte; weight k sits in
    byte k//2, in the low nibble when k is even and the high nibble when k is odd.
  Kp is K rounded up to even; a padded column holds code 0.
- exceptions: ``exc_idx`` (int32, or int64 when N*K >= 2**31) flat indices n*K + k (the
  original K), ascending, and ``exc_val`` int16: the raw bf16 bits of each exception.

Every code is a value: code c of row n decodes to the bf16 bits
``(c >> 11) << 15 | (b + ((c >> 7) & 15)) << 7 | (c & 127)`` (so the window holds only
normal numbers: b >= 1 and b + 15 <= 254). A weight is an exception when its exponent field
is outside [b, b+15]; that includes every +-0.0, subnormal, +-inf and NaN (the window never
covers exponent fields 0 or 255). An exception's slot in the planes holds code 0, which
decodes to w0 = +2**(b-127) (bits b << 7); `decode` writes the raw bits back, so the round
trip is bit-exact for every bf16 bit pattern, and a GEMM that multiplies by the planes adds
x[:, k] * w_exc - x[:, k] * w0 for each exception (see kernels/w12/reference.py).

The code is vectorised torch and device-agnostic: on a CUDA tensor the same functions are
the fast GPU encoder/decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

WINDOW = 16          # exponent values per window (4-bit offset)
MIN_BASE = 1                # exponent field 0: zeros and subnormals
MAX_BASE = 255 - WINDOW    # exponent field 255: inf and NaN
FORMAT = "w12"
VERSION = 1
_CHUNK = 1 << 24     # elements encoded at once (bounds the int32 temporaries)


class W12Error(ValueError):
    pass


@dataclass
class W12Tensor:
    """One encoded [N, K] bf16 matrix. All tensors live on the same device."""

    hi: torch.Tensor        # uint8 [N, Kp]
    lo: torch.Tensor        # uint8 [N, Kp // 2]
    base: torch.Tensor      # uint8 [N]
    exc_idx: torch.Tensor   # int32/int64 [E], flat n*K + k, ascending
    exc_val: torch.Tensor   # int16 [E], raw bf16 bits
    shape: tuple[int, int]  # (N, K), the original shape
    _row_ptr: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return self.hi.device

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def num_exceptions(self) -> int:
        return int(self.exc_idx.numel())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.hi, self.lo, self.base, self.exc_idx, self.exc_val))

    @property
    def bits_per_param(self) -> float:
        return 8.0 * self.nbytes / max(1, self.numel)

    @property
    def exception_rate(self) -> float:
        return self.num_exceptions / max(1, self.numel)

    def exc_rows_cols(self) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.shape[1]
        idx = self.exc_idx.long()
        return idx // k, idx % k

    def row_ptr(self) -> torch.Tensor:
        """int32 [N+1]: exceptions of row n are exc[row_ptr[n]:row_ptr[n+1]] (derived, cached)."""
        if self._row_ptr is None or self._row_ptr.device != self.device:
            rows, _ = self.exc_rows_cols()
            counts = torch.bincount(rows, minlength=self.shape[0])
            ptr = torch.zeros(self.shape[0] + 1, dtype=torch.int64, device=self.device)
            ptr[1:] = torch.cumsum(counts, 0)
            self._row_ptr = ptr.to(torch.int32)
        return self._row_ptr

    def to(self, device) -> "W12Tensor":
        return W12Tensor(self.hi.to(device), self.lo.to(device), self.base.to(device),
                         self.exc_idx.to(device), self.exc_val.to(device), self.shape)

    def decode(self) -> torch.Tensor:
        return decode(self)

    def decode_w8(self) -> torch.Tensor:
        return decode_w8(self)


def _bits(w: torch.Tensor) -> torch.Tensor:
    """Raw bf16 bits as int32 in 0..65535."""
    return w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def choose_base(bits: torch.Tensor) -> torch.Tensor:
    """int64 [N]: per row the window start b in 1..239 that holds the most weights."""
    n = bits.shape[0]
    exp = (bits >> 7) & 0xFF
    rows = torch.arange(n, dtype=torch.int64, device=bits.device).unsqueeze(1)
    counts = torch.bincount((rows * 256 + exp).view(-1), minlength=n * 256).view(n, 256)
    counts[:, 0] = 0
    counts[:, 255] = 0
    cs = torch.zeros(n, 257, dtype=torch.int64, device=bits.device)
    cs[:, 1:] = torch.cumsum(counts, 1)
    starts = torch.arange(MIN_BASE, MAX_BASE + 1, device=bits.device)
    win = cs[:, starts + WINDOW] - cs[:, starts]  # [N, 239]
    # argmax returns the first maximum; flip so ties pick the highest base
    return MAX_BASE - torch.argmax(win.flip(1), dim=1)


def _encode_rows(bits: torch.Tensor, base: torch.Tensor):
    """bits int32 [n, K] -> code int32 [n, K] (0 at exceptions), exception mask."""
    b7 = base.to(torch.int32).unsqueeze(1) << 7
    mag = (bits & 0x7FFF) - b7                   # (e - b) << 7 | m  when e >= b
    in_window = (mag >> 11) == 0                 # 0 <= e - b < 16
    code = (mag | ((bits >> 4) & 0x800)) * in_window
    return code, ~in_window


def encode(w: torch.Tensor) -> W12Tensor:
    """Encode a 2-D bf16 tensor (any device, any shape). Bit-exact with `decode`."""
    if w.dim() != 2:
        raise W12Error(f"W12 encodes 2-D weights; got shape {tuple(w.shape)}")
    if w.dtype != torch.bfloat16:
        raise W12Error(f"W12 encodes bf16 weights; got {w.dtype} (cast with .to(torch.bfloat16))")
    n, k = w.shape
    kp = k + (k % 2)
    dev = w.device
    base = torch.zeros(n, dtype=torch.uint8, device=dev)
    hi = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    lo = torch.zeros(n, kp // 2, dtype=torch.uint8, device=dev)
    idx_dtype = torch.int64 if n * k >= 2**31 else torch.int32
    exc_idx, exc_val = [], []
    rows = max(1, _CHUNK // max(1, k))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        bits = _bits(w[r0:r1])
        rbase = choose_base(bits)
        base[r0:r1] = rbase.to(torch.uint8)
        code, exc = _encode_rows(bits, rbase)
        if kp != k:
            code = torch.nn.functional.pad(code, (0, 1))
        hi[r0:r1] = (code >> 4).to(torch.uint8)
        nib = code & 0xF
        lo[r0:r1] = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)
        flat = torch.nonzero(exc.reshape(-1)).squeeze(1)
        if flat.numel():
            exc_val.append(_to_i16(bits.reshape(-1)[flat]))
            exc_idx.append((flat + r0 * k).to(idx_dtype))
    idx = torch.cat(exc_idx) if exc_idx else torch.zeros(0, dtype=idx_dtype, device=dev)
    val = torch.cat(exc_val) if exc_val else torch.zeros(0, dtype=torch.int16, device=dev)
    return W12Tensor(hi, lo, base, idx, val, (n, k))


def codes(t: W12Tensor) -> torch.Tensor:
    """int32 [N, Kp]: the 12-bit codes of both planes (0 at exceptions and padding)."""
    lo = t.lo.to(torch.int32)
    nib = torch.stack((lo & 0xF, lo >> 4), dim=2).reshape(t.hi.shape)
    return (t.hi.to(torch.int32) << 4) | nib


def code_to_bits(code: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Decode 12-bit codes [N, K] (int32) with per-row base [N] to bf16 bits (int32)."""
    b7 = base.to(torch.int32).unsqueeze(1) << 7
    return ((code & 0x7FF) + b7) | ((code & 0x800) << 4)


def _to_i16(bits: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns 0..65535 -> int16 with the same 16 bits (no reliance on wrapping)."""
    return ((bits & 0xFFFF) - ((bits & 0x8000) << 1)).to(torch.int16)


def _to_bf16(bits: torch.Tensor) -> torch.Tensor:
    return _to_i16(bits).view(torch.bfloat16)


def _finish(t: W12Tensor, code: torch.Tensor) -> torch.Tensor:
    n, k = t.shape
    bits = code_to_bits(code[:, :k], t.base)
    w = _to_bf16(bits).clone()
    if t.num_exceptions:
        w.view(-1).view(torch.int16)[t.exc_idx.long()] = t.exc_val
    return w


def decode(t: W12Tensor) -> torch.Tensor:
    """bf16 [N, K], bit-identical to the encoded tensor."""
    return _finish(t, codes(t))


def decode_w8(t: W12Tensor) -> torch.Tensor:
    """The nested 8-bit view as bf16 [N, K]: what the 8-bit GEMM multiplies by.

    Each in-window weight is its bf16 bits with the low 4 mantissa bits zeroed (``bits &
    0xFFF0``: truncated toward zero); exceptions keep their exact values, as in the GEMM.
    """
    return _finish(t, t.hi.to(torch.int32) << 4)
