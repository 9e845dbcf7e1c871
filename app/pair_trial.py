"""The quick pair trial after a pair loads: a few built-in prompts, each decoded by the target
alone and speculatively, greedily, back to back on the same machine. It gives the user the
pair's measured acceptance and speedup ("accepts 71%, 2.1x faster here (2.0-2.2x)") instead of a
promise, and warms the adaptive controller up for the first real answer.

The prompts run in TRIAL_PASSES passes, the second with speculation first, so that neither side
always runs warm; each pass gives a speedup, and their min and max are the range the figure is
shown with. Two trials of the same pair differed by more than the gap between two drafts (0.96x
and 1.18x for the demo's head), so a claim (faster, slower, one draft over another) stands only
where the range clears it, as the bench's figures do (app/bench/report.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.draft_choice import NO_DRAFT, PAIR_DRAFT
from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from app.models.pair_memory import TrialResult
from app.runner import CancelToken, ChatRequest, Runner

# Short, varied asks: code, a list, an explanation. Speculation gains differ by kind of text.
TRIAL_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five tips for writing clear emails.",
    "Explain in three sentences why the sky is blue.",
)
TRIAL_TOKENS = 40
TRIAL_PASSES = 2  # the prompts twice: target alone first, then speculation first


@dataclass
class TrialProgress:
    """What a trial has measured so far. A trial gives way to every real request and resumes
    between messages from the next whole prompt (both sides of a prompt are timed back to back,
    so each ratio compares like with like)."""

    done: int = 0  # prompt runs measured, both sides (len(prompts) * TRIAL_PASSES in all)
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    gave_way: bool = False  # the last run stopped for a real request: resume it later
    passes: list[list[float]] = field(default_factory=list)  # per pass: alone s, alone n, spec s, spec n

    def speedups(self) -> list[float]:
        """The speedup of each pass measured so far."""
        return [(sn / ss) / (an / a_s) for a_s, an, ss, sn in self.passes if a_s and an and ss and sn]

    def _total(self, column: int) -> float:
        return sum(row[column] for row in self.passes)

    alone_s = property(lambda self: self._total(0))
    alone_n = property(lambda self: int(self._total(1)))
    spec_s = property(lambda self: self._total(2))
    spec_n = property(lambda self: int(self._total(3)))


def run_trial(runner: Runner, cancelled: Callable[[], bool] = lambda: False,
              prompts: tuple[str, ...] = TRIAL_PROMPTS, tokens: int = TRIAL_TOKENS,
              progress: TrialProgress | None = None) -> TrialResult | None:
    """Measure the loaded pair; None when it gave way (a real request wants the engine:
    `progress.gave_way`, and a later call with the same `progress` resumes) or the pair has no
    drafter to try. Throughput is decode tokens over decode time, summed over the prompts, so an
    answer that ends early at a stop token still compares fairly."""
    progress = progress or TrialProgress()
    progress.gave_way = False
    if runner.loaded is None or runner.drafter is None:
        return None
    runs = [(n, prompt) for n in range(TRIAL_PASSES) for prompt in prompts]
    for number, prompt in runs[progress.done:]:
        messages = ({"role": "user", "content": prompt},)
        measured = {}
        for drafter in ((NO_DRAFT, PAIR_DRAFT) if number % 2 == 0 else (PAIR_DRAFT, NO_DRAFT)):
            if cancelled():
                progress.gave_way = True
                return None
            request = ChatRequest(messages, max_tokens=tokens, params=SamplingParams(), drafter=drafter,
                                  cancel=CancelToken(also=cancelled))
            finished = None
            for event in runner.chat(request):
                if isinstance(event, Finished):
                    finished = event
            if finished is None or finished.stats.finish_reason == "cancelled":
                progress.gave_way = True
                return None
            measured[drafter] = finished.stats
        alone, spec = measured[NO_DRAFT], measured[PAIR_DRAFT]
        while len(progress.passes) <= number:
            progress.passes.append([0.0, 0, 0.0, 0])
        for i, value in enumerate((alone.decode_s, alone.decode_tokens, spec.decode_s, spec.decode_tokens)):
            progress.passes[number][i] += value
        progress.drafted += spec.drafted
        progress.accepted += spec.accepted
        progress.rounds += spec.rounds
        progress.done += 1
    p = progress
    if not (p.alone_s and p.spec_s and p.alone_n and p.spec_n):
        return None
    speedup = (p.spec_n / p.spec_s) / (p.alone_n / p.alone_s)
    each = p.speedups()
    if len(each) == TRIAL_PASSES:  # a pass that measured nothing gives no range, not a narrow one
        each.append(speedup)  # and the whole trial's own, so the figure lies within its range
    low, high = (min(each), max(each)) if len(each) > TRIAL_PASSES else (None, None)
    return TrialResult(
        acceptance=p.accepted / p.drafted if p.drafted else 0.0,
        speedup=speedup,
        tokens_per_pass=p.spec_n / p.rounds if p.rounds else 0.0,
        tokens=p.spec_n, measured_at=time.time(), low=low, high=high)
