"""Hugging Face folder -> MLX folder, through mlx-lm's own converter (MLX side)."""

from __future__ import annotations

from pathlib import Path

from mlx_lm import convert


def hf_to_mlx_folder(hf_dir: Path, out_dir: Path, bits: int | None = None, group_size: int = 32) -> Path:
    """Full precision (float32) when `bits` is None; otherwise MLX affine quantization.

    Group size 32 matches GGUF's Q4_0/Q4_1 blocks, so a 4-bit GGUF re-packs onto the same grid.
    """
    convert(
        hf_path=str(hf_dir),
        mlx_path=str(out_dir),
        quantize=bits is not None,
        q_bits=bits or 4,
        q_group_size=group_size,
        dtype="float32",
    )
    return out_dir
