"""What the engine needs from a loaded model, whatever the array library.

A backend owns one model and its cache (app/engine/cache.py). Positions in the cache are the
committed tokens; the engine appends with forward passes and rolls back to a checkpoint taken
before a pass that may be rejected. Arrays never cross this interface except as Python ints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.engine.cache import Checkpoint, ModelCache
from app.engine.sampling import SamplingParams

# How a PyTorch target decodes: compiled decoder layers, eager, or the measured choice per device
# (app/engine/backends/compile_torch.py). Here, free of torch, for the CLI's choices.
COMPILE_CHOICES = ("auto", "on", "off")
# How a PyTorch rewind rebuilds recurrent state over the kept positions (torch_cache.py): "layers",
# each recurrent mixer alone on the inputs it recorded in the pass; "model", the caller passes the
# kept tokens through the whole model again (what the engine did first; kept to measure one
# against the other).
STATE_REPLAYS = ("layers", "model")


def check_choice(what: str, value: str, choices) -> str:
    """`value` when it is one of `choices`, else a ValueError that names them."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return value


def check_layers(layers: tuple[int, ...], count: int) -> str:
    """"" where `layers` names inner states a target of `count` decoder layers has: layer i < count
    is the residual stream entering decoder layer i (HF's `hidden_states[i]`: 0 is the embedding),
    i == count the last layer's output before the final norm; else why not."""
    wrong = [i for i in layers if not 0 <= int(i) <= count]
    if wrong:
        return f"it reads layer {wrong[0]}, and this model has {count} decoder layers"
    if len(set(layers)) != len(layers):
        return f"it names layer {next(i for i in layers if layers.count(i) > 1)} twice"
    return ""


def entropy_seed() -> int:
    """A seed from the operating system's entropy: unseeded sampling differs on every run."""
    return secrets.randbits(63)


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafts the target accepted (a prefix)
    token: int  # the target's own token after them: the correction, or the bonus after k
    q: tuple[float, ...]  # the target's probability of each drafted token


