"""One cache protocol for every backend: what a model holds of the tokens it has read.

mlx-lm's per-layer caches are the model (`offset`, `trim(n)`, `is_trimmable()`), with one more
idea for the models of 2026: a cache may mix three kinds of layer.

- attention layers keep keys and values per position: trimming cuts them back exactly;
- sliding-window layers do the same while they still hold the positions to cut (on PyTorch they
  record what each pass appends; MLX's ring buffers only until they wrap: `rollback_room`);
- recurrent layers (Gated DeltaNet in Qwen3.5/3.6, Mamba in Nemotron-H) keep one state for the
  whole sequence, which no trim can rewind: only a checkpoint taken before can put it back.

So a round takes a `checkpoint()` before a pass that may be rejected and `rewind()`s after it.
For a cache without recurrent layers the checkpoint is just a length and the rewind a trim. With
recurrent layers the rewind restores the checkpoint's state (attention layers trimmed to the
same length) and the kept positions are read again: by the recurrent layers alone, from the
inputs they recorded during the pass, where the backend can (PyTorch's layer replay), otherwise
by the caller passing the kept tokens through the whole model (the engine's replay). On hybrid
models a rejected round costs a copy of the state and that second read of the accepted tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    length: int  # positions the cache held when it was taken
    state: Any = None  # the recurrent layers' state then (None: the cache has none)


class ModelCache(ABC):
    """A model's cache behind one protocol (app/engine/backends/*_cache.py implement it)."""

    blocked: str = ""  # why it cannot be rolled back at all (a layer kind it does not know)
    recomputed: int = 0  # positions whose recurrent state the last rewind advanced again itself

    @property
    @abstractmethod
    def length(self) -> int:
        """How many positions the cache holds."""

    @property
    @abstractmethod
    def recurrent(self) -> bool:
        """Whether some layer keeps state that trimming cannot cut back (it needs a checkpoint)."""

    @abstractmethod
    def rollback_room(self) -> int | None:
        """How many more positions the cache can take and still be cut back exactly: None when any
        number can, 0 when none can (a sliding window that is full)."""

    @abstractmethod
    def sliding_windows(self) -> list[int]:
        """The window of each sliding-window layer (for messages)."""

    @abstractmethod
    def trim(self, length: int) -> None:
        """Keep the first `length` positions of every attention layer (a pass that failed midway
        may have extended only some layers, so this works layer by layer). Recurrent layers are
        left as they are: only `rewind` puts them back."""

    @abstractmethod
    def snapshot(self) -> Any:
        """A copy of the recurrent layers' state (references where the arrays are immutable)."""

    @abstractmethod
    def restore(self, state: Any) -> None:
        """Put back a `snapshot()`."""

    @abstractmethod
    def nbytes(self) -> int:
        """Memory the cache holds (its buffers, spare room included)."""

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.length, self.snapshot() if self.recurrent else None)

    def rewind(self, mark: Checkpoint, length: int) -> int:
        """Cut back to `length` positions (mark.length <= length). Returns the length now held:
        `length` where trimming reaches it, or where recurrent state went back to the checkpoint
        and the recurrent layers alone advanced it again (`replay_layers`; `recomputed` says over
        how many positions); otherwise mark.length, and the caller passes the tokens in between
        again."""
        self.recomputed = 0
        if length >= self.length:
            return self.length
        if not self.recurrent:
            self.trim(length)
            return length
        if length < mark.length:
            raise ValueError(f"cannot rewind recurrent state to {length} positions from a checkpoint at {mark.length}")
        self.restore(mark.state)
        try:
            replayed = self.replay_layers(length - mark.length)
        except BaseException:
            self.restore(mark.state)  # some layers may have advanced: all back to the checkpoint
            self.trim(mark.length)
            raise
        if replayed:
            self.trim(length)
            self.recomputed = length - mark.length
            return length
        self.trim(mark.length)
        return mark.length

    def replay_layers(self, n: int) -> bool:
        """Advance the restored recurrent state over the first n positions of the passes since the
        checkpoint without the rest of the model (from what those passes recorded). False where
        this cache cannot: the caller passes the tokens through the whole model again."""
        return False

    def can_cut(self, length: int) -> bool:
        """Whether `cut(length)` can go back to `length` exactly (a follow-up turn's shared prefix)."""
        return length >= self.length or (not self.recurrent and self.rollback_room() is None)

    def cut(self, length: int) -> None:
        """Cut back to `length` positions where that needs no checkpoint: always for attention
        layers, and for recurrent ones only when nothing is cut."""
        if length >= self.length:
            return
        if not self.can_cut(length):
            raise ValueError(f"this cache cannot be cut from {self.length} to {length} positions without a "
                             "checkpoint (recurrent state, or a sliding window past what it holds)")
        self.trim(length)
