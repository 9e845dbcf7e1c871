"""The model types the PyTorch backend can run: transformers' own causal-LM classes (never
remote code), read from its auto mappings without importing every model."""

from __future__ import annotations

from functools import cache


@cache
def torch_model_types() -> frozenset[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def transformers_version() -> str:
    import transformers

    return transformers.__version__
