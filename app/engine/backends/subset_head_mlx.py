"""A draft head's output over its draft vocabulary on MLX: app/engine/backends/subset_head_torch.py
says why and what. The rows of a quantized head stay quantized (codes, scales and biases are
per row), so the subset is a quantized matmul over fewer rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn

from app.models.aligned_head import DRAFT_VOCAB_EXTRA as EXTRA


class SubsetHead:
    def __init__(self, module: nn.Module, ids: Sequence[int], limit: int):
        self.module, self.limit = module, limit
        self.fixed = sorted({int(i) for i in ids if 0 <= int(i) < limit})
        self.ids, self.parts = self._part(self.fixed)
        self.clear()

    def _part(self, ids: list[int]) -> tuple[mx.array, dict]:
        index = mx.array(ids, dtype=mx.uint32)
        parts = {name: self.module[name][index] for name in ("weight", "scales", "biases", "bias")
                 if name in self.module}
        mx.eval(parts)
        return index, parts

    def _logits(self, x: mx.array, parts: dict) -> mx.array:
        if "scales" in parts:
            sub = mx.quantized_matmul(x, parts["weight"], scales=parts["scales"], biases=parts.get("biases"),
                                      transpose=True, group_size=self.module.group_size, bits=self.module.bits,
                                      mode=getattr(self.module, "mode", "affine"))
        else:
            sub = x @ parts["weight"].T
        if "bias" in parts:
            sub = sub + parts["bias"]
        return sub[0].astype(mx.float32)

    def clear(self) -> None:
        """Back to the fixed part (a new conversation)."""
        self.known = set(self.fixed)
        self.extra: list[int] = []
        self.extra_ids, self.extra_parts = None, None

    def add(self, tokens: Iterable[int]) -> None:
        """Take on the conversation's tokens (up to EXTRA beyond the fixed part)."""
        new = [t for t in dict.fromkeys(int(t) for t in tokens) if 0 <= t < self.limit and t not in self.known]
        new = new[: EXTRA - len(self.extra)]
        if new:
            self.known.update(new)
            self.extra += new
            self.extra_ids, self.extra_parts = self._part(self.extra)

    def __call__(self, h: mx.array) -> mx.array:
        """h (..., D) -> logits (limit,) float32, at the last position."""
        x = h.reshape(-1, h.shape[-1])[-1:]
        out = mx.full((self.limit,), -mx.inf, dtype=mx.float32)
        out[self.ids] = self._logits(x, self.parts)
        if self.extra_ids is not None:
            out[self.extra_ids] = self._logits(x, self.extra_parts)
        return out
