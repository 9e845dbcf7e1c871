"""Backends, one module per array library. Imported lazily: a machine may have only one."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

from app.engine.backends.base import ModelBackend

BACKENDS = ("mlx", "torch")
# every precision a target may be loaded at on some backend (each backend checks its own)
PRECISIONS = ("auto", "float32", "bfloat16", "float16", "int4", "int4-bf16-head", "int4-head", "gguf")


def available_backends() -> list[str]:
    found = []
    if importlib.util.find_spec("mlx") and importlib.util.find_spec("mlx_lm"):
        found.append("mlx")
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        found.append("torch")
    return found


def default_backend() -> str:
    """MLX on Apple Silicon (Metal, unified memory); PyTorch everywhere else."""
    found = available_backends()
    apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
    if apple_silicon and "mlx" in found:
        return "mlx"
    if "torch" in found:
        return "torch"
    if found:
        return found[0]
    raise RuntimeError("Neither PyTorch nor MLX is installed; reinstall Tandem.")


def load_backend(folder: str | Path, backend: str | None = None, **options) -> ModelBackend:
    backend = backend or default_backend()
    if backend == "torch":
        from app.engine.backends.torch_backend import TorchBackend

        return TorchBackend(Path(folder), **options)
    if backend == "mlx":
        from app.engine.backends.mlx_backend import MLXBackend

        return MLXBackend(Path(folder), **options)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
