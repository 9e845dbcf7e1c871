"""The cache protocol (app/engine/cache.py) over mlx-lm's per-layer prompt caches.

KVCache layers trim exactly; a RotatingKVCache (sliding window) too while nothing in its ring
has been overwritten; ArraysCache layers (Gated DeltaNet's conv and recurrent state, Mamba's)
cannot be trimmed at all. MLX arrays are immutable and mlx-lm's layers assign new arrays to
their cache slots, so a snapshot of recurrent state is a list of references: free.
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from app.engine.cache import ModelCache


class MLXCache(ModelCache):
    """One model's list of mlx-lm caches (`layers`, what the model's call takes)."""

    def __init__(self, layers: list):
        self.layers = layers
        self._recurrent = [layer for layer in layers if isinstance(layer, ArraysCache)]
        self._attention = [layer for layer in layers if not isinstance(layer, ArraysCache)]
        unknown = sorted({type(layer).__name__ for layer in self._attention
                          if not isinstance(layer, RotatingKVCache) and not layer.is_trimmable()})
        if unknown:  # a cache kind this protocol does not know how to rewind: never guess
            self.blocked = f"its cache layers of type {', '.join(unknown)} cannot be rolled back"
        self.counted = 0  # positions, where no attention layer counts them (recurrent layers only)

    @property
    def length(self) -> int:
        return int(self._attention[0].offset) if self._attention else self.counted

    @property
    def recurrent(self) -> bool:
        return bool(self._recurrent)

    def appended(self, n: int) -> None:
        """The backend's forward pass added `n` positions."""
        self.counted += n

    def rollback_room(self) -> int | None:
        if self.blocked:
            return 0
        room = None
        for layer in self._attention:
            if isinstance(layer, RotatingKVCache):
                # A ring buffer cuts back exactly only while nothing has been overwritten: the
                # positions it holds plus those a pass appends must stay within the window (a
                # multi-token append past it drops the oldest keys, a trim then leaves rejected
                # drafts' keys inside the window).
                layer_room = max(layer.max_size - layer.offset, 0)
                room = layer_room if room is None else min(room, layer_room)
        return room

    def sliding_windows(self) -> list[int]:
        return [layer.max_size for layer in self._attention if isinstance(layer, RotatingKVCache)]

    def trim(self, length: int) -> None:
        for layer in self._attention:
            extra = layer.offset - length
            if extra > 0:
                layer.trim(extra)
        self.counted = min(self.counted, length)

    def snapshot(self) -> list[list]:
        return [list(layer.cache) for layer in self._recurrent]

    def restore(self, state: list[list]) -> None:
        for layer, saved in zip(self._recurrent, state, strict=True):
            layer.cache = list(saved)

    def nbytes(self) -> int:
        return sum(int(getattr(layer, "nbytes", 0)) for layer in self.layers)
