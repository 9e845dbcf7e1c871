"""Several conversations' caches, so that going back to an earlier chat starts fast too.

The backends hold the caches of the conversation answered last (app/engine/reuse.py). When a
request comes for another conversation, the current caches are set aside under their
conversation's id and that conversation's own caches, if still kept, are put back; a
conversation never seen, or evicted, starts from empty caches. Set-aside caches live within a
memory budget: the least recently used conversation's go first (as LM Studio and mlx-lm's
server keep prompt caches). Only references move: nothing is copied, and a cache put back holds
exactly what it held.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from app.engine.backends.base import ModelBackend
from app.models.memory import size_text

DEFAULT_BUDGET_FRACTION = 8  # of the machine's memory, for caches set aside
MIN_BUDGET, MAX_BUDGET = 256 << 20, 4 << 30


def default_budget(total_memory: int) -> int:
    return max(MIN_BUDGET, min(MAX_BUDGET, total_memory // DEFAULT_BUDGET_FRACTION))


@dataclass
class _SetAside:
    states: list[object]  # each backend's park() result, in the order of the backends
    bytes: int


class KeptCaches:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.current: str | None = None  # whose caches the backends hold now
        self._aside: OrderedDict[str, _SetAside] = OrderedDict()  # least recently used first

    def switch(self, conversation: str, backends: list[ModelBackend]) -> bool:
        """Give `backends` the caches of `conversation`; True when they were kept."""
        if conversation == self.current:
            return True
        kept = self._aside.pop(conversation, None)  # before evicting: the chat asked for stays
        if self.current:  # a one-off request ("": the pair trial, the CLI) is not a chat anyone returns to
            size = sum(b.cache_bytes() for b in backends)
            if size and size <= self.budget:
                self._aside[self.current] = _SetAside([b.park() for b in backends], size)
                self._evict()
        if kept is not None:
            for backend, state in zip(backends, kept.states, strict=True):
                backend.restore(state)
        else:
            for backend in backends:
                backend.reset()
        self.current = conversation
        return kept is not None

    def forget(self) -> None:
        """A new pair: caches of the old one say nothing about it."""
        self._aside.clear()
        self.current = None

    def _evict(self) -> None:
        while self.set_aside_bytes > self.budget:
            self._aside.popitem(last=False)

    @property
    def set_aside_bytes(self) -> int:
        return sum(entry.bytes for entry in self._aside.values())

    @property
    def conversations(self) -> list[str]:
        """Set-aside conversations, least recently used first."""
        return list(self._aside)

    def summary(self) -> str:
        """"2 other chats kept, 41 MB of 2.0 GB", for the status bar."""
        n = len(self._aside)
        if not n:
            return ""
        return (f"{n} other chat{'s' if n > 1 else ''} kept, "
                f"{size_text(self.set_aside_bytes)} of {size_text(self.budget)}")
