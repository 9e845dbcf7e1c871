"""The cache protocol (app/engine/cache.py) over transformers' DynamicCache and its layers.

Attention layers are cut back with their own `crop`; sliding-window layers too while they hold
fewer than window - 1 positions (transformers drops older keys past that). Recurrent layers
(`LinearAttentionCacheLayerMixin`: Gated DeltaNet, Mamba, short convolutions) update their conv
and recurrent states in place, so a snapshot clones them and a restore copies them back into the
same tensors (their addresses stay what a compiled graph may have captured).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer,
                                      LinearAttentionCacheLayerMixin)

from app.engine.cache import ModelCache

_STATE_FIELDS = ("conv_states", "recurrent_states", "is_conv_states_initialized",
                 "is_recurrent_states_initialized", "has_previous_state")


def _attention_crop(layer: CacheLayerMixin, tokens_to_remove: int) -> None:
    """The attention part's own crop (a layer that is both recurrent and attention, e.g.
    LinearAttentionAndFullAttentionLayer, would also crop its recurrent part, which refuses)."""
    if isinstance(layer, DynamicSlidingWindowLayer):
        DynamicSlidingWindowLayer.crop(layer, tokens_to_remove)
    elif isinstance(layer, LinearAttentionCacheLayerMixin):
        DynamicLayer.crop(layer, tokens_to_remove)
    else:
        layer.crop(tokens_to_remove)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


class TorchCache(ModelCache):
    """One model's DynamicCache (`store`, what the model's forward takes)."""

    def __init__(self, store: DynamicCache):
        self.store = store
        self._recurrent = [layer for layer in store.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
        self._attention = [layer for layer in store.layers if isinstance(layer, CacheLayerMixin)]
        self.counted = 0  # positions, where no attention layer counts them (a model of recurrent layers only)

    @property
    def length(self) -> int:
        return int(self.store.get_seq_length()) if self._attention else self.counted

    @property
    def recurrent(self) -> bool:
        return bool(self._recurrent)

    def appended(self, n: int) -> None:
        """The backend's forward pass added `n` positions."""
        self.counted += n

    def rollback_room(self) -> int | None:
        room = None
        for layer in self._attention:
            if isinstance(layer, DynamicSlidingWindowLayer):
                # transformers keeps the last window - 1 positions and drops older ones as a pass
                # appends; until then the layer is a plain one and cuts back exactly. So a pass
                # may append only what keeps it within window - 1 (the same rule as MLX's
                # rotating caches, app/engine/backends/mlx_cache.py).
                layer_room = max(layer.sliding_window - 1 - layer.get_seq_length(), 0)
                room = layer_room if room is None else min(room, layer_room)
        return room

    def sliding_windows(self) -> list[int]:
        return [layer.sliding_window for layer in self._attention if isinstance(layer, DynamicSlidingWindowLayer)]

    def trim(self, length: int) -> None:
        for layer in self._attention:
            extra = layer.get_seq_length() - length
            if extra > 0:
                _attention_crop(layer, -extra)  # transformers 5: a negative count removes that many
        self.counted = min(self.counted, length)

    @torch.inference_mode()  # the states are inference tensors (the passes run in inference mode)
    def snapshot(self) -> list[dict]:
        return [{name: {i: _clone(v) for i, v in getattr(layer, name).items()} for name in _STATE_FIELDS}
                for layer in self._recurrent]

    @torch.inference_mode()
    def restore(self, state: list[dict]) -> None:
        for layer, saved in zip(self._recurrent, state, strict=True):
            for name in ("conv_states", "recurrent_states"):
                live = getattr(layer, name)
                for i, value in saved[name].items():
                    if value is not None and isinstance(live[i], torch.Tensor) and live[i].shape == value.shape:
                        live[i].copy_(value)  # in place: the layer's tensors keep their address
                    else:
                        live[i] = _clone(value)
            for name in _STATE_FIELDS[2:]:
                getattr(layer, name).update(saved[name])

    def nbytes(self) -> int:
        storages = {}  # by storage, so that views of a buffer count once
        for layer in self.store.layers:
            for value in vars(layer).values():
                tensors = value.values() if isinstance(value, dict) else (value,)
                for tensor in tensors:
                    if isinstance(tensor, torch.Tensor):
                        storage = tensor.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())
