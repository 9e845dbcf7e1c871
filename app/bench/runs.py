"""One measured generation, whoever produced it: Tandem's loop or an anchor."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.engine.adaptive import DraftLengthController
from app.engine.drafters import Drafter
from app.engine.events import Finished, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate


@dataclass
class RunResult:
    tokens: list[int]  # the answer's token ids
    decode_tokens: int  # tokens produced after the first one (the prefill's)
    decode_s: float  # wall clock from the first token to the last
    rounds: int | None = None  # target passes after the prefill (None: the anchor does not say)
    drafted: int | None = None
    accepted: int | None = None
    accepted_by_position: tuple[int, ...] = ()
    reached_by_position: tuple[int, ...] = ()
    draft_s: float = 0.0  # time the drafter spent (Tandem only)
    verify_s: float = 0.0  # time in the target's passes after the prefill (Tandem only)
    rollback_s: float = 0.0  # both caches' checkpoints and rewinds, replays included (Tandem only)
    replayed: int = 0  # tokens the target passed again after recurrent state went back (Tandem only)
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


class StreamClock:
    """Times an anchor's stream. Anchors do not say when their prefill ends (assisted generation
    verifies its first drafts in the same pass), so the prefill is timed on its own just before
    and taken off: decode seconds = (last token - start) - prefill, over all tokens but the first."""

    def __init__(self, prefill_s: float | None):
        """prefill_s None: the stream's first token marks the prefill's end (mlx-lm yields it
        right after; for its speculative stream that also leaves one round out, in its favour)."""
        self.prefill_s = prefill_s
        self.start = time.perf_counter()
        self.first_at: float | None = None
        self.last_at = self.start
        self.count = 0

    def tick(self, n: int = 1) -> None:
        self.last_at = time.perf_counter()
        self.first_at = self.first_at or self.last_at
        self.count += n

    def result(self, tokens: list[int]) -> RunResult:
        if self.prefill_s is None:
            seconds = max(self.last_at - (self.first_at or self.last_at), 1e-9)
        else:
            seconds = max(self.last_at - self.start - self.prefill_s, 1e-9)
        # Answer tokens only, as Tandem counts them: a stop token the stream also pushed is not
        # part of the answer (its pass is in the time, as Tandem's last pass is).
        return RunResult(tokens, max(min(self.count, len(tokens)) - 1, 0), seconds if self.count > 1 else 0.0)


def run_tandem(target, decode, prompt_ids: Sequence[int], drafter: Drafter | None, max_tokens: int,
               params: SamplingParams, stop_ids: frozenset[int], draft_tokens: int | None,
               controller: DraftLengthController | None = None, trees: str = "auto") -> RunResult:
    tokens: list[int] = []
    draft_s = verify_s = rollback_s = 0.0
    for event in generate(target, decode, prompt_ids, drafter=drafter, stop_ids=stop_ids,
                          max_tokens=max_tokens, params=params, draft_tokens=draft_tokens,
                          controller=controller, repeatable=False, trees=trees):  # seeds align noise across methods;
        # k follows the clock as in chat, where answers are unseeded
        if isinstance(event, Round):
            tokens.extend(event.emitted)
            draft_s += event.draft_s
            verify_s += event.verify_s if event.index > 0 else 0.0  # round 0 is the prefill
            rollback_s += event.rollback_s
        elif isinstance(event, Finished):
            s = event.stats
            return RunResult(tokens, s.decode_tokens, s.decode_s, s.rounds, s.drafted, s.accepted,
                             s.accepted_by_position, s.reached_by_position, draft_s, verify_s,
                             rollback_s, s.replayed, {"finish": s.finish_reason})
    raise RuntimeError("the engine ended without a Finished event")
