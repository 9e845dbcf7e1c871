"""GGUF quantized tensors as the integer codes, scales and offsets of Tandem's CPU matmul kernel.

The kernel reads, per group of G consecutive weights of a row (G = 32 or 16), one float32 scale,
optionally one float32 offset, and one small integer code per weight, and computes

    w = fl32(scale * code) + offset        (w = fl32(scale * code) where there is no offset)

in float32, in that order. This module turns the raw bytes of a GGUF tensor of each supported
type into those parameters so that the kernel's weights are bit for bit the weights gguf-py's
`gguf.quants.dequantize` produces (the reference; it follows ggml-quants.c). That holds because
every scale here is a product gguf itself rounds to float32 first (fp16 times a small integer,
which float32 holds exactly), every code is the integer gguf multiplies that scale by, and every
offset is the float32 value gguf then adds, or the negation of the one it subtracts (IEEE defines
a - b as a + (-b), so that is the same rounding). Where gguf computes d * (q - c), the code is the
signed q - c and there is no offset; Q4_0 is the one exception (see its comment).

Seven code kinds, each an inner loop of the kernel, so that codes are held at about the file's size:

- NIBBLES32: uint8 codes in 0..15, groups of 32 (Q4_0, Q4_1, Q4_K): kept packed, two a byte.
- BITS5_32: 5-bit codes, groups of 32 (Q5_0, Q5_1, Q5_K): kept as the file has them, a nibble
  plane and a plane of fifth bits (0.625 bytes a weight, not 1).
- BITS6_16: 6-bit codes, groups of 16 (Q6_K): a nibble plane and a plane of bit pairs (0.75).
- BITS2_16: 2-bit codes, groups of 16 (Q2_K): four a byte (0.25).
- BITS3_16: 3-bit codes, groups of 16 (Q3_K): a plane of bit pairs, and a plane of third bits
  that two neighbouring groups share (0.375).
- GRID32: 4-bit indices into IQ4's non-linear grid, groups of 32 (IQ4_NL, IQ4_XS): kept packed
  as NIBBLES32, each looked up in the kernel (the code is the grid's int8 value).
- BYTES32: int8 codes, groups of 32 (Q8_0).

A code is the integer gguf multiplies the scale by, signed where gguf subtracts a constant (Q5_0's
q - 16, Q6_K's q - 32, Q3_K's q - 4). The packed kinds hold such a code as the unsigned q and the kernel
subtracts BIAS_OF times the activations' integer sum, which gives the same integer dot product
(int8_tiles_numba.py).

Decoding is vectorized numpy over whole blocks (no per-block Python), and what it keeps is small:
one byte per weight plus float32 per group. Call it on row slices of a large tensor.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

NIBBLES32, BYTES32, BITS2_16, BITS5_32, BITS6_16, GRID32, BITS3_16 = 0, 1, 2, 3, 4, 5, 6
GROUP_OF = {NIBBLES32: 32, BYTES32: 32, BITS2_16: 16, BITS5_32: 32, BITS6_16: 16, GRID32: 32, BITS3_16: 16}

QK_K = 256  # weights per K-quant (and IQ4_XS) super-block

# type name -> (weights per block, bytes per block, code kind); the sizes are ggml's.
_TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (32, 18, NIBBLES32),
    "Q4_1": (32, 20, NIBBLES32),
    "Q5_0": (32, 22, BITS5_32),
    "Q5_1": (32, 24, BITS5_32),
    "Q8_0": (32, 34, BYTES32),
    "Q2_K": (QK_K, 84, BITS2_16),
    "Q3_K": (QK_K, 110, BITS3_16),
    "Q4_K": (QK_K, 144, NIBBLES32),
    "Q5_K": (QK_K, 176, BITS5_32),
    "Q6_K": (QK_K, 210, BITS6_16),
    "IQ4_NL": (32, 18, GRID32),
    "IQ4_XS": (QK_K, 136, GRID32),
}
KERNEL_TYPES: tuple[str, ...] = tuple(_TYPES)
KIND_OF: dict[str, int] = {name: kind for name, (_, _, kind) in _TYPES.items()}
# what a packed kind's stored (unsigned) code exceeds the code by, per type: the constant gguf
# subtracts (stored q, code q - 16, q - 32 or q - 4); 0 for every other type
BIAS_OF: dict[str, int] = {name: {"Q5_0": 16, "Q6_K": 32, "Q3_K": 4}.get(name, 0) for name in _TYPES}
# the types whose weights have an offset (w = scale * code + offset); the rest are w = scale * code
OFFSET_TYPES: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K")
# the types whose scales come in two levels (Factors): an fp16 per 256 weights times an integer per group
FACTORED_TYPES: tuple[str, ...] = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
BLOCK_SIZES: dict[str, tuple[int, int]] = {name: (n, size) for name, (n, size, _) in _TYPES.items()}

# IQ4_NL's and IQ4_XS's non-linear 4-bit grid (ggml's kvalues_iq4nl).
IQ4_KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


class Factors(NamedTuple):
    """A super-block type's scales as the file holds them, two levels: scale = fl32(d * sc) and
    offset = -fl32(dmin * m), d and dmin fp16 per 256 weights, sc and m small integers per group.
    The kernel keeps these (4.6 bits a Q4_K weight, where float32 products per group take 6) and
    forms the same products in float32: exact, so the same bits as `scale` and `offset`."""

    supers: np.ndarray  # (rows, cols // 256, 1 or 2) float32: d (and dmin), each an fp16 value
    smalls: np.ndarray  # (rows, groups, 1 or 2) int8: sc (and m)


class CodeGroups(NamedTuple):
    """One tensor (or row slice) as kernel parameters: w = fl32(scale * code) + offset per group."""

    kind: int
    codes: np.ndarray  # (rows, cols): uint8 for NIBBLES32, int8 otherwise (Q5_1's, Q5_K's 0..31)
    scale: np.ndarray  # (rows, cols // group) float32
    offset: np.ndarray | None  # (rows, cols // group) float32, or None where the type has no offset
    factors: Factors | None = None  # the K-quants' and IQ4_XS's two-level scales

    @property
    def group(self) -> int:
        return GROUP_OF[self.kind]

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32 by the kernel's formula: the product rounded to float32, then the offset added."""
        rows, cols = self.codes.shape
        g = self.group
        codes = self.codes.reshape(rows, cols // g, g).astype(np.float32)
        w = np.multiply(self.scale[:, :, None], codes, dtype=np.float32)
        if self.offset is not None:
            np.add(w, self.offset[:, :, None], out=w, dtype=np.float32)
        return w.reshape(rows, cols)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of each block, as float32 of shape (n_blocks,)."""
    return np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16)[:, 0].astype(np.float32)


def _shifts(x: np.ndarray, shifts: tuple[int, ...], mask: int) -> np.ndarray:
    """(x >> s) & mask for each s, stacked on a new axis before the last: (..., n) -> (..., len(shifts), n)."""
    return np.stack([(x >> np.uint8(s)) & np.uint8(mask) for s in shifts], axis=-2)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) codes: the low nibbles are weights 0..15, the high ones 16..31."""
    return _shifts(qs, (0, 4), 0x0F).reshape(qs.shape[0], 32)


def _bits(packed: np.ndarray) -> np.ndarray:
    """(n, 4) bytes read as a little-endian uint32 -> (n, 32) of its bits 0..31 as uint8."""
    return np.unpackbits(packed, axis=-1, bitorder="little")


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of packed 6-bit scales and mins -> (n, 8) each, uint8 (gguf's get_scale_min)."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes of packed 6-bit scales -> (n, 16) int8 in -32..31."""
    n = scales.shape[0]
    low = _shifts(scales[:, :8], (0, 4), 0x0F).reshape(n, 16)
    high = _shifts(scales[:, 8:], (0, 2, 4, 6), 0x03).reshape(n, 16)
    return (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)


def _times(d: np.ndarray, small: np.ndarray) -> np.ndarray:
    """fl32(d * small) with d (n,) float32 per block and small (n, k) integers: exact, fp16 times <= 8 bits."""
    return np.multiply(d[:, None], small.astype(np.float32), dtype=np.float32)


def _factors(d: np.ndarray, sc: np.ndarray, dmin: np.ndarray | None = None, m: np.ndarray | None = None):
    """Per block: (supers (n, 1 or 2) float32, smalls (n, groups, 1 or 2) int8) of Factors."""
    if dmin is None:
        return d[:, None], sc.astype(np.int8)[:, :, None]
    return np.stack([d, dmin], axis=-1), np.stack([sc.astype(np.int8), m.astype(np.int8)], axis=-1)


# Each decoder takes (n_blocks, bytes per block) uint8 and returns (codes (n_blocks, weights per block),
# scale (n_blocks, groups per block), offset or None), the scale and offset float32.

def _q4_0(b: np.ndarray):
    # gguf: d * (q - 8), q in 0..15. Kernel: NIBBLES32 code q, scale d, offset -8 d. Both d * q (<= 15 bits)
    # and 8 d are exact in float32, and so is their sum d * (q - 8), hence equal to gguf's for any finite d.
    # (An infinite d, which no quantizer writes, gives nan here where gguf gives +-inf for q != 8.)
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d[:, None], (d * np.float32(-8.0))[:, None]


def _q4_1(b: np.ndarray):
    # gguf: d * q + m, q in 0..15. Kernel: NIBBLES32 code q, scale d, offset m (the same two roundings).
    return _nibbles(b[:, 4:20]), _f16(b, 0)[:, None], _f16(b, 2)[:, None]


def _q5(b: np.ndarray, at: int) -> np.ndarray:
    """Q5_0/Q5_1's 5-bit q in 0..31 from qh (4 bytes at `at`) and qs (16 bytes after it), uint8."""
    return _nibbles(b[:, at + 4:at + 20]) | (_bits(b[:, at:at + 4]) << np.uint8(4))


def _q5_0(b: np.ndarray):
    # gguf: d * (q - 16), q in 0..31. Kernel: BITS5_32 code q - 16 (int8), scale d, no offset.
    return (_q5(b, 2).astype(np.int8) - np.int8(16)), _f16(b, 0)[:, None], None


def _q5_1(b: np.ndarray):
    # gguf: d * q + m, q in 0..31. Kernel: BITS5_32 code q (int8), scale d, offset m.
    return _q5(b, 4).astype(np.int8), _f16(b, 0)[:, None], _f16(b, 2)[:, None]


def _q8_0(b: np.ndarray):
    # gguf: x * d, x int8. Kernel: BYTES32 code x, scale d, no offset (multiplication commutes).
    return b[:, 2:34].view(np.int8), _f16(b, 0)[:, None], None


def _q2_k(b: np.ndarray):
    # gguf: fl(d * sc) * q - fl(dmin * m), sc and m the 4-bit halves of scales[g], q in 0..3.
    # Kernel: BITS2_16 code q, scale fl(d * sc), offset -fl(dmin * m) (a - b is a + (-b) in IEEE).
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    q = _shifts(qs.reshape(n, 2, 32), (0, 2, 4, 6), 0x03).reshape(n, QK_K)
    d, dmin, sc, m = _f16(b, 80), _f16(b, 82), scales & np.uint8(0x0F), scales >> np.uint8(4)
    return q.view(np.int8), _times(d, sc), -_times(dmin, m), _factors(d, sc, dmin, m)


def _q3_k(b: np.ndarray):
    # gguf: fl(d * (sc - 32)) * q, sc 6-bit, q = low 2 bits - 4 * (1 - hmask bit) in -4..3.
    # Kernel: BITS3_16 code q (int8; held as q + 4), scale fl(d * (sc - 32)), no offset.
    n = b.shape[0]
    hmask, qs = b[:, :32], b[:, 32:96]
    low = _shifts(qs.reshape(n, 2, 32), (0, 2, 4, 6), 0x03).reshape(n, QK_K)
    high = _shifts(hmask, tuple(range(8)), 0x01).reshape(n, QK_K)
    q = low.astype(np.int8) - np.int8(4) + (high << np.uint8(2)).astype(np.int8)
    d, sc = _f16(b, 108), _q3_k_scales(b[:, 96:108])
    return q, _times(d, sc), None, _factors(d, sc)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes -> (n, 256) uint8: byte j of 32-byte chunk c is weight 64 c + j (low), 64 c + 32 + j."""
    n = qs.shape[0]
    return _shifts(qs.reshape(n, 4, 32), (0, 4), 0x0F).reshape(n, QK_K)


def _q4_k(b: np.ndarray):
    # gguf: fl(d * sc) * q - fl(dmin * m), sc and m 6-bit per group of 32, q in 0..15.
    # Kernel: NIBBLES32 code q, scale fl(d * sc), offset -fl(dmin * m).
    sc, mn = _k_scale_min(b[:, 4:16])
    d, dmin = _f16(b, 0), _f16(b, 2)
    return _k_nibbles(b[:, 16:144]), _times(d, sc), -_times(dmin, mn), _factors(d, sc, dmin, mn)


def _q5_k(b: np.ndarray):
    # gguf: fl(d * sc) * q - fl(dmin * m), q in 0..31 (its 5th bit from qh). Kernel: BITS5_32 code q (int8),
    # scale fl(d * sc), offset -fl(dmin * m).
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    high = _shifts(b[:, 16:48], tuple(range(8)), 0x01).reshape(n, QK_K)
    q = _k_nibbles(b[:, 48:176]) | (high << np.uint8(4))
    d, dmin = _f16(b, 0), _f16(b, 2)
    return q.view(np.int8), _times(d, sc), -_times(dmin, mn), _factors(d, sc, dmin, mn)


def _q6_k(b: np.ndarray):
    # gguf: fl(d * sc) * (q - 32), sc int8 per group of 16, q in 0..63. Kernel: BITS6_16 code q - 32 (int8),
    # scale fl(d * sc) (exact), no offset. Not d * fl(sc * (q - 32)): that regrouping rounds differently.
    n = b.shape[0]
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    low = _shifts(ql.reshape(n, 2, 64), (0, 4), 0x0F).reshape(n, QK_K)
    high = _shifts(qh.reshape(n, 2, 32), (0, 2, 4, 6), 0x03).reshape(n, QK_K)
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    d, sc = _f16(b, 208), scales.view(np.int8)
    return q, _times(d, sc), None, _factors(d, sc)


def _iq4_nl(b: np.ndarray):
    # gguf: d * kvalues[q], q a 4-bit index. Kernel: GRID32 code kvalues[q] (int8), scale d, no offset.
    return IQ4_KVALUES[_nibbles(b[:, 2:18])], _f16(b, 0)[:, None], None


def _iq4_xs(b: np.ndarray):
    # gguf: fl(d * (ls - 32)) * kvalues[q], ls 6-bit per group of 32 (low 4 bits in scales_l, high 2 in
    # scales_h). Kernel: GRID32 code kvalues[q] (int8), scale fl(d * (ls - 32)) (exact), no offset.
    n = b.shape[0]
    low = _shifts(b[:, 4:8], (0, 4), 0x0F).transpose(0, 2, 1).reshape(n, 8)  # group 2 i + s: byte i >> 4 s
    high = _shifts(b[:, 2:4], (0, 2, 4, 6), 0x03).transpose(0, 2, 1).reshape(n, 8)  # group j: uint16 >> 2 j
    ls = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    q = _shifts(b[:, 8:136].reshape(n, 8, 16), (0, 4), 0x0F).reshape(n, QK_K)
    d = _f16(b, 0)
    return IQ4_KVALUES[q], _times(d, ls), None, _factors(d, ls)


_DECODERS = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs,
}


def code_groups(kind: str, raw: np.ndarray, rows: int, cols: int) -> CodeGroups:
    """The kernel parameters of a GGUF tensor of type `kind` (a name such as "Q4_K", or a GGMLQuantizationType).

    raw: the tensor's bytes as gguf.GGUFReader maps them (uint8, any shape whose total is
    rows * cols / weights_per_block * block_bytes; a slice of rows of it also works). Raises ValueError,
    naming the type, for an unknown type, a row that is not whole blocks, or a byte count that does not
    match the shape.
    """
    name = getattr(kind, "name", kind)
    blocks = file_rows(name, raw, rows, cols).reshape(-1, _TYPES[name][1])  # checked against the shape there
    code_kind = _TYPES[name][2]
    codes, scale, offset, *two_level = _DECODERS[name](blocks)
    groups = cols // GROUP_OF[code_kind]
    codes = np.ascontiguousarray(codes).reshape(rows, cols)
    scale = np.ascontiguousarray(scale, dtype=np.float32).reshape(rows, groups)
    if offset is not None:
        offset = np.ascontiguousarray(offset, dtype=np.float32).reshape(rows, groups)
    factors = None
    if two_level:
        supers, smalls = two_level[0]
        factors = Factors(np.ascontiguousarray(supers, dtype=np.float32).reshape(rows, cols // QK_K, -1),
                          np.ascontiguousarray(smalls, dtype=np.int8).reshape(rows, groups, -1))
    return CodeGroups(code_kind, codes, scale, offset, factors)


def file_rows(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A tensor's bytes as (rows, bytes a row) uint8, after checking them against the shape:
    ValueError, naming the type, for an unknown type, a row that is not whole blocks, or a byte
    count that does not match the shape (code_groups' checks; repack_numba reads such rows)."""
    name = getattr(kind, "name", kind)
    if name not in _TYPES:
        raise ValueError(f"GGUF type {name!r} has no CPU kernel codes; supported: {', '.join(KERNEL_TYPES)}")
    per_block, block_bytes, _ = _TYPES[name]
    if rows < 0 or cols <= 0:
        raise ValueError(f"{name}: shape {rows} x {cols} is not a tensor shape (rows >= 0, cols > 0)")
    if cols % per_block:
        raise ValueError(f"{name}: a row of {cols} weights is not whole blocks of {per_block} "
                         f"(shape {rows} x {cols})")
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    row_bytes = cols // per_block * block_bytes
    if raw.size != rows * row_bytes:
        raise ValueError(f"{name}: {raw.size} bytes do not match {rows} x {cols} weights "
                         f"({rows} rows of {row_bytes} bytes = {rows * row_bytes})")
    return raw.reshape(rows, row_bytes)
