"""Choosing the draft length k each round from measured acceptance and measured costs.

Throughput of a round with k drafts (Leviathan et al. 2023, eq. 1, with measured costs instead
of the 1 + k*c cost model, which overstates what is possible on a CPU):

    rate(k) = E[tokens | k] / (k * t_d + t_v(k + 1)),   E[tokens | k] = 1 + sum_j prod_{i<=j} a_i

where a_i is the measured acceptance at draft position i given that position i-1 was accepted,
t_d the draft's cost per token and t_v(w) the target's cost of a verify pass of width w. Plain
decoding is k = 0 with rate 1 / t_v(1). The same quantities give the bound the benchmarks and
the side panel report (app/engine/bound.py): bound(k) = rate(k) * t_v(1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.engine.bound import expected_tokens

DECAY = 0.97  # per round: old evidence fades so the controller follows the text
PRIOR_ACCEPT = 0.6  # before anything is measured
# A position rarely drafted borrows the acceptance pooled over all positions, weighted as this
# many rounds: with a fixed prior instead, a pair that accepts 98% stayed at k = 4 for good,
# because positions 5.. were never drafted and so never lost the pessimistic prior.
POOL_WEIGHT = 2.0
MAX_DRAFT = 16  # the longest draft adaptive k considers (transformers' assisted default is 20)
SPIKE_LIMIT = 1.5  # a measurement counts at most this many times the running estimate
PROBE_EVERY = 24  # plain rounds before the first probe when speculation was not paying
PROBE_MAX = 384
# Verify cost is not monotonic in width on CPUs (matmul kernels change with the row count:
# measured here, width 2-3 can cost more than width 5-9), so the first rounds measure several
# widths instead of interpolating.
WARMUP_KS = (0, 4, 2, 6, 8, 3, 1, 5, 7)  # 0 first: plain decoding's cost is the yardstick


@dataclass
class CostModel:
    max_k: int = MAX_DRAFT
    accept_w: list[float] = field(default_factory=list)  # decayed accepted counts per position
    reach_w: list[float] = field(default_factory=list)  # decayed times each position was drafted
    t_draft: float | None = None  # seconds per draft token (EMA)
    t_draft_steady: bool = False  # t_draft measured on a round that read no backlog first
    t_verify: dict[int, float] = field(default_factory=dict)  # width -> seconds (EMA)
    last_emitted: int | None = None  # tokens this source's last verified round committed
    # a block drafter (DFlash): one pass drafts every token, so t_draft is seconds per proposal
    # and a round's cost is t_draft + t_v(k + 1) whatever k is
    per_pass: bool = False

    def __post_init__(self):
        self.accept_w = self.accept_w or [0.0] * self.max_k
        self.reach_w = self.reach_w or [0.0] * self.max_k

    # --- measurements ---------------------------------------------------------------------
    def record_round(self, drafted: int, accepted: int, draft_s: float | None, verify_s: float | None,
                     read: int = 0, width: int | None = None) -> None:
        """One verified round; `read`: committed tokens the drafter read before drafting (in draft_s).
        Timings of None (a round that captured a graph): its acceptance counts, its costs do not.
        `width`: the pass's, where it was not drafted + 1 (a tree's round: its chain's acceptance,
        and the pass that read every node)."""
        for i in range(self.max_k):
            self.accept_w[i] *= DECAY
            self.reach_w[i] *= DECAY
        for i in range(min(drafted, self.max_k)):
            self.reach_w[i] += 1.0
            if i < accepted:
                self.accept_w[i] += 1.0
            else:
                break  # positions after the first rejection were not reached
        steady = self.steady(drafted, read)  # judged by the previous round's tokens
        self.last_emitted = min(accepted, drafted) + 1
        if draft_s is None or verify_s is None:
            return
        if drafted:
            # A drafter that drafts every round reads one or two new tokens first; a probe after
            # plain rounds reads all of them (an MTP layer 24 pairs: 13 ms against 5 for a round
            # that drafts on). Counted as the cost of drafting, that made a head look too dear to
            # ever draft again, so such a round sets the cost only until a steady one measures it.
            cost = draft_s if self.per_pass else draft_s / drafted
            if steady:
                self.t_draft = _ema(self.t_draft if self.t_draft_steady else None, cost)
                self.t_draft_steady = True
            elif self.t_draft is None:
                self.t_draft = cost
        self.record_verify(width or drafted + 1, verify_s)

    def forget_acceptance(self) -> None:
        """Drop what was measured of acceptance (the costs stay: they are the machine's)."""
        self.accept_w = [0.0] * self.max_k
        self.reach_w = [0.0] * self.max_k
        self.last_emitted = None

    def steady(self, drafted: int, read: int) -> bool:
        """Whether a proposal read no more than drafting on reads: what the source's previous
        round committed (a long accepted round before a short draft included), or its own k."""
        return read <= max(drafted, self.last_emitted or 0) + 1

    def record_verify(self, width: int, seconds: float) -> None:
        self.t_verify[width] = _ema(self.t_verify.get(width), seconds)

    # --- estimates ------------------------------------------------------------------------
    def acceptance(self, i: int) -> float:
        """P(position i accepted | position i-1 accepted), shrunk towards the pooled acceptance."""
        return self.acceptances()[i]

    def acceptances(self) -> list[float]:
        """acceptance(i) for every position, the pooled figure summed once."""
        pooled = POOL_WEIGHT * self.pooled_acceptance()
        return [(a + pooled) / (r + POOL_WEIGHT) for a, r in zip(self.accept_w, self.reach_w, strict=True)]

    def pooled_acceptance(self) -> float:
        return (sum(self.accept_w) + PRIOR_ACCEPT) / (sum(self.reach_w) + 1.0)

    def expected_tokens(self, k: int) -> float:
        return expected_tokens(self.acceptances()[:k], k)

    def verify_cost(self, width: int) -> float | None:
        """Measured cost of a width, or a line through the nearest measured widths."""
        if width in self.t_verify:
            return self.t_verify[width]
        known = sorted(self.t_verify)
        if not known:
            return None
        if len(known) == 1:
            base = self.t_verify[known[0]]
            # until a second width is measured assume 6% more per extra position (this CPU:
            # width 9 costs 1.5-1.9x width 1)
            return base * (1 + 0.06 * (width - known[0]))
        lo = max([w for w in known if w < width], default=known[0])
        hi = min([w for w in known if w > width], default=known[-1])
        if lo == hi:
            lo, hi = (known[-2], known[-1]) if width > known[-1] else (known[0], known[1])
        slope = (self.t_verify[hi] - self.t_verify[lo]) / (hi - lo)
        return max(self.t_verify[lo] + slope * (width - lo), 1e-6)

    def rate(self, k: int) -> float | None:
        """Estimated committed tokens per second with k drafts (k = 0: plain decoding)."""
        return self.rates().get(k)

    def rates(self) -> dict[int, float]:
        """rate(k) for k = 0 .. max_k where it can be estimated (the module's formula), in one pass:
        the acceptances once and E[tokens] cumulatively (a pass per k, each summing every
        position, took 0.24 ms a round: 2% of a demo step)."""
        acceptance = self.acceptances()
        rates, expected, run = {}, 1.0, 1.0
        for k in range(self.max_k + 1):
            if k:
                run *= acceptance[k - 1]
                expected += run
            t_v = self.verify_cost(k + 1)
            if t_v is not None and (not k or self.t_draft is not None):
                rates[k] = expected / (self.draft_cost(k) + t_v)
        return rates

    def draft_cost(self, k: int) -> float:
        """Seconds to draft k tokens: k steps, or one pass for a block drafter."""
        if not k:
            return 0.0
        return (self.t_draft or 0.0) * (1 if self.per_pass else k)

    def bound(self, k: int) -> float | None:
        """Speedup over plain decoding predicted for k drafts: E[tokens] * t_t(1) / cost."""
        r, base = self.rate(k), self.verify_cost(1)
        return r * base if r is not None and base is not None else None


class DraftLengthController:
    """Adaptive k (on by default) or a fixed k. Falls back to plain decoding when no k is
    predicted to beat it, and probes again every PROBE_EVERY plain rounds."""

    def __init__(self, fixed_k: int | None = None, max_k: int = MAX_DRAFT,
                 t_verify: dict[int, float] | None = None):
        self.fixed_k = fixed_k
        self.costs = CostModel(max_k=max(max_k, fixed_k or 0))
        if t_verify is not None:  # a source's controller: the target's verify costs are the parent's
            self.costs.t_verify = t_verify
        self._warmup = [k for k in WARMUP_KS if k <= max_k]
        self._plain_run = 0
        self._probe_every = PROBE_EVERY
        self._sources: dict[str, DraftLengthController] = {}
        self._again: int | None = None  # a k to draft at once more: its round read a backlog first

    def for_source(self, source: str | None) -> DraftLengthController:
        """The controller for one of a drafter's sources (None: the drafter has one, this one).

        Prompt lookup beside a draft model or head is two drafters in one: a lookup proposal costs
        microseconds and, where the text is being copied, is right for many tokens; a model's costs
        a pass per token and is right less often. One k for both let the weaker one set it (a
        head that did not pay turned lookup off with it), so each source keeps its own acceptance,
        draft cost and probes, while the target's verify cost per width, which does not depend on
        who drafted, is measured once for all."""
        if source is None:
            return self
        if source not in self._sources:
            self._sources[source] = DraftLengthController(self.fixed_k, self.costs.max_k, self.costs.t_verify)
        return self._sources[source]

    def new_answer(self, follows_text: Callable[[str | None], bool]) -> None:
        """An answer begins. The probes start over at PROBE_EVERY, and a source whose acceptance is
        a property of the text (`follows_text(source)`: prompt lookup, right where the answer
        copies its context) forgets what it measured on earlier answers. Carried over, an answer
        that copied nothing (a general question) taught lookup not to draft: the next copy task
        then drafted nothing for a long probe interval, and two regenerations of the same copy task
        at temperature 0 drafted 1 and 15 tokens (19.8 against 11.0 tok/s seen in the window).
        What the machine measured (verify cost per width, a draft's cost) is kept."""
        for source, control in ((None, self), *self._sources.items()):
            control._plain_run, control._probe_every, control._again = 0, PROBE_EVERY, None
            if follows_text(source):
                control.costs.forget_acceptance()

    def choose(self) -> int:
        if self.fixed_k is not None:
            return self.fixed_k
        if self._again:  # the cost of drafting is still unmeasured without a backlog: draft on once
            k, self._again = self._again, None
            return k
        while self._warmup:
            k = self._warmup[0]
            if k + 1 not in self.costs.t_verify and self._could_win(k):
                return k
            self._warmup.pop(0)
        if self.costs.t_draft is None:
            return 4
        rates = self.costs.rates()
        if 0 not in rates:
            return 0  # measure plain decoding once
        best = max(rates, key=rates.get)
        if best == 0:
            self._plain_run += 1
            if self._plain_run >= self._probe_every:
                self._plain_run = 0
                # each probe that finds nothing waits twice as long for the next (a bad pair
                # then costs a vanishing share of the time), up to PROBE_MAX
                self._probe_every = min(self._probe_every * 2, PROBE_MAX)
                return self._probe_k()
        else:
            self._plain_run = 0
            self._probe_every = PROBE_EVERY
        return best

    def _probe_k(self) -> int:
        """The draft length whose verify pass measured cheapest: on a CPU a width-5 pass can
        cost less than a width-2 one, and it samples more positions' acceptance."""
        widths = [w for w in self.costs.t_verify if 2 <= w <= self.costs.max_k + 1]
        return min(widths, key=self.costs.t_verify.get) - 1 if widths else 1

    def _could_win(self, k: int) -> bool:
        """With the acceptance seen so far and a verify as cheap as one plain step (a lower
        bound), would k drafts beat plain decoding? If not, measuring width k+1 is wasted."""
        t_plain, t_draft = self.costs.t_verify.get(1), self.costs.t_draft
        if k == 0 or t_plain is None or t_draft is None:
            return True
        return self.costs.expected_tokens(k) / (self.costs.draft_cost(k) + t_plain) > 1.02 / t_plain

    def record_round(self, drafted, accepted, draft_s, verify_s, read: int = 0, width: int | None = None) -> None:
        backlog = drafted and not self.costs.steady(drafted, read)  # judged before this round counts
        self.costs.record_round(drafted, accepted, draft_s, verify_s, read, width)
        self._again = drafted if backlog and not self.costs.t_draft_steady else None

    def record_plain(self, seconds: float) -> None:
        self.costs.record_verify(1, seconds)


class NominalCosts:
    """Costs in target passes that stand in for the clock where an answer must repeat.

    A seeded sampled answer repeats only if every round drafts the same k (a different k draws
    the random numbers in a different order), and measured timings differ between runs, so such
    an answer prices its rounds with these figures: acceptance, which the seed fixes, still steers
    k. The slope is this CPU's (width 9 costs 1.5-1.9x width 1); a model's draft token is priced at
    a tenth of a target pass (Leviathan et al. 2023 report c = 0.05-0.2 for useful pairs), prompt
    lookup's at a hundredth."""

    VERIFY_SLOPE = 0.06
    DRAFT = {"lookup": 0.01}
    MODEL_DRAFT = 0.1

    @classmethod
    def verify(cls, width: int) -> float:
        return 1.0 + cls.VERIFY_SLOPE * (width - 1)

    @classmethod
    def draft(cls, drafted: int, source: str, per_pass: bool = False) -> float:
        # a block drafter's pass is priced as two model draft tokens, whatever it drafts
        return 2 * cls.MODEL_DRAFT if per_pass else drafted * cls.DRAFT.get(source, cls.MODEL_DRAFT)


def _ema(old: float | None, new: float, weight: float = 0.2) -> float:
    if old is None:
        return new
    # Interference only ever adds time (another process, a page fault), so a spike is damped
    # before it counts: one slow pass must not rule a draft length out for the rest of a chat.
    new = min(new, old * SPIKE_LIMIT)
    return (1 - weight) * old + weight * new
