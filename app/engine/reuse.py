"""Follow-up turns prefill only what is new: a cache keeps the conversation it last held.

After an answer, a backend's cache holds the prompt and the answer so far (`held`, recorded by
the engine). The next turn's prompt repeats all of that and adds the new message, so the longest
common token prefix of `held` and the new prompt stays in the cache and only the rest is
prefilled (mlx-lm's server and LM Studio do the same). An edit or a regenerate shares a shorter
prefix: the cache is cut back to it where that is exact (`ModelCache.can_cut`: attention layers
always, sliding windows while they hold the prefix's last window, recurrent state only where
nothing needs cutting) and starts empty elsewhere. Anything that changed the cache behind the
engine's back (a reset, another caller's pass) makes `held` disagree with the cache's length,
which voids it.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.backends.base import ModelBackend


def reusable(backend: ModelBackend, prompt_ids: Sequence[int]) -> int:
    """How many leading positions of `backend`'s cache `prompt_ids` can keep (at least one token
    of the prompt is always passed again: its logits pick the first answer token)."""
    held = backend.held
    if not held or len(held) != backend.cache_len:
        return 0
    limit = min(len(held), len(prompt_ids) - 1)
    same = 0
    while same < limit and held[same] == prompt_ids[same]:
        same += 1
    if not backend.cache.can_cut(same):
        return 0  # recurrent state, or a sliding window that no longer holds it: start afresh
    return same


def start_cache(backend: ModelBackend, prompt_ids: Sequence[int], reuse: bool) -> int:
    """Ready `backend`'s cache for `prompt_ids`: cut back to the reusable prefix (when `reuse`)
    or start empty. Returns how many prompt positions are already in the cache."""
    keep = reusable(backend, prompt_ids) if reuse else 0
    if keep:
        backend.truncate(keep)
    else:
        backend.reset()
    backend.held = ()  # unknown until the answer ends and `remember` records it
    return keep


def remember(backend: ModelBackend, committed: Sequence[int] | None) -> None:
    """Record what the cache holds after an answer: the first cache_len tokens of `committed`
    (None: a pass failed midway, so nothing is known)."""
    length = backend.cache_len
    backend.held = tuple(committed[:length]) if committed is not None and length <= len(committed) else ()
