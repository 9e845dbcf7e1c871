"""The quick pair trial after a pair loads: a few built-in prompts, each decoded by the target
alone and then speculatively, greedily, in the same minute on the same machine. It gives the
user the pair's measured acceptance and speedup ("accepts 71%, about 2.1x faster here") instead
of a promise, and warms the adaptive controller up for the first real answer."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from app.models.pair_memory import TrialResult
from app.runner import DRAFT_NONE, ChatRequest, Runner

# Short, varied asks: code, a list, an explanation. Speculation gains differ by kind of text.
TRIAL_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five tips for writing clear emails.",
    "Explain in three sentences why the sky is blue.",
)
TRIAL_TOKENS = 40


def run_trial(runner: Runner, cancelled: Callable[[], bool] = lambda: False,
              prompts: tuple[str, ...] = TRIAL_PROMPTS, tokens: int = TRIAL_TOKENS) -> TrialResult | None:
    """Measure the loaded pair; None when it was cancelled (a real request wants the engine)
    or the pair has no drafter to try. Throughput is decode tokens over decode time, summed over
    the prompts, so an answer that ends early at a stop token still compares fairly."""
    if runner.loaded is None or runner.drafter is None:
        return None
    alone_s = alone_n = spec_s = spec_n = drafted = accepted = rounds = 0
    for prompt in prompts:
        messages = ({"role": "user", "content": prompt},)
        for drafter in (DRAFT_NONE, "pair"):
            if cancelled():
                return None
            request = ChatRequest(messages, max_tokens=tokens, params=SamplingParams(), drafter=drafter)
            finished = None
            for event in runner.chat(request):
                if isinstance(event, Finished):
                    finished = event
            if finished is None or finished.stats.finish_reason == "cancelled":
                return None
            stats = finished.stats
            if drafter == DRAFT_NONE:
                alone_s, alone_n = alone_s + stats.decode_s, alone_n + stats.decode_tokens
            else:
                spec_s, spec_n = spec_s + stats.decode_s, spec_n + stats.decode_tokens
                drafted, accepted, rounds = drafted + stats.drafted, accepted + stats.accepted, rounds + stats.rounds
    if not (alone_s and spec_s and alone_n and spec_n):
        return None
    return TrialResult(
        acceptance=accepted / drafted if drafted else 0.0,
        speedup=(spec_n / spec_s) / (alone_n / alone_s),
        tokens_per_pass=spec_n / rounds if rounds else 0.0,
        tokens=spec_n, measured_at=time.time())
