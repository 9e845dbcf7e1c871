"""The one speedup bound used everywhere (adaptive k, the benchmarks, the side panel).

Leviathan et al. 2023 (eq. 1) with measured costs in place of the 1 + k*c cost model:

    bound(k) = E[tokens per round | a, k] * t_t(1) / (k * t_d(1) + t_t(k + 1))
    E[tokens per round | a, k] = 1 + sum_{j=1..k} prod_{i<=j} a_i

a_i: the acceptance at draft position i given that position i-1 was accepted; t_d(1): the draft's
cost of one token; t_t(w): the target's measured cost of a forward pass of width w (on this CPU a
width-9 pass costs 1.5-1.9x a width-1 pass, so 1 + k*c overstates what is possible).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens one round commits on average with k drafts (the last a_i repeats past the list)."""
    total, run = 1.0, 1.0
    for i in range(k):
        a = acceptance[min(i, len(acceptance) - 1)] if acceptance else 0.0
        run *= a
        total += run
    return total


def conditional_acceptance(accepted_by_position: Sequence[int], reached_by_position: Sequence[int]) -> list[float]:
    """a_i from counts: position i was accepted `accepted[i]` times in the `reached[i]` rounds that
    drafted it with every earlier position accepted. Stops at the first position never reached."""
    out = []
    for accepted, reached in zip(accepted_by_position, reached_by_position, strict=False):
        if reached <= 0:
            break
        out.append(accepted / reached)
    return out


def speedup_bound(acceptance: Sequence[float], t_draft: float, t_target: Mapping[int, float], k: int,
                  per_pass: bool = False) -> float:
    """bound(k) above; t_target maps a pass width to its measured seconds. `per_pass`: t_draft is
    one pass that drafts all k tokens (a DFlash block), so the draft term is t_draft, not k t_draft."""
    draft = t_draft if per_pass else k * t_draft
    return expected_tokens(acceptance, k) * t_target[1] / (draft + t_target[k + 1])


def best_bound(acceptance: Sequence[float], t_draft: float, t_target: Mapping[int, float],
               per_pass: bool = False, max_k: int | None = None) -> tuple[int, float]:
    """The k (0 = plain decoding, bound 1) that maximises bound(k) over the measured widths (and
    at most `max_k`, a block drafter's block)."""
    best = (0, 1.0)
    for k in range(1, max(t_target) if max_k is None else min(max(t_target), max_k + 1)):
        if k + 1 in t_target:
            value = speedup_bound(acceptance, t_draft, t_target, k, per_pass)
            if value > best[1]:
                best = (k, value)
    return best
