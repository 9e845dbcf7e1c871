"""Measured costs for the bound: the target's forward pass at each width, the draft's per token.

Timed through the same backend calls the loop makes (next_token for width 1, verify for wider
passes, draft for one draft token), at a context length typical of the run, after a warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from app.engine.backends.base import ModelBackend
from app.engine.drafters import Proposal
from app.engine.sampling import SamplingParams

GREEDY = SamplingParams()


def measure_target_costs(target: ModelBackend, context: Sequence[int], widths: Sequence[int],
                         repeats: int = 5) -> dict[int, float]:
    """Median seconds of one target pass of each width, widths interleaved so drift cancels."""
    target.reset()
    target.prefill(context[:-1])
    pending = context[-1]
    filler = list(context[: max(widths)])  # real tokens as drafts: verification does its usual work
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for repeat in range(repeats + 1):
        for width in widths:
            drafts = tuple(filler[: width - 1])
            mark = target.checkpoint()  # each pass is rolled back to the same length
            start = time.perf_counter()
            if width == 1:
                target.next_token([pending], GREEDY)
            else:
                target.verify([pending, *drafts], Proposal(drafts, (1.0,) * len(drafts)), GREEDY)
            seconds = time.perf_counter() - start
            target.rewind(mark, mark.length)
            if repeat:  # the first sweep warms caches and allocators up
                samples[width].append(seconds)
    target.reset()
    return {w: statistics.median(v) for w, v in samples.items()}


def measure_draft_cost(draft: ModelBackend, context: Sequence[int], repeats: int = 5) -> float:
    """Median seconds for the draft model to propose one token."""
    draft.reset()
    draft.prefill(context[:-1])
    samples = []
    for repeat in range(repeats + 1):
        mark = draft.checkpoint()
        start = time.perf_counter()
        draft.draft([context[-1]], 1, GREEDY)
        seconds = time.perf_counter() - start
        draft.rewind(mark, mark.length)
        if repeat:
            samples.append(seconds)
    draft.reset()
    return statistics.median(samples)