class ModelBackend(ABC):
    name: str  # "torch" or "mlx"
    device: str  # "cpu", "cuda:0", "mps", "metal"
    dtype: str  # the precision the weights compute in, e.g. "float32" or "int4 (affine, g32)"
    folder: Path
    vocab_size: int  # width of the logits (may exceed the tokenizer's real vocabulary: padding)
    context_length: int  # positions the model supports
    model_type: str
    weights_bytes: int
    vocab_limit: int  # logits are cut to the tokenizer's real vocabulary (padded embeddings)
    device_note: str = ""  # why it runs where it runs, when a user would expect otherwise
    logits_dtype: str = "float32"  # what the logits are rounded to (the near-tie threshold follows it)
    # Passes that did one-time work besides the pass (a CUDA graph captured): the engine keeps
    # such a round's timings out of the costs that choose k, which a 100x capture once ruined.
    one_time_work: int = 0
    # The token ids in the cache as the engine last left it (app/engine/reuse.py); () when unknown.
    held: tuple[int, ...] = ()
    cache: ModelCache  # what the model holds of the tokens it has read (app/engine/cache.py)

    @abstractmethod
    def reset(self) -> None:
        """Start a new, empty cache."""

    def park(self) -> object:
        """The cache with what it holds, for restore() to put back later (a conversation set aside
        keeps its cache: app/engine/kept_caches.py); the caller then restores another or resets."""
        return self.cache, self.held

    def restore(self, state: object) -> None:
        """Put back a cache that park() handed over."""
        self.cache, self.held = state

    def cache_bytes(self) -> int:
        """Memory the cache holds (its buffers, spare room included)."""
        return self.cache.nbytes()

    @property
    def cache_len(self) -> int:
        """How many positions the cache holds."""
        return self.cache.length

    def rollback_room(self) -> int | None:
        """How many more positions the cache can take and still be cut back exactly: None when
        any number can, 0 when none can (a sliding window that is full)."""
        return self.cache.rollback_room()

    def no_rollback_reason(self) -> str:
        """Why `rollback_room()` is limited, in a user's words (the kind of layer that limits it)."""
        if self.cache.blocked:
            return (f"the target's ({self.model_type}) cache cannot be rolled back after a rejected draft: "
                    f"{self.cache.blocked}")
        windows = self.cache.sliding_windows()
        if not windows:
            return f"the target's ({self.model_type}) cache cannot be rolled back after a rejected draft"
        return (f"the target ({self.model_type}) attends over a sliding window of {min(windows):,} tokens, "
                "which is full: its cache cannot be rolled back past the window")

    def can_trim(self) -> bool:
        return self.rollback_room() != 0

    def tree_note(self) -> str:
        """"" where `verify_tree` takes a tree of drafts in one pass (app/engine/tree.py); else
        why this target verifies chains only."""
        return f"{self.name} verifies chains of drafts only"

    def checkpoint(self) -> Checkpoint:
        """Mark the cache before a pass that may be rejected (app/engine/cache.py)."""
        return self.cache.checkpoint()

    def rewind(self, mark: Checkpoint, length: int) -> int:
        """Cut back to `length` positions after a pass taken at `mark`; returns the positions now
        held (fewer where recurrent state went back to the checkpoint and was not advanced again
        layer by layer: the caller passes the tokens in between again)."""
        return self.cache.rewind(mark, length)

    @property
    def recomputed(self) -> int:
        """Positions whose recurrent state the last `rewind` advanced again itself, layer by layer
        (included in what it returns: the caller passes none of them again)."""
        return self.cache.recomputed

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions where no checkpoint is needed: attention layers,
        layer by layer (a pass that failed midway may have extended only some)."""
        self.cache.cut(length)

    @abstractmethod
    def capture_hidden(self, on: bool, layers: tuple[int, ...] = ()) -> str:
        """On: every pass keeps a hidden state of each position it reads for `last_hidden`, for
        drafters that condition on the target: with no `layers` the final norm's output (what the
        head reads); with `layers` (EAGLE-3's and DFlash's inner states) the residual stream
        entering each named decoder layer, side by side in the order named, (n, len(layers) *
        hidden) (see `check_layers`). Off: nothing is kept (plain pairs pay nothing). Returns ""
        or why it cannot."""

    @abstractmethod
    def last_hidden(self):
        """(n, hidden) on the device: the last pass's positions, in order (None when off)."""

    def join_hidden(self, parts: list):
        """Several passes' `last_hidden` rows as one (n, hidden), in order (a prompt read in
        chunks); None where this backend cannot join them."""
        return parts[0] if len(parts) == 1 else None

    @abstractmethod
    def seed(self, seed: int | None) -> None:
        """Start this generation's random stream: from `seed` when one is given (every time, so a
        repeated seed repeats the answer), otherwise from the operating system's entropy. Each
        backend has its own stream: a draft must never reuse the target's noise (the
        Leviathan/Chen proof needs the draft's sample independent of the acceptance test's)."""

    @abstractmethod
    def top2(self, ids: Sequence[int]) -> tuple[float, float]:
        """The two largest logits after `ids` on a fresh cache (the cache is reset after)."""

    def top2_gap(self, ids: Sequence[int]) -> float:
        """Top-1 minus top-2 logit after `ids` on a fresh cache. Tells a near-tie (numerics) from a
        bug when a temperature-0 output diverges."""
        first, second = self.top2(ids)
        return first - second

    @abstractmethod
    def prefill(self, ids: Sequence[int]) -> None:
        """Append `ids` to the cache (no token is picked)."""

    @abstractmethod
    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        """Append `ids` to the cache in one forward pass and pick the token that follows them."""

    @abstractmethod
    def draft(self, ids: Sequence[int], k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None):
        """Append `ids`, then decode `k` tokens (appending all but the last to the cache); fewer
        (possibly none) when `should_stop()` turns true between steps.

        Returns (ids, p, probs, ids_array): the drafted ids, the draft's probability of each
        (at temperature 0 the softmax at temperature 1, for display), and on the device the
        (k, V) draft distributions (None when greedy) and the ids. One transfer to Python.
        """

    @abstractmethod
    def verify(self, ids: Sequence[int], proposal, params: SamplingParams) -> "Verdict":
        """Append `ids` (what the cache lacks of the committed tokens, then the k drafts) in one
        forward pass and decide from the logits of its last k + 1 positions.

        Greedy: accept while the draft equals the target's argmax. Sampling: the Leviathan/Chen
        rule. Returns a Verdict; the caller trims the rejected positions from the cache.
        """
