"""The speedup's yardstick: the target alone's measured seconds per token on this machine.

One timing is one sample, and on a busy machine samples spread widely (0.4 to 1.7 tok/s were
seen in one sitting), so a single timing at load cannot carry the speedup. The baseline keeps the
latest samples and reports their median with the min-max, as the bench does. Samples are taken
in the answers' own conditions: when the pair loads, and again after every answer (while the
engine is idle) at the context the chat has reached, so a machine that slows down slows the
baseline with the answers it is compared with.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

KEEP = 7  # samples kept: enough for a median that one noisy moment cannot move

# What a speedup may claim (the design's interval rule: a claim stands only where the measured
# range clears it). The window colours FASTER green and SLOWER red, ABOUT in no colour.
FASTER, SLOWER, ABOUT = "faster", "slower", "about as fast"


def speedup_verdict(low: float, high: float, timings: int) -> str:
    """FASTER or SLOWER only once the whole range is on one side of 1; ABOUT until then. One
    timing of the target alone is no range at all (its spread is unknown), so it claims nothing."""
    if timings < 2 or not (math.isfinite(low) and math.isfinite(high)):
        return ABOUT
    if low > 1.0:
        return FASTER
    if high < 1.0:
        return SLOWER
    return ABOUT


@dataclass(frozen=True)
class Speedup:
    median: float  # the baseline's median seconds per token over ours
    low: float  # against the fastest sample of the target alone
    high: float  # against the slowest
    timings: int = 1  # samples of the target alone the range spans

    def text(self) -> str:
        return f"{self.median:.2f}× [{self.low:.2f}-{self.high:.2f}]"

    def verdict(self) -> str:
        return speedup_verdict(self.low, self.high, self.timings)


@dataclass(frozen=True)
class Baseline:
    samples: tuple[float, ...]  # seconds per token of the target alone, oldest first
    context: int  # context length (tokens) at which the newest sample was taken
    tokens: int  # tokens decoded per sample

    @classmethod
    def first(cls, seconds_per_token: float, context: int, tokens: int) -> Baseline:
        return cls((seconds_per_token,), context, tokens)

    def add(self, seconds_per_token: float, context: int, tokens: int) -> Baseline:
        return Baseline((*self.samples, seconds_per_token)[-KEEP:], context, tokens)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def tokens_per_s(self) -> tuple[float, float, float]:
        """The target alone's (median, slowest, fastest) tokens per second."""
        return 1 / self.median, 1 / max(self.samples), 1 / min(self.samples)

    def speedup(self, tokens_per_s: float) -> Speedup | None:
        """Ours against the target alone: median, and the range over the baseline's samples."""
        if tokens_per_s <= 0:
            return None
        return Speedup(self.median * tokens_per_s, min(self.samples) * tokens_per_s,
                       max(self.samples) * tokens_per_s, len(self.samples))

    def describe(self) -> str:
        median, slow, fast = self.tokens_per_s
        spread = f" [{slow:.1f}-{fast:.1f}]" if len(self.samples) > 1 else ""
        timings = "1 timing" if len(self.samples) == 1 else f"median of {len(self.samples)} timings"
        return (f"Target alone: {median:.1f} tok/s{spread}, {timings} of {self.tokens} tokens here, "
                f"the latest at {self.context} tokens of context")

    def to_dict(self) -> dict:
        return {"samples": [round(s, 6) for s in self.samples], "context": self.context, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, data) -> Baseline | None:
        """None for anything that is not a stored baseline (older answers stored one number)."""
        if isinstance(data, (int, float)) and not isinstance(data, bool):  # version 1: one sample, context unknown
            return cls((float(data),), 0, 0) if 0 < data < 2**64 else None  # 10**400 is no time, nor a float
        if not isinstance(data, dict):
            return None
        try:
            samples = tuple(float(s) for s in data["samples"] if 0 < float(s) < math.inf)
            baseline = cls(samples[-KEEP:], int(data.get("context", 0)), int(data.get("tokens", 0)))
        except (KeyError, TypeError, ValueError, OverflowError):  # int(Infinity), float(10**400): damaged
            return None
        return baseline if samples else None


# How the speedup is measured, for the tooltip (the panel shows it as it is).
METHOD = ("Speedup = the target alone's seconds per token ÷ this answer's seconds per token. "
          "The target alone is timed on this machine when the pair loads and again after every "
          "answer, at the context the chat has reached; the figure uses the median of the latest "
          f"{KEEP} timings, and the range in brackets uses the fastest and the slowest of them. It is "
          "called faster (green) or slower (red) only once that whole range is above or below 1; "
          "until then, and with a single timing, it reads about as fast.")
