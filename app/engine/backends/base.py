"""What the engine needs from a loaded model, whatever the array library.

A backend owns one model and its KV cache. Positions in the cache are the committed tokens; the
engine appends with forward passes and rolls back with `trim` (mlx-lm's cache protocol:
`offset`, `trim(n)`, `is_trimmable()`). Arrays never cross this interface except as Python ints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from app.engine.sampling import SamplingParams


class ModelBackend(ABC):
    name: str  # "torch" or "mlx"
    device: str  # "cpu", "cuda:0", "mps", "metal"
    dtype: str  # the precision the weights compute in, e.g. "float32" or "int4 (affine, g32)"
    folder: Path
    vocab_size: int  # width of the logits (may exceed the tokenizer's real vocabulary: padding)
    context_length: int  # positions the model supports
    model_type: str
    weights_bytes: int

    @abstractmethod
    def reset(self) -> None:
        """Start a new, empty cache."""

    @property
    @abstractmethod
    def cache_len(self) -> int:
        """How many positions the cache holds."""

    @abstractmethod
    def can_trim(self) -> bool:
        """False for caches with recurrent state (hybrid models), which cannot be rolled back."""

    @abstractmethod
    def trim(self, n: int) -> None:
        """Drop the last `n` positions from the cache."""

    @abstractmethod
    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        """Append `ids` to the cache in one forward pass and pick the token that follows them."""

    def describe(self) -> str:
        return f"{self.name} on {self.device}, {self.dtype}"
