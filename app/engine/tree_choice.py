"""Whether a round verifies the drafter's tree of alternatives or only its chain (issue 48), from
measured costs, never assumed.

A tree widens the verify pass to win tokens where the first guess is wrong and another branch is
right. What that costs depends on the machine (on a 2-core CPU each extra node costs 0.2-0.3 of a
one-token pass; on a GPU next to nothing) and what it wins on the text (prompt lookup's other
matches were right after a wrong first guess 6-17% of the time on the demo's suite, docs/trees.md).
So the chooser prices each tree before it is verified, with what adaptive k has measured
(app/engine/adaptive.py's CostModel: the chain's acceptance by position and the pass's cost by
width, tree passes included at their own width), and what tree rounds have measured of the
alternatives: the tokens a tree round emitted beyond what its chain would have (0 where the walk
stayed on the chain), weighted toward recent rounds. A tree is verified where

    (E[chain] + extra) / (draft + t_verify(nodes + 1))  >  (1 + MARGIN) E[chain] / (draft + t_verify(k + 1)),

the expected tokens per second of the round with and without its alternatives. The first TRIES
rounds that offer a tree verify it, to measure `extra`, and a tree declined is verified anyway
every PROBE rounds so that the measurement follows the text: that bounds what trying costs.

(A first version timed whole rounds, tree against chain, and took the faster: rounds differ far
more by what the text lets a drafter guess than by the tree, and on the demo with a 4-bit copy of
itself as the draft it measured 0.89x the chain's speed.)

Its choice follows the clock, so a seeded answer sampled above temperature 0 (which must repeat)
never uses it (app/engine/speculative.py); at temperature 0 a tree changes no token, only the
time.
"""

from __future__ import annotations

TRIES = 3  # tree rounds verified before the prices decide
MARGIN = 0.03  # how much faster the tree must be priced (the price is an estimate)
PROBE = 16  # declined trees between two verified anyway
WEIGHT = 0.2  # of a new round in the running figure of extra tokens
WIDTH = 3  # branches a tree holds: the chain and up to two alternatives
ALTERNATIVE_TOKENS = 4  # the longest alternative branch (they are seldom right, and each node costs)
MODES = ("auto", "on", "off")


class TreeChooser:
    """`use_tree(...)` before a round whose drafter offered alternatives, `record(...)` after a
    round that verified them."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"trees must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.extra: float | None = None  # tokens a tree round emitted beyond its chain (running)
        self.trees = self.declined = 0
        self._since_probe = 0

    def use_tree(self, costs, chain: int, nodes: int) -> bool:
        """Whether to verify a tree of `nodes` nodes whose chain holds `chain` drafts, priced with
        `costs` (the drafting source's adaptive.CostModel)."""
        if self.mode != "auto":
            return self.mode == "on"
        if self.trees < TRIES or self.extra is None:
            return True
        tree_v, chain_v = costs.verify_cost(nodes + 1), costs.verify_cost(chain + 1)
        if tree_v is None or chain_v is None:
            return True  # nothing measured to price it with: try it
        draft = costs.draft_cost(chain)
        expected = costs.expected_tokens(chain)
        if (expected + self.extra) / (draft + tree_v) > (1 + MARGIN) * expected / (draft + chain_v):
            return True
        self._since_probe += 1
        if self._since_probe >= PROBE:  # verified anyway, to measure: not declined
            self._since_probe = 0
            return True
        self.declined += 1
        return False

    def record(self, extra: int) -> None:
        """A round that verified a tree emitted `extra` tokens beyond what its chain would have."""
        self.trees += 1
        self.extra = extra if self.extra is None else (1 - WEIGHT) * self.extra + WEIGHT * extra
