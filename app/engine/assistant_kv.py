"""Which of the target's keys and values a Gemma 4 assistant reads (app/engine/assistant.py says
why): the rules its backend modules (app/engine/backends/assistant_*.py) apply to the target's
caches. Array-free, and apart from the drafter so the backends read them without importing the
module that loads them."""

from __future__ import annotations

from collections.abc import Sequence


def kv_producers(layer_types: Sequence[str], first_shared: int) -> dict[str, int]:
    """Which target layer's keys and values each kind of layer reads: the last layer of that kind
    before the target's own KV-shared layers (transformers' `kv_sharing_modes` "store")."""
    return {kind: i for i, kind in enumerate(layer_types[:first_shared])}


def window_start(position: int, window: int) -> int:
    """The first position a sliding layer's query at `position` sees: its window ends at itself
    (the target's own rule), and the assistant's query has no key of its own there."""
    return max(0, position - window + 1)
