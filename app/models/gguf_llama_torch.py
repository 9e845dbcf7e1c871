"""The Llama family's modules without transformers, for a GGUF whose passes run through the lean step.

Why: on the CPU a GGUF at its own precisions never runs transformers' forward. Its passes are the
lean step (app/engine/backends/lean_step_torch.py), whose decoder layers are one compiled call on
Tandem's kernel. transformers' model classes would only hold the weights and make RoPE's tables.
Importing them costs more than the rest of the demo's load: 3.0-3.4 s and ~110 MB on this CPU
(`import transformers.models.llama.modeling_llama` pulls in torch._dynamo, torch.distributed,
torchao and scipy through its loss functions; measured with `python -X importtime`).

So this module builds the same tree under the same names (`model.layers.N.self_attn.q_proj`,
`model.norm`, `lm_head`, ...) from the imported folder's config.json. The loader fills it from the
GGUF exactly as it fills transformers' model, and the lean step reads it the same way. Three
things of transformers' are reproduced, each checked against transformers itself in
tests/test_gguf_llama_torch.py:
- the config's defaults the lean step reads (head_dim, RoPE's parameters);
- RoPE's tables, `LlamaRotaryEmbedding` (and Qwen3's, the same code) for the "default" rope type,
  the one transformers' GGUF import writes;
- llama.cpp's Q/K row permutation undone, as `LlamaTensorProcessor` does for the "llama"
  architecture (convert_hf_to_gguf.py's `permute`, reversed).
The tensor names come from gguf-py's own table (`gguf.get_tensor_name_map`), as transformers'.

Anything else (another family, biases, another rope type, a model whose passes need transformers'
forward: compiling, `--step transformers`) loads transformers' classes, and `why_not` says why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch

from app.models.errors import ModelFileError

# (GGUF architecture, config model_type) pairs built here; "llama" permutes Q and K rows in the file
ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3"}


class PlainConfig(SimpleNamespace):
    """A config.json as attributes, with the defaults transformers' config classes would give the
    fields the lean step and the loader read."""

    def __init__(self, fields: dict):
        super().__init__(**fields)
        if getattr(self, "head_dim", None) is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if getattr(self, "num_key_value_heads", None) is None:
            self.num_key_value_heads = self.num_attention_heads
        rope = dict(getattr(self, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", getattr(self, "rope_theta", 10000.0))
        self.rope_parameters = rope


def why_not(config: dict, architecture: str) -> str:
    """"" where this module can hold the model of `config` read from a GGUF of `architecture`."""
    from app.engine.backends.lean_step_torch import why_not_lean_config

    kind = config.get("model_type")
    if ARCHITECTURES.get(architecture) != kind:
        return f"Tandem's own layers cover the GGUF architectures {', '.join(ARCHITECTURES)}, not {architecture}"
    reason = why_not_lean_config(PlainConfig(config))
    if reason:
        return reason
    if config.get("attention_bias") or config.get("mlp_bias"):
        return f"{kind}: projections with biases"
    if config.get("hidden_act", "silu") != "silu":
        return f"{kind}: {config.get('hidden_act')} activation"
    rope = (config.get("rope_parameters") or {}).get("rope_type", "default")
    if rope != "default":
        return f"{kind}: {rope} rope"
    return ""


class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm / Qwen3RMSNorm: the weight and epsilon the lean step's glue reads."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(width, device="meta"), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class RotaryEmbedding(torch.nn.Module):
    """LlamaRotaryEmbedding's "default" rope: the same inverse frequencies and the same float32
    arithmetic, so the tables are transformers' bit for bit."""

    def __init__(self, config: PlainConfig):
        super().__init__()
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        self.inv_freq = torch.nn.Buffer(1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)),
                                        persistent=False)
        self.attention_scaling = 1.0

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(dtype=x.dtype),
                (emb.sin() * self.attention_scaling).to(dtype=x.dtype))


def _linear(rows: int, cols: int) -> torch.nn.Linear:
    return torch.nn.Linear(cols, rows, bias=False, device="meta")


