"""PyTorch backend: transformers' model classes and DynamicCache; CUDA, then MPS, then CPU."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from app.engine.backends.base import ModelBackend
from app.engine.sampling import SamplingParams
from app.models.folder import check_model_folder, context_length_of

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(stored: str | None, device: torch.device) -> torch.dtype:
    """Run at the weights' own precision where the device computes it well.

    float16 on the CPU is slow and inexact in PyTorch, so it runs as float32 there; float32 on a
    GPU stays float32 (the exact reference) unless the caller asks otherwise.
    """
    dtype = _DTYPES.get(stored or "float32", torch.float32)
    if device.type == "cpu" and dtype == torch.float16:
        return torch.float32
    if device.type == "mps" and dtype == torch.bfloat16 and not torch.backends.mps.is_macos_or_newer(14, 0):
        return torch.float16
    return dtype


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as distributions over the last axis. (..., V) float32."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest set whose mass reaches top_p (the token crossing it stays)
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class TorchBackend(ModelBackend):
    name = "torch"

    def __init__(self, folder: Path, device: str | None = None, dtype: str | None = None):
        config = check_model_folder(folder)
        self.folder = folder
        self._device = torch.device(device) if device else pick_device()
        stored = config.get("dtype") or config.get("torch_dtype")
        self._dtype = _DTYPES[dtype] if dtype else pick_dtype(stored, self._device)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(folder),
            dtype=self._dtype,
            trust_remote_code=False,  # never run code shipped with a model
            use_safetensors=True,
        ).to(self._device)
        self.model.eval()
        self.device = str(self._device)
        self.dtype = str(self._dtype).removeprefix("torch.")
        self.model_type = config.get("model_type", "?")
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.context_length = context_length_of(config)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self._generator = torch.Generator(device=self._device)
        self._seeded: int | None = None
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @property
    def cache_len(self) -> int:
        return int(self.cache.get_seq_length())

    def can_trim(self) -> bool:
        # Recurrent layers (Mamba, linear attention) keep state that crop() cannot rewind, and a
        # sliding window has already dropped what a rollback would need.
        return not any(
            isinstance(layer, (LinearAttentionCacheLayerMixin, DynamicSlidingWindowLayer))
            for layer in self.cache.layers
        )

    def trim(self, n: int) -> None:
        if n > 0:
            self.cache.crop(-n)  # transformers 5: a negative count removes that many

    @torch.inference_mode()
    def forward_last(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits of the last position after appending `ids`. (V,) float32, on the device."""
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self._device)  # (1, n)
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        logits = self.forward_last(ids)
        if params.greedy:
            return int(torch.argmax(logits))
        if params.seed is not None and params.seed != self._seeded:
            self._generator.manual_seed(params.seed)
            self._seeded = params.seed
        probs = probs_from_logits(logits, params)
        return int(torch.multinomial(probs, 1, generator=self._generator))
