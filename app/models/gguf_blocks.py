"""GGUF's 4-bit blocks as int4 affine groups of 32, without going through floats.

Every 4-bit GGUF type stores, per 32 weights, 4-bit codes q in 0..15 with one scale and one
offset, which is exactly the grid of PyTorch's int4 weight-only kernels (tinygemm):
w = (q - 8) * scale + zero. The mapping (ggml-quants.c's dequantize_row_* read backwards):

- Q4_0, 32 weights: fp16 d, then 16 bytes; w = d * (q - 8)         -> scale d, zero 0
- Q4_1, 32 weights: fp16 d, fp16 m, then 16 bytes; w = d * q + m   -> scale d, zero m + 8 d
- Q4_K, 256 weights in 8 groups of 32: fp16 d, fp16 dmin, 12 bytes of 6-bit group scales sc and
  mins mn, then 128 bytes; w = d sc q - dmin mn                    -> scale d sc, zero 8 d sc - dmin mn

In Q4_0/Q4_1 byte j of a block holds weight j (low nibble) and weight j + 16 (high nibble); in
Q4_K byte j of each 32-byte chunk c holds weight 64 c + j (low) and 64 c + 32 + j (high).
The codes come out as uint8 in 0..15, one per weight; the scales in float32, computed from the
fp16 fields exactly as gguf's own dequantization computes them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

GROUP = 32  # weights per scale in every type here
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")


class Int4Groups(NamedTuple):
    codes: np.ndarray  # (rows, cols) uint8 in 0..15
    scale: np.ndarray  # (rows, cols // 32) float32
    zero: np.ndarray  # (rows, cols // 32) float32: w = (codes - 8) * scale + zero

    def dequantize(self) -> np.ndarray:
        rows, cols = self.codes.shape
        q = self.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32) - 8.0
        return (q * self.scale[..., None] + self.zero[..., None]).reshape(rows, cols)


def _f16(field: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(field).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16 or 32 bytes) -> (..., 2, bytes): low nibbles first, then high ones."""
    return np.stack([qs & 0x0F, qs >> 4], axis=-2)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks[:, 0:2])
    codes = _nibbles(blocks[:, 2:18]).reshape(-1, GROUP)
    return codes, d, np.zeros_like(d)


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, m = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    codes = _nibbles(blocks[:, 4:20]).reshape(-1, GROUP)
    return codes, d, m + 8.0 * d


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (gguf.quants.Q4_K.get_scale_min)."""
    s = packed.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _k_scales(blocks[:, 4:16])
    scale = (d[:, None] * sc).reshape(-1)
    offset = (dmin[:, None] * mn).reshape(-1)
    codes = _nibbles(blocks[:, 16:144].reshape(-1, 4, 32)).reshape(-1, GROUP)
    return codes, scale, 8.0 * scale - offset


_DECODERS = {"Q4_0": (_q4_0, 32, 18), "Q4_1": (_q4_1, 32, 20), "Q4_K": (_q4_k, 256, 144)}


def int4_groups(kind: str, raw: np.ndarray, rows: int, cols: int) -> Int4Groups:
    """A 4-bit GGUF tensor's bytes (as GGUFReader maps them) -> codes, scales and offsets of a
    (rows, cols) weight, rows = output features. Raises ValueError for another type or shape."""
    if kind not in _DECODERS:
        raise ValueError(f"{kind} is not a 4-bit GGUF type this reads ({', '.join(INT4_TYPES)})")
    decode, weights_per_block, block_bytes = _DECODERS[kind]
    if cols % weights_per_block:
        raise ValueError(f"a {kind} row of {cols} weights is not whole blocks of {weights_per_block}")
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, block_bytes)
    if blocks.shape[0] != rows * cols // weights_per_block:
        raise ValueError(f"{kind} data holds {blocks.shape[0]} blocks, not the {rows * cols // weights_per_block} "
                         f"of a {rows}x{cols} weight")
    codes, scale, zero = decode(blocks)
    groups = cols // GROUP
    return Int4Groups(codes.reshape(rows, cols), scale.reshape(rows, groups).astype(np.float32),
                      zero.reshape(rows, groups).astype(np.float32))
