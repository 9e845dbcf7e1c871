"""Will a pair fit? Weights at the precision they load in, plus the KV cache, for both models,
against the memory that is free where they will live (RAM on the CPU, unified memory on Apple
Silicon, the GPU's own memory on CUDA). Asked before any weights load, so the answer is a
message with numbers instead of an out-of-memory crash."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from app.draft_choice import DraftChoice
from app.models.errors import ModelFileError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# int4 weight-only: 4 bits plus a 16-bit scale and zero per group of 32, about 0.31 of float16;
# the embeddings and the head stay at full precision, so count 0.35 of the float16 size.
INT4_OF_FLOAT16 = 0.35
PLANNED_CONTEXT = 32_768  # the KV cache is planned for this much of the chat (or the model's context)
MIN_CONTEXT = 4_096  # below this a chat is not worth having: refuse rather than warn
OVERHEAD = 0.08  # activations, logits, allocator slack: a fraction of the weights
OVERHEAD_FLOOR = 64 * 1024 * 1024
WARN_FRACTION = 0.85
FREE_MEMORY_ENV = "TANDEM_FREE_MEMORY"  # simulate a smaller machine: bytes, or "8GB", "512MB"


TOO_LARGE_ADVICE = "Choose a smaller or quantized model (a 4-bit version), or close other apps and try again."


class NotEnoughMemory(ModelFileError):
    """The pair would not fit; the message gives the numbers and what to do. `fits_at`: a
    precision the same pair would fit at ("int4"), which a window can offer as one click."""

    def __init__(self, message: str, fits_at: str | None = None, fits_with_draft: DraftChoice | None = None):
        super().__init__(message)
        self.fits_at = fits_at
        self.fits_with_draft = fits_with_draft  # the draft to pair it with there, when not the same one


@dataclass(frozen=True)
class MemoryEstimate:
    name: str
    weights: int
    kv_per_token: int
    context: int  # the model's own context length

    def total(self, tokens: int | None = None) -> int:
        tokens = min(tokens or self.context, self.context)
        return self.weights + self.kv_per_token * tokens + max(int(self.weights * OVERHEAD), OVERHEAD_FLOOR)


def _text_config(config: dict) -> dict:
    return {**config, **(config.get("text_config") or {})}


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """Keys and values of every layer that keeps them. Hybrid models (Qwen3.5's linear attention,
    Mamba layers) keep a fixed-size state in the others instead, which the overhead covers."""
    c = _text_config(config)
    layers = int(c.get("num_hidden_layers") or c.get("n_layer") or 0)
    if isinstance(c.get("layer_types"), list):
        layers = sum(1 for t in c["layer_types"] if "linear" not in str(t) and "mamba" not in str(t))
    elif c.get("full_attention_interval"):
        layers = layers // int(c["full_attention_interval"])
    heads = int(c.get("num_attention_heads") or c.get("n_head") or 1)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c.get("hidden_size") or 0) // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def head_kv_per_token(config: dict, layers: int, dtype_bytes: int) -> int:
    """A draft head's own KV cache per position (an MTP layer, an aligned head, an EAGLE-3 head, a
    DFlash drafter): `layers` attention layers shaped as `config` says (its layers' config, or the
    target's for a layer of the target's kind). On a GPU it is held for the planned context from
    the first pass (app/engine/backends/head_graphs_torch.py), so it is counted like a model's."""
    c = {k: v for k, v in _text_config(config).items() if k not in ("layer_types", "full_attention_interval")}
    return kv_bytes_per_token({**c, "num_hidden_layers": layers}, dtype_bytes)


def kv_dtype_bytes(model: MemoryEstimate, config: dict) -> int:
    """The bytes of one cached number for `model` (estimated from `config`): what its heads' caches use too."""
    per_byte = kv_bytes_per_token(config, 1)
    return model.kv_per_token // per_byte if per_byte else 2


def loaded_dtype(config: dict, backend: str, device: str, precision: str) -> str:
    """What the backends load the weights as (app/engine/backends): their own dtype, except
    float16 on a CPU under PyTorch, which runs as float32; an explicit precision wins."""
    if precision not in ("auto", "", None):
        return precision
    if "quantization" in config or "quantization_config" in config:
        return "quantized"
    stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    if backend == "torch" and device == "cpu" and stored == "float16":
        return "float32"
    return stored


