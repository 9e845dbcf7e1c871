"""The cache protocol (app/engine/cache.py) over transformers' DynamicCache and its layers.

Attention layers are cut back with their own `crop`. Sliding-window layers record their past
(transformers' `activate_past_recording`, which its assisted generation uses): a pass keeps every
position it appends until the next checkpoint restricts the layer to its window - 1 again, so a
rollback past a full window is exact too. Recurrent layers
(`LinearAttentionCacheLayerMixin`: Gated DeltaNet, Mamba, short convolutions) update their conv
and recurrent states in place, so a snapshot clones them and a restore copies them back into the
same tensors (their addresses stay what a compiled graph may have captured). A rewind then
advances them over the kept positions with the recurrent mixers alone (layer_replay_torch.py),
or, with `state_replay = "model"` or where that cannot run, leaves it to the caller's replay.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer,
                                      LinearAttentionCacheLayerMixin)

from app.engine.backends.base import STATE_REPLAYS, check_choice
from app.engine.backends.layer_replay_torch import MixerInputs
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
    """One model's DynamicCache (`store`, what the model's forward takes); `mixers`, the module
    that writes each recurrent layer (layer_replay_torch.recurrent_mixers), allow layer replay."""

    def __init__(self, store: DynamicCache, mixers: dict[int, torch.nn.Module] | None = None,
                 state_replay: str = "layers"):
        self.store = store
        self._inputs = MixerInputs(mixers) if mixers else None
        self.state_replay = state_replay
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

    @property
    def state_replay(self) -> str:
        """"layers" or "model" (STATE_REPLAYS): what rewinds do from the next checkpoint on."""
        return self._state_replay

    @state_replay.setter
    def state_replay(self, mode: str) -> None:
        self._state_replay = check_choice("state replay", mode, STATE_REPLAYS)

    @property
    def replays_layers(self) -> bool:
        """Whether rewinds rebuild recurrent state layer by layer (else the caller's replay does)."""
        return self._state_replay == "layers" and self._inputs is not None and self.recurrent

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
        if self.replays_layers:
            self._inputs.start()  # the mixers' inputs, until the rewind
        elif self._inputs is not None:
            self._inputs.stop()
        return super().checkpoint()

    def rewind(self, mark, length: int) -> int:
        try:
            held = super().rewind(mark, length)
        finally:
            self.drop_recording()  # plain passes from here on run without hooks
            self._recording = False
        self._restrict()
        return held

    def replay_layers(self, n: int) -> bool:
        return self.replays_layers and self._inputs.replay(n)

    def drop_recording(self) -> None:
        """Take the mixers' hooks off (the model outlives this cache: a reset between a checkpoint
        and its rewind must not leave them recording every later pass)."""
        if self._inputs is not None:
            self._inputs.stop()

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
