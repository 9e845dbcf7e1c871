"""The model types mlx-lm can run: one module per architecture in mlx_lm.models, plus the names
it remaps onto them (e.g. mistral -> llama)."""

from __future__ import annotations

import pkgutil
from functools import cache


@cache
def mlx_model_types() -> frozenset[str]:
    import mlx_lm.models
    from mlx_lm.utils import MODEL_REMAPPING

    modules = {m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__)}
    modules -= {"base", "cache", "activations", "rope_utils", "switch_layers", "pipeline", "ssm", "gated_delta"}
    return frozenset(modules | {k for k, v in MODEL_REMAPPING.items() if v in modules})


def mlx_remap(model_type: str) -> str:
    from mlx_lm.utils import MODEL_REMAPPING

    return MODEL_REMAPPING.get(model_type, model_type)
