"""What a drafter head of several layers on MLX keeps beside them (an EAGLE-3 head, a DFlash
drafter): one mlx-lm KVCache per layer, cut back to a length after each round, and its own
random key (split for every draw: MLX's global generator would be shared with the target)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from app.engine.backends.base import entropy_seed


class CachedLayersHead:
    """A mixin: the class sets `layers` (a module whose `layers` list holds the head's layers)
    and calls `_own_stream()` in its __init__."""

    caches: list[KVCache]

    def _own_stream(self) -> None:
        self._key = mx.random.key(entropy_seed())

    def reset(self) -> None:
        self.caches = [KVCache() for _ in self.layers.layers]

    @property
    def cache(self) -> KVCache:
        return self.caches[0]

    @property
    def length(self) -> int:
        return self.caches[0].offset

    def trim(self, length: int) -> None:
        for cache in self.caches:
            if cache.offset > length:
                cache.trim(cache.offset - length)

    def concat(self, rows, more):
        return mx.concatenate([rows, more])

    def seed(self, seed: int | None) -> None:
        self._key = mx.random.key(entropy_seed() if seed is None else seed)

    def _next_key(self) -> mx.array:
        self._key, key = mx.random.split(self._key)
        return key
