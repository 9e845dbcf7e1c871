"""The speedup's yardstick: the target alone's measured seconds per token on this machine.

One timing is one sample, and on a busy machine samples spread widely (0.4 to 1.7 tok/s were
seen in one sitting), so a single timing at load cannot carry the speedup. The baseline keeps the
latest samples and reports their median with the min-max, as the bench does.

Like for like (issue 46): an answer is compared only with timings taken in its own conditions.
- The same sampling settings (`conditions_of`): sampling at 0.7 with top-p and top-k costs more
  a token than taking the argmax, and the card once held chat answers at 0.7 against a greedy
  timing. Each setting has its own timings.
- The same context region (`comparable`): a step reads the whole cache, so a timing at 30 tokens
  flatters an answer at 3,000.
- The same machine minute: the target alone is timed when the pair loads, when a chat's settings
  change, and after every answer (while the engine is idle) at the context the chat has reached,
  so a machine that slows down slows the baseline with the answers it is compared with.
- The window's drawing: the timing runs while the window idles, the answer while it draws; that
  cost an answer 2.4% on the demo's poem starter (benchmarks/gui_vs_headless.py, docs/benchmarks.md),
  inside the ranges.
Where no timing matches, the answer has no speedup and the panel says why (`Timings.missing`);
the timing that follows the answer serves the next one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

KEEP = 7  # samples a speedup uses: enough for a median that one noisy moment cannot move
POINTS = 48  # timings kept over every setting and context (a few chats' worth)
GREEDY = "temperature 0"

# What a speedup may claim (the design's interval rule: a claim stands only where the measured
# range clears it). The window colours FASTER green and SLOWER red, ABOUT in no colour.
FASTER, SLOWER, ABOUT = "faster", "slower", "about as fast"


def conditions_of(params) -> str:
    """The sampling settings a timing holds for (a SamplingParams; the seed costs nothing)."""
    if params.greedy:
        return GREEDY
    words = [f"temperature {params.temperature:g}"]
    if params.top_p is not None and params.top_p < 1:
        words.append(f"top-p {params.top_p:g}")
    if params.top_k:
        words.append(f"top-k {params.top_k}")
    return ", ".join(words)


def comparable(context: int, other: int) -> bool:
    """Whether two contexts are in one region: within a factor of two, counting 256 tokens more
    on each (under a few hundred tokens a step's cost hardly moves with the context)."""
    big, small = max(context, other) + 256, min(context, other) + 256
    return big <= 2 * small


def speedup_verdict(low: float, high: float, timings: int) -> str:
    """FASTER or SLOWER only once the whole range is on one side of 1; ABOUT until then. One
    timing of the target alone is no range at all (its spread is unknown), so it claims nothing:
    "" (no verdict; the panel says a range needs a second timing)."""
    if timings < 2:
        return ""
    if not (math.isfinite(low) and math.isfinite(high)):
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
    conditions: str = GREEDY  # the sampling settings they were taken at (conditions_of)
    contexts: tuple[int, ...] = ()  # each sample's context, where known (answers stored before: ())

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
        timings = ("1 timing (a range needs a second)" if len(self.samples) == 1
                   else f"median of {len(self.samples)} timings")
        where = f"at {_span(self.contexts or (self.context,))} tokens of context"
        return (f"Target alone at {self.conditions}: {median:.1f} tok/s{spread}, {timings} of {self.tokens} "
                f"tokens or more here, {where}")

    def to_dict(self) -> dict:
        return {"samples": [round(s, 6) for s in self.samples], "context": self.context, "tokens": self.tokens,
                "conditions": self.conditions, "contexts": list(self.contexts)}

    @classmethod
    def from_dict(cls, data) -> Baseline | None:
        """None for anything that is not a stored baseline (older answers stored one number)."""
        if isinstance(data, (int, float)) and not isinstance(data, bool):  # version 1: one sample, context unknown
            return cls((float(data),), 0, 0) if 0 < data < 2**64 else None  # 10**400 is no time, nor a float
        if not isinstance(data, dict):
            return None
        try:
            samples = tuple(float(s) for s in data["samples"] if 0 < float(s) < math.inf)
            conditions = data.get("conditions", GREEDY)  # stored before settings were told apart
            contexts = tuple(int(c) for c in data.get("contexts") or ())
            if not isinstance(conditions, str) or len(contexts) not in (0, len(samples)):
                return None
            baseline = cls(samples[-KEEP:], int(data.get("context", 0)), int(data.get("tokens", 0)),
                           conditions[:200], contexts[-KEEP:] if contexts else ())
        except (KeyError, TypeError, ValueError, OverflowError):  # int(Infinity), float(10**400): damaged
            return None
        return baseline if samples else None


@dataclass(frozen=True)
class Timings:
    """Every timing of the target alone for the pair loaded now: (conditions, seconds per token,
    context) oldest first, from which each answer takes those in its own conditions."""

    points: tuple[tuple[str, float, int], ...] = ()
    tokens: int = 0  # the fewest tokens any timing decoded

    @classmethod
    def of(cls, baseline: Baseline) -> Timings:
        """A baseline's timings as points (each at its own context where known)."""
        contexts = baseline.contexts or (baseline.context,) * len(baseline.samples)
        return cls(tuple((baseline.conditions, s, c) for s, c in zip(baseline.samples, contexts, strict=True)),
                   baseline.tokens)

    def add(self, conditions: str, seconds_per_token: float, context: int, tokens: int) -> Timings:
        """With one more timing, of `tokens` tokens (a race's first side covers its whole answer:
        `tokens` then keeps the fewest any timing covered, which the panel's line states)."""
        return Timings((*self.points, (conditions, seconds_per_token, context))[-POINTS:],
                       min(self.tokens, tokens) if self.tokens else tokens)

    def has(self, conditions: str) -> bool:
        return any(c == conditions for c, _, _ in self.points)

    def for_answer(self, conditions: str, context: int | None) -> Baseline | None:
        """The latest KEEP timings at `conditions` whose context is in the answer's region (None: a
        context not known yet, such as an API request's: the region of the latest such timing);
        None where there is none."""
        if context is None:
            context = next((c for cond, _, c in reversed(self.points) if cond == conditions), None)
            if context is None:
                return None
        found = [(s, c) for cond, s, c in self.points if cond == conditions and comparable(c, context)][-KEEP:]
        if not found:
            return None
        return Baseline(tuple(s for s, _ in found), found[-1][1], self.tokens, conditions, tuple(c for _, c in found))

    def missing(self, conditions: str, context: int | None) -> str:
        """Why an answer at `conditions` and `context` has no timing to be compared with."""
        at = [c for cond, _, c in self.points if cond == conditions]
        if not at or context is None:
            return (f"the target alone has not been timed at {conditions} yet. It is timed after this answer, "
                    "for the next one")
        return (f"the target alone was timed at {conditions} at {_span(at)} tokens of context, and this "
                f"answer reads {context:,}, where a step costs more or less. It is timed at this context after "
                "this answer, for the next one")

    def latest(self) -> Baseline | None:
        """The newest setting's timings in the newest context's region: what the panel shows idle."""
        if not self.points:
            return None
        conditions, _, context = self.points[-1]
        return self.for_answer(conditions, context)


def _span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


# How the speedup is measured, for the tooltip (the panel shows it as it is).
METHOD = ("Speedup = the target alone's seconds per token ÷ this answer's seconds per token, like for "
          "like: the target alone is timed on this machine at the answer's own sampling settings and in "
          "its context region, when the pair loads, when the chat's settings change and again after "
          f"every answer. The figure uses the median of the latest {KEEP} such timings, and the range "
          "uses the fastest and the slowest of them. It is called faster (green) or slower (red) only "
          "once that whole range is above or below 1, about as fast until then; a single timing gives "
          "no range and no verdict. Where no timing matches the answer's settings or context, there "
          "is no speedup, and this panel says why.")
