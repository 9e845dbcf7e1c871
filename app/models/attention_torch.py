"""Attention for grouped-query models on the CPU without copying the KV cache at every pass.

transformers' SDPA path (`integrations/sdpa_attention.py`) hands PyTorch's kernel the key/value
heads repeated up to the query heads' count (`repeat_kv`, a copy of the layer's whole cache)
whenever the pass has a mask, because CUDA's fast kernels take no mask with grouped heads. Every
verify pass wider than one token has a mask, so each one copied the cache of every layer: on
the demo (9 query heads over 3 KV heads) at 700 tokens of context the copies were 5 ms of a
two-token pass (profile: `aten::copy_` 6.4 ms against 1.4 ms), a cost that grows with the
context. PyTorch's CPU kernel takes a mask and grouped heads together (`enable_gqa`), so on the
CPU that pass goes to it directly, giving the same logits. Every other case is transformers' own
path, unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "tandem_sdpa"


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (query.device.type != "cpu" or attention_mask is None or not grouped or query.shape[2] == 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions") or key.shape[-1] != value.shape[-1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes


def use_on_cpu(model: torch.nn.Module, device: torch.device) -> bool:
    """Route a CPU text model that attends through SDPA here; True where it now does. Left as it is:
    a model with sub-models (a vision or audio tower has its own reasons for its attention), and
    one whose code branches on the name "sdpa" (Gemma 4 trims its input before its KV-shared
    layers only under that name; Falcon, GLM-5 Next), which a new name would change."""
    config = getattr(model, "config", None)
    if (device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa"
            or getattr(config, "sub_configs", None) or _branches_on_sdpa(model)):
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError):  # a model that cannot switch keeps transformers' own
        config._attn_implementation_internal = "sdpa"
        return False
    return model.config._attn_implementation == NAME


# transformers' model families whose code branches on the name "sdpa" (transformers 5.24;
# tests/test_attention_torch.py scans the installed transformers and fails when this list is behind)
BRANCHES_ON_SDPA = frozenset({
    "axk2", "deepseek_v32", "dots3_note", "falcon", "gemma4", "gemma4_unified", "glm5_next", "glm_moe_dsa",
    "hy_v4", "hy_v4_vl", "minimax_m3_vl", "mistral_large4"})


def _branches_on_sdpa(model: torch.nn.Module) -> bool:
    """By the family of its modules' code (a frozen app has the module names, not the sources)."""
    for module in {type(m).__module__ for m in (model, *model.children())}:
        parts = module.split(".")
        if len(parts) > 2 and parts[:2] == ["transformers", "models"] and parts[2] in BRANCHES_ON_SDPA:
            return True
    return False
