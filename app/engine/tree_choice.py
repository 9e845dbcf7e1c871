"""Whether a round verifies the drafter's tree of alternatives or only its chain (issue 48), by
measured speed, never assumed.

A tree widens the verify pass to win tokens where the first guess is wrong and another branch is
right. What that costs depends on the machine (on a 2-core CPU each extra node costs 0.2-0.3 of a
one-token pass; on a GPU next to nothing) and what it wins on the text (prompt lookup's other
matches were right after a wrong first guess 6-17% of the time on the demo's suite, docs/trees.md).
So where the drafter had alternatives, the chooser measures both: tokens emitted per second of the
round (drafting, the pass, the rollback), with the tree and with the chain alone, weighted toward
recent rounds as adaptive k's costs are. It tries each TRIES times first, then takes the tree only
where it measured faster by MARGIN, and tries the other again every PROBE rounds: a tree cannot
keep an answer slower than its chain for long, and one that starts paying is found.

Its choice follows the clock, so a seeded answer sampled above temperature 0 (which must repeat)
never uses it (app/engine/speculative.py); at temperature 0 a tree changes no token, only the
time.
"""

from __future__ import annotations

TRIES = 3  # rounds of each kind before the measurements decide
MARGIN = 0.03  # how much faster the tree must have measured (its rounds cost more to try)
PROBE = 16  # rounds on the winner between tries of the other
WEIGHT = 0.25  # of a new round in the running rate
WIDTH = 3  # branches a tree holds: the chain and up to two alternatives
ALTERNATIVE_TOKENS = 4  # the longest alternative branch (they are seldom right, and each node costs)
MODES = ("auto", "on", "off")


class TreeChooser:
    """`use_tree()` before a round where the drafter offered alternatives, `record()` after it."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"trees must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.rate: dict[bool, float | None] = {True: None, False: None}  # tokens/s, tree and chain
        self.rounds = {True: 0, False: 0}
        self._since_probe = 0

    def use_tree(self) -> bool:
        if self.mode != "auto":
            return self.mode == "on"
        if min(self.rounds.values()) < TRIES:  # alternate until each kind has its tries
            return self.rounds[True] <= self.rounds[False]
        tree, chain = self.rate[True], self.rate[False]
        best = tree is not None and chain is not None and tree > chain * (1 + MARGIN)
        self._since_probe += 1
        if self._since_probe >= PROBE:
            self._since_probe = 0
            return not best
        return best

    def record(self, tree: bool, tokens: int, seconds: float) -> None:
        """A round where alternatives were offered: `tree` whether they were verified, `tokens`
        emitted in `seconds` (the round's drafting, pass and rollback)."""
        if seconds <= 0:
            return
        rate = tokens / seconds
        old = self.rate[tree]
        self.rate[tree] = rate if old is None else (1 - WEIGHT) * old + WEIGHT * rate
        self.rounds[tree] += 1

    def summary(self) -> str:
        """"trees 1.12x the chain (14 and 40 rounds)": what it measured, for the stats line."""
        tree, chain = self.rate[True], self.rate[False]
        if tree is None or chain is None:
            return ""
        return f"trees {tree / chain:.2f}x the chain ({self.rounds[True]} and {self.rounds[False]} rounds)"