class Attention(torch.nn.Module):
    def __init__(self, config: PlainConfig):
        super().__init__()
        width, hd = config.hidden_size, config.head_dim
        self.head_dim, self.scaling = hd, hd ** -0.5
        self.q_proj = _linear(config.num_attention_heads * hd, width)
        self.k_proj = _linear(config.num_key_value_heads * hd, width)
        self.v_proj = _linear(config.num_key_value_heads * hd, width)
        self.o_proj = _linear(width, config.num_attention_heads * hd)
        if config.model_type == "qwen3":  # Qwen3 normalises each head's q and k before RoPE
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)


class MLP(torch.nn.Module):
    def __init__(self, config: PlainConfig):
        super().__init__()
        width, inner = config.hidden_size, config.intermediate_size
        self.gate_proj, self.up_proj = _linear(inner, width), _linear(inner, width)
        self.down_proj = _linear(width, inner)
        self.act_fn = torch.nn.SiLU()


class DecoderLayer(torch.nn.Module):
    def __init__(self, config: PlainConfig):
        super().__init__()
        self.self_attn, self.mlp = Attention(config), MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Body(torch.nn.Module):
    def __init__(self, config: PlainConfig):
        super().__init__()
        # a weight given: no random initialisation (on meta, normal_ imports torch._dynamo: a second)
        table = torch.empty(config.vocab_size, config.hidden_size, device="meta")
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size, _weight=table, _freeze=True)
        self.layers = torch.nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class CausalLM(torch.nn.Module):
    """What the loader fills and the lean step reads of transformers' LlamaForCausalLM (or
    Qwen3ForCausalLM); it has no forward of its own: its passes are the lean step's."""

    def __init__(self, config: PlainConfig):
        super().__init__()
        self.config = config
        self.model = Body(config)
        self.lm_head = _linear(config.vocab_size, config.hidden_size)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def set_output_embeddings(self, head: torch.nn.Module) -> None:
        self.lm_head = head

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, *args, **kwargs):
        raise RuntimeError("this model runs its passes through the lean step only (app/models/gguf_llama_torch.py)")


def read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{folder}: config.json cannot be read ({exc})") from exc


class RowProcessor:
    """transformers' GGUF tensor processor for the architectures here: the "llama" architecture's
    Q and K rows are un-permuted (LlamaTensorProcessor._reverse_permute_weights, from llama.cpp's
    convert_hf_to_gguf.py `permute`); everything else is left as it is."""

    def __init__(self, config: PlainConfig, architecture: str):
        self.permute = architecture == "llama"
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads

    def process(self, weights, name: str):
        if self.permute and (".attn_q." in name or ".attn_k." in name):
            heads = self.heads if ".attn_q." in name else self.kv_heads
            dim = weights.shape[0] // heads // 2
            weights = weights.reshape(heads, dim, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)
        return SimpleNamespace(weights=weights)


def tensor_names(model: CausalLM, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf-py's own table (as transformers'
    `get_gguf_hf_weights_map` builds it)."""
    import gguf

    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    # the table of one block, its names then moved to each layer's index: the whole table for 30
    # layers took 70 ms of a 3 s load to build, and every block's names are block 0's but for the index
    table = gguf.get_tensor_name_map(arch, 1)
    names = {}
    for name, _ in model.named_parameters():
        base, _, suffix = name.rpartition(".")
        layer = _LAYER.match(base)
        found = table.get_name(base if layer is None else f"{layer[1]}0{layer[3]}")
        if found is not None and layer is not None:
            found = found.replace("blk.0.", f"blk.{layer[2]}.", 1)
        if found is not None:
            names[f"{found}.{suffix}"] = name
    return names


_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")  # a decoder layer's parameter: its index apart


def build(config: dict) -> tuple[CausalLM, PlainConfig]:
    """The model's tree with its weights on the meta device (the loader fills them from the file)."""
    plain = PlainConfig(config)
    return CausalLM(plain), plain
