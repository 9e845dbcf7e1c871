"""The event stream every consumer reads: the window, the CLI, the server and the benchmarks.

One immutable `Round` per target forward pass, then one `Finished`. Plain decoding is the
degenerate case: nothing drafted, one token emitted per round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Round:
    index: int
    drafted: tuple[int, ...]  # what the drafter proposed this round (empty when decoding plainly)
    accepted: int  # how many of `drafted` the target accepted (a prefix)
    emitted: tuple[int, ...]  # tokens committed this round: accepted drafts + the target's own
    text: str  # the text delta these tokens completed (may lag a token for split characters)
    draft_p: tuple[float, ...] = ()  # the draft's probability of each drafted token
    target_q: tuple[float, ...] = ()  # the target's probability of each drafted token
    draft_s: float = 0.0
    verify_s: float = 0.0
    k: int = 0  # draft length asked for this round (0: plain decoding)
    source: str = ""  # who drafted: "model", "lookup" ("" when nothing was drafted)
    # Both caches' rollback (app/engine/cache.py): the target's checkpoint before the verify pass
    # and rewind after, and the drafter's own; on hybrid models a copy of recurrent state and a
    # replay of the kept tokens, next to nothing on attention-only ones.
    rollback_s: float = 0.0
    replayed: int = 0  # committed tokens this pass read again: recurrent state went back a round
    # the tree of drafts the pass verified (app/engine/tree.py's TokenTree; None: a chain): `drafted`
    # is then the path the verdict walked, and the drafter's first guess where it stopped
    tree: Any = None


@dataclass(frozen=True)
class PrefillProgress:
    """How far the reading of a long prompt has gone: `done` of its `total` chunks
    (app/engine/prefill.py). Sent only for a prompt of more than one chunk: once with done = 0
    before anything is read, then after each chunk but the last, whose pass gives the first token
    (Round 0 follows it)."""

    done: int
    total: int


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    tokens: int  # committed answer tokens (stop token excluded)
    rounds: int  # target forward passes after the prefill (a pass that only ended the answer too)
    decode_tokens: int  # answer tokens those passes produced (the first comes from the prefill;
    #                     a stop token is not part of the answer and is not counted)
    drafted: int  # drafts up to the answer's end; drafts past it were waste and are not counted
    accepted: int
    prefill_s: float
    decode_s: float  # wall clock from the first token to the last, loop and consumer included
    finish_reason: str  # "stop", "length", "stop_string", "context", "cancelled"
    accepted_by_position: tuple[int, ...] = field(default=())
    drafted_by_position: tuple[int, ...] = field(default=())
    # rounds that drafted position i with every earlier draft accepted: a_i = accepted / reached
    reached_by_position: tuple[int, ...] = field(default=())
    # prompt tokens the target's cache already held from the previous turn (app/engine/reuse.py):
    # the prefill passed only prompt_tokens - reused_tokens
    reused_tokens: int = 0
    rollback_s: float = 0.0  # both caches' checkpoints and rewinds, all rounds (Round.rollback_s)
    replayed: int = 0  # committed tokens passes read again after recurrent state went back
    # trees of drafts (app/engine/tree_choice.py): rounds that verified one, trees the chooser
    # priced slower than their chain and declined, and the tokens tree rounds emitted beyond what
    # their chains would have
    trees: int = 0
    trees_declined: int = 0
    tree_gain: int = 0

    @classmethod
    def nothing_written(cls, prompt_tokens: int = 0, prefill_s: float = 0.0) -> GenerationStats:
        """An answer cancelled before its first token (waiting, or while its prompt was read)."""
        return cls(prompt_tokens=prompt_tokens, tokens=0, rounds=0, decode_tokens=0, drafted=0, accepted=0,
                   prefill_s=prefill_s, decode_s=0.0, finish_reason="cancelled")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.decode_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens the decode passes produced over the time they took."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def summary(self) -> str:
        line = (f"{self.tokens} tokens in {self.decode_s:.2f}s = {self.tokens_per_s:.1f} tok/s, "
                f"prefill {self.prompt_tokens - self.reused_tokens} tokens in {self.prefill_s:.2f}s"
                f"{f' ({self.reused_tokens} reused)' if self.reused_tokens else ''}")
        if self.rounds or self.tokens <= 1:  # a remote server that reports no passes: none are claimed
            line += f", {self.rounds} target passes ({self.tokens_per_round:.2f} tokens/pass)"
        if self.drafted:
            line += f", acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})"
        if self.trees or self.trees_declined:
            line += (f", {self.trees} tree{'s' if self.trees != 1 else ''} verified "
                     f"({self.tree_gain:+d} tokens beyond their chains)"
                     f"{f', {self.trees_declined} declined' if self.trees_declined else ''}")
        return line + f", finish: {self.finish_reason}"


@dataclass(frozen=True)
class Finished:
    stats: GenerationStats
    text: str  # the whole answer


class PromptTooLongError(ValueError):
    """The prompt leaves no room to generate within the model's context."""


class EmptyPromptError(ValueError):
    """The prompt has no tokens (a model without a chat template, and an empty message)."""


@dataclass(frozen=True)
class Notice:
    """Something the user should know about this generation (e.g. why it decodes plainly)."""

    message: str
