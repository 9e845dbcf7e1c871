"""The cache protocol (app/engine/cache.py) over transformers' DynamicCache and its layers.

Attention layers are cut back with their own `crop`. Sliding-window layers record their past
(transformers' `activate_past_recording`, which its assisted generation uses): a pass keeps every
position it appends until the next checkpoint restricts the layer to its window - 1 again, so a
rollback past a full window is exact too. Recurrent layers
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
        self._sliding = [layer for layer in self._attention if isinstance(layer, DynamicSlidingWindowLayer)]
        for layer in self._sliding:
            layer.activate_past_recording()
        self._recording = False  # between a checkpoint and its rewind: passes are kept whole
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
        if not self._recording:
            self._restrict()  # no rollback can come: nothing to keep past the window

    def _restrict(self) -> None:
        """Full sliding layers back to their window - 1 positions."""
        for layer in self._sliding:
            if layer.is_initialized and layer.cumulative_length >= layer.sliding_window:
                layer.crop(0)

    def rollback_room(self) -> int | None:
        return None  # sliding layers record what each pass appends until the next checkpoint

    def checkpoint(self):
        # What the sliding layers recorded is committed now; the passes to come are recorded
        # whole until the rewind.
        self._restrict()
        self._recording = True
        return super().checkpoint()

    def rewind(self, mark, length: int) -> int:
        held = super().rewind(mark, length)
        self._recording = False
        self._restrict()
        return held

    def can_cut(self, length: int) -> bool:
        if length >= self.length:
            return True
        if self.recurrent:
            return False
        for layer in self._sliding:  # after the cut it must still hold its last window - 1 positions
            if not layer.is_initialized:
                continue
            first_held = layer.cumulative_length - layer.keys.shape[-2]
            if first_held > max(0, length - (layer.sliding_window - 1)):
                return False
        return True

    def sliding_windows(self) -> list[int]:
        return [layer.sliding_window for layer in self._sliding]

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
