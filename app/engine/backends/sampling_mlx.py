"""The sampling transform on MLX (temperature, top-k, top-p), shared by the backend's passes
(mlx_backend.py) and its tree verdicts (tree_mlx.py)."""

from __future__ import annotations

import mlx.core as mx

from app.engine.sampling import SamplingParams


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
        drop[..., 0] = False  # the likeliest token always stays (a top-p of 1e-300 rounds to 0)
        sorted_probs = mx.where(drop, 0.0, sorted_probs)
        probs = mx.put_along_axis(mx.zeros_like(probs), order, sorted_probs, axis=-1)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs
