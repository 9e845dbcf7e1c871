"""Random GGUF blocks of each quantized type the CPU kernels read, for tests and benchmarks.

Every byte of a block is random except its fp16 scale fields (d, and the mins where the type has
them), which are finite normal fp16 of magnitude about 1e-3..5e-2 with a random sign, like a real
file's. The packed 6-bit/4-bit sub-block scales, the codes, Q6_K's int8 scales and IQ4_XS's
scales_h/scales_l are random bytes: any bytes there decode, so they cover every code value.
"""

from __future__ import annotations

import numpy as np

from app.models.gguf_codes import BLOCK_SIZES

# type name -> (weights per block, bytes per block), ggml's sizes.
BLOCK: dict[str, tuple[int, int]] = {**BLOCK_SIZES, "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2)}

# type name -> byte offsets in a block of its fp16 scale fields (d, dmin / m).
SCALE_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}

SCALE_RANGE = (1e-3, 5e-2)


def random_scales(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """fp16 of magnitude log-uniform in SCALE_RANGE and a random sign: finite and normal."""
    lo, hi = np.log(SCALE_RANGE[0]), np.log(SCALE_RANGE[1])
    magnitude = np.exp(rng.uniform(lo, hi, size=shape))
    sign = rng.choice(np.array([-1.0, 1.0]), size=shape)
    return (sign * magnitude).astype(np.float16)


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, cols // weights_per_block * bytes_per_block) uint8: random codes with finite, normal fp16
    scales (d in about 1e-3..5e-2, mins likewise), in the type's layout; any bytes decode (gguf-py reads them)."""
    if kind not in BLOCK:
        raise ValueError(f"no random blocks for GGUF type {kind!r}; known: {', '.join(BLOCK)}")
    per_block, block_bytes = BLOCK[kind]
    if cols % per_block:
        raise ValueError(f"{kind}: a row of {cols} weights is not whole blocks of {per_block}")
    n_blocks = rows * (cols // per_block)
    if kind in ("F32", "F16", "BF16"):
        values = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.02)
        if kind == "F16":
            values = values.astype(np.float16)
        elif kind == "BF16":
            values = (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return values.view(np.uint8).reshape(rows, cols * block_bytes)
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for at in SCALE_FIELDS[kind]:
        blocks[:, at:at + 2] = random_scales((n_blocks, 1), rng).view(np.uint8)
    return blocks.reshape(rows, cols // per_block * block_bytes)
