"""The KV cache of the lean step (lean_step_torch.py): one buffer for every layer's keys and values.

`store` is (layers, 2, kv_heads, capacity, head_dim): a pass writes its positions in place and
attention reads views of the filled part, so a decode step copies nothing, a rollback only moves
the length back (the next pass overwrites what was cut), and the buffer's address stays the same
for as long as its capacity does, which is what a captured CUDA graph needs (cuda_graphs_torch.py).

Two ways to size it: grown in blocks of STEP positions as a chat gets longer (eager passes, where
no graph holds the address: the CPU), or `fixed` at the planned context from the start (graphs: a
grown buffer would be a new address, and every graph captured on the old one stale). The memory
check counts the planned context's KV whichever way (app/models/memory.py).
"""

from __future__ import annotations

import torch

from app.engine.cache import ModelCache

STEP = 256  # positions a growing buffer adds when full: a decode step rarely copies anything

class ContextFullError(RuntimeError):
    """A pass would write past a fixed buffer's planned context."""


class StaticKV(ModelCache):
    """Attention layers only: trimming is exact, nothing recurrent, no sliding window."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 0, fixed: bool = False):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device, self.fixed = dtype, torch.device(device), fixed
        self.store: torch.Tensor | None = None
        self._length = 0
        if capacity:
            self.store = self._empty(capacity)

    def _empty(self, capacity: int) -> torch.Tensor:
        # (layers, 2 = keys/values, kv_heads, positions, head_dim). A fixed buffer starts at zeros:
        # a bucketed pass attends past the filled part under a mask, and a masked NaN from
        # uninitialised memory would still poison the softmax (0 * NaN); later passes leave only
        # finite values behind.
        make = torch.zeros if self.fixed else torch.empty
        return make(self.layers, 2, self.kv_heads, capacity, self.head_dim, dtype=self.dtype,
                           device=self.device)

    @property
    def capacity(self) -> int:
        return 0 if self.store is None else self.store.shape[3]

    @property
    def length(self) -> int:
        return self._length

    @property
    def recurrent(self) -> bool:
        return False

    def reserve(self, end: int, planned: int = 0) -> None:
        """Room for positions up to `end` (a pass about to write them). A fixed buffer is allocated
        once, for `planned` positions (the context, with room for a padded pass)."""
        if end <= self.capacity:
            return
        if self.fixed and self.store is not None:
            raise ContextFullError(f"the cache holds {self.capacity:,} positions, and this pass needs {end:,}")
        store = self._empty(max(-(-end // STEP) * STEP, planned if self.fixed else 0))
        if self._length:
            store[:, :, :, :self._length] = self.store[:, :, :, :self._length]
        self.store = store

    def appended(self, n: int) -> None:
        """A pass wrote `n` positions after the committed ones (only once it completed: a pass that
        failed midway leaves the length as it was, and what it wrote past it is overwritten)."""
        self._length += n

    def rollback_room(self) -> int | None:
        return None

    def sliding_windows(self) -> list[int]:
        return []

    def trim(self, length: int) -> None:
        self._length = max(0, min(self._length, length))

    def keep(self, first: int, rows: list[int]) -> None:
        """After a tree's pass: the positions `rows` (the accepted path's, ascending) moved to
        first, first + 1, ... in order, and everything past them dropped. Each row is at or past
        the slot it moves to, and the slots fill in order, so no row is overwritten before read."""
        if rows and rows != list(range(first, first + len(rows))):
            source = torch.tensor(rows, device=self.store.device)
            self.store[:, :, :, first:first + len(rows)] = self.store.index_select(3, source)
        self.trim(first + len(rows))

    def snapshot(self):
        return None

    def restore(self, state) -> None:
        pass

    def nbytes(self) -> int:
        return 0 if self.store is None else self.store.nbytes

    def parked(self) -> StaticKV:
        """A copy of the filled part in a buffer of its own, for a conversation set aside while the
        live buffer (whose address graphs hold) serves another."""
        copy = StaticKV(self.layers, self.kv_heads, self.head_dim, self.dtype, self.device)
        if self._length:
            copy.store = self.store[:, :, :, :self._length].clone()
            copy._length = self._length
        return copy

    def load(self, other: StaticKV) -> None:
        """Put `other`'s positions into this buffer, in place (the inverse of `parked`)."""
        self.reserve(other.length)
        if other.length:
            self.store[:, :, :, :other.length] = other.store[:, :, :, :other.length]
        self._length = other.length