def estimate(name: str, config: dict, file_bytes: int, backend: str, device: str,
             precision: str = "auto", loaded_bytes: int | None = None) -> MemoryEstimate:
    """`file_bytes`: the safetensors' tensor bytes (app/models/integrity.check_weights);
    `loaded_bytes`: the weights' size as loaded, where the caller knows it (a GGUF at its own
    precisions: app/models/gguf_torch.loaded_bytes)."""
    stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    dtype = loaded_dtype(config, backend, device, precision)
    weights = file_bytes
    if loaded_bytes is not None:
        weights = loaded_bytes
        # the KV cache of a GGUF loaded at its own precisions (app/models/gguf_torch.py): float32 on
        # the CPU, bfloat16 on an NVIDIA GPU (the dtype the GPU path loads it in)
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    elif dtype.startswith("int4"):
        weights = int(file_bytes / DTYPE_BYTES.get(stored, 2) * 2 * INT4_OF_FLOAT16)
    elif dtype in DTYPE_BYTES and stored in DTYPE_BYTES:
        weights = file_bytes * DTYPE_BYTES[dtype] // DTYPE_BYTES[stored]
    kv_dtype = DTYPE_BYTES.get(dtype, 2)  # caches follow the compute dtype; quantized models use 16 bits
    context = int(_text_config(config).get("max_position_embeddings") or 2048)
    return MemoryEstimate(name, weights, kv_bytes_per_token(config, kv_dtype), context)


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if abs(n) >= 1e9 else f"{n / 1e6:.0f} MB"


size_text = _size  # for messages elsewhere that give sizes the same way


def check_fits(models: list[MemoryEstimate], free: int, where: str) -> str | None:
    """None when the pair fits comfortably; a warning when it fits only tightly or only for
    shorter chats; NotEnoughMemory when it cannot fit even a short chat."""
    planned = min(PLANNED_CONTEXT, max(m.context for m in models))
    least = min(MIN_CONTEXT, planned)
    need = sum(m.total(planned) for m in models)
    short = sum(m.total(least) for m in models)
    parts = " and ".join(
        f"the {m.name} {_size(m.total(planned))} (weights {_size(m.weights)} + KV cache "
        f"{_size(m.kv_per_token * min(planned, m.context))})" for m in models)
    if short > free:
        raise NotEnoughMemory(
            f"This pair does not fit: {parts} at {planned:,} tokens of context, and even a {least:,}-token "
            f"chat needs {_size(short)}, but only {_size(free)} of {where} is free. {TOO_LARGE_ADVICE}")
    if need > free:
        return (f"This pair fits in {where} only for chats up to about {longest_chat(models, free):,} tokens "
                f"({_size(free)} free; {planned:,} tokens would need {_size(need)}): Tandem keeps chats within that.")
    if need > WARN_FRACTION * free:
        return (f"This pair needs about {_size(need)} of the {_size(free)} of {where} that is free: other apps "
                "may slow down or the system may swap.")
    return None


def longest_chat(models: list[MemoryEstimate], free: int) -> int | None:
    """The most tokens of context whose KV caches fit in `free` beside the weights, when fewer
    than the planned context do (None when that fits)."""
    planned = min(PLANNED_CONTEXT, max(m.context for m in models))
    if sum(m.total(planned) for m in models) <= free:
        return None
    least = min(MIN_CONTEXT, planned)
    per_token = sum(m.kv_per_token for m in models)
    short = sum(m.total(least) for m in models)
    return min(planned, max(least, int((free - short) / per_token) + least)) if per_token else planned


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?i?b?)?\s*", text.lower())
    if not match:
        raise ValueError(f"{FREE_MEMORY_ENV}={text!r}: give bytes, or a size such as 8GB or 512MB")
    scale = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30}
    return int(float(match.group(1)) * scale[match.group(2) or ""])


def free_memory(backend: str, device: str = "cpu") -> tuple[int, str]:
    """Bytes free where the models will live, and a name for that memory."""
    override = os.environ.get(FREE_MEMORY_ENV)
    if override:
        return parse_bytes(override), "memory (as TANDEM_FREE_MEMORY says)"
    if backend == "mlx":
        from app.models.memory_mlx import free_unified_memory

        return free_unified_memory(), "unified memory"
    if device.startswith("cuda"):
        from app.models.memory_torch import free_cuda_memory

        return free_cuda_memory(device)
    import psutil

    return int(psutil.virtual_memory().available), "unified memory" if device == "mps" else "RAM"
