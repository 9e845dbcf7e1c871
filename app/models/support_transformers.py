"""The model types the PyTorch backend can run: transformers' own causal-LM classes (never
remote code), read from its auto mappings without importing every model."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache


@cache
def torch_model_types() -> frozenset[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if getattr(sys, "frozen", False):  # a packaged app carries only some families (packaging/bundle_contents.py)
        from transformers.models.auto.configuration_auto import model_type_to_module_name

        types = frozenset(t for t in types
                          if importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(t)}"))
    return types


def transformers_version() -> str:
    import transformers

    return transformers.__version__
