"""What a drafter head on PyTorch keeps beside its layers (an MTP layer, an EAGLE-3 head, a DFlash
drafter): its own KV cache, transformers' DynamicCache over the head's config, cut back to a
length after each round, and its own random stream (the target's would be shared with it, and
rejection sampling needs the two independent)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from app.engine.backends.base import entropy_seed


class CachedHead:
    """A mixin: the class sets `config` (its layers' transformers config) and calls
    `_own_stream(device)` in its __init__."""

    config = None
    cache: DynamicCache

    def _own_stream(self, device) -> None:
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(entropy_seed())

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def trim(self, length: int) -> None:
        if self.length > length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count removes that many

    def concat(self, rows, more):
        return torch.cat([rows, more])

    def seed(self, seed: int | None) -> None:
        self._generator.manual_seed(entropy_seed() if seed is None else seed)
