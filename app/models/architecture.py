"""Can the chosen backend run this architecture? Asked of the config before any weights load,
so an unsupported model is refused in words instead of failing deep inside a loader."""

from __future__ import annotations

from app.models.errors import ModelFileError

POPULAR = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "smollm3")
# families every transformers Tandem runs with has (the lean step covers them: lean_step_torch.FAMILIES)
TRANSFORMERS_CORE = ("llama", "mistral", "qwen2", "qwen3")
BACKEND_NAMES = {"torch": "PyTorch backend (transformers)", "mlx": "MLX backend (mlx-lm)"}


def supported_types(backend: str) -> frozenset[str]:
    if backend == "mlx":
        from app.models.support_mlx import mlx_model_types

        return mlx_model_types()
    from app.models.support_transformers import torch_model_types

    return torch_model_types()


def _runs(config: dict, backend: str) -> bool:
    """The backends load the config's model_type; a multimodal wrapper whose text model is
    supported loads as that text model (its text_config)."""
    model_type = str(config.get("model_type", ""))
    if backend == "torch" and model_type in TRANSFORMERS_CORE:
        return True  # without importing transformers' model table (seconds)
    types = supported_types(backend)
    text_type = str((config.get("text_config") or {}).get("model_type", ""))
    if backend == "mlx":
        from app.models.support_mlx import mlx_remap

        model_type = mlx_remap(model_type)
    return model_type in types or (bool(text_type) and text_type in types)


def check_architecture(config: dict, backend: str, name: str) -> None:
    model_type = config.get("model_type")
    if not model_type:
        raise ModelFileError(f"{name}: config.json names no model_type, so no backend knows how to run it.")
    if _runs(config, backend):
        return
    other = "mlx" if backend == "torch" else "torch"
    try:
        elsewhere = _runs(config, other)
    except ImportError:  # that backend is not installed here
        elsewhere = False
    hint = (f" The {BACKEND_NAMES[other]} does support it." if elsewhere
            else " Tandem cannot run it on either backend.")
    popular = ", ".join(t for t in POPULAR if t in supported_types(backend))
    raise ModelFileError(
        f"{name} is a “{model_type}” model, which Tandem's {BACKEND_NAMES.get(backend, backend)} cannot run."
        f"{hint} Supported families include {popular}.")
