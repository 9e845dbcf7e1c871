"""MLX backend: mlx-lm's model classes and prompt caches. Metal on Apple Silicon, CPU elsewhere.

MLX streams belong to one thread: a backend is created and used on the runner's thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model

from app.engine.backends.base import ModelBackend
from app.engine.sampling import SamplingParams
from app.models.folder import check_model_folder, context_length_of


def probs_from_logits(logits: mx.array, params: SamplingParams) -> mx.array:
    """Temperature, then top-k, then top-p, over the last axis. (..., V) float32."""
    logits = logits.astype(mx.float32) / params.temperature
    vocab = logits.shape[-1]
    if params.top_k and params.top_k < vocab:
        kth = mx.sort(logits, axis=-1)[..., vocab - params.top_k : vocab - params.top_k + 1]
        logits = mx.where(logits < kth, -mx.inf, logits)
    probs = mx.softmax(logits, axis=-1)
    if params.top_p < 1.0:
        order = mx.argsort(-probs, axis=-1)
        sorted_probs = mx.take_along_axis(probs, order, axis=-1)
        drop = (mx.cumsum(sorted_probs, axis=-1) - sorted_probs) >= params.top_p
        sorted_probs = mx.where(drop, 0.0, sorted_probs)
        probs = mx.put_along_axis(mx.zeros_like(probs), order, sorted_probs, axis=-1)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


class MLXBackend(ModelBackend):
    name = "mlx"

    def __init__(self, folder: Path):
        config = check_model_folder(folder)
        self.folder = folder
        self.model, self._config = load_model(folder)
        self.device = "metal" if mx.metal.is_available() else "cpu"
        quant = config.get("quantization") or config.get("quantization_config")
        if isinstance(quant, dict) and "bits" in quant:
            self.dtype = f"int{quant['bits']} (affine, g{quant.get('group_size', 64)})"
        else:
            self.dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        self.model_type = config.get("model_type", "?")
        self.context_length = context_length_of(config)
        self.vocab_size = int(config.get("vocab_size") or 0)
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))
        self.reset()

    def reset(self) -> None:
        self.cache = make_prompt_cache(self.model)

    @property
    def cache_len(self) -> int:
        return int(self.cache[0].offset) if self.cache else 0

    def can_trim(self) -> bool:
        return bool(can_trim_prompt_cache(self.cache))

    def trim(self, n: int) -> None:
        if n > 0:
            trim_prompt_cache(self.cache, n)

    def forward_last(self, ids: Sequence[int]) -> mx.array:
        """Logits of the last position after appending `ids`. (V,) float32."""
        logits = self.model(mx.array([list(ids)]), cache=self.cache)  # (1, n, V)
        return logits[0, -1].astype(mx.float32)

    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        logits = self.forward_last(ids)
        if params.greedy:
            return int(mx.argmax(logits).item())
        if params.seed is not None and params.seed != getattr(self, "_seeded", None):
            mx.random.seed(params.seed)
            self._seeded = params.seed
        probs = probs_from_logits(logits, params)
        return int(mx.random.categorical(mx.log(probs)).item())

