"""Which of a drafter's alternatives a round verifies beside its chain (issue 48): the tree's shape,
chosen from measured costs and acceptance, never assumed.

A tree widens the verify pass to win tokens where the first guess is wrong and another branch is
right. What a node costs depends on the machine (on a 2-core CPU 0.2-0.3 of a one-token pass; on
a GPU next to nothing); what it wins depends on the drafter and the text (prompt lookup's other
matches were right after a wrong first guess 6-17% of the time on the demo's suite, the shipped
aligned head's runner-ups 20-28%: docs/trees.md). So each alternative branch is priced before the
round, from what adaptive k has measured (app/engine/adaptive.py's CostModel: the chain's
acceptance by depth and the pass's cost by width, tree passes included at their own width) and
what tree rounds have measured of the alternatives, by rank among the siblings at a depth:

    gain(branch at depth d, rank r) = P(the walk reaches depth d) (1 - a_d) s_r

tokens: the chain reaches depth d with the product of its acceptances before it, its draft there
is wrong with 1 - a_d, and then a sibling of rank r was the target's token a share s_r of the
times (a running count with a prior of 1 in 4). The branches are taken best first while each
raises the round's expected tokens per second by MARGIN (E: the chain's expected tokens, g: the
gains of the branches kept so far, w: the pass's width so far),

    (E + g + gain) / (draft + t_verify(w + nodes))  >  (1 + MARGIN) (E + g) / (draft + t_verify(w)),

so a branch that does not pay is dropped, and a tree none of whose branches pays is verified as
its chain (declined). The first TRIES rounds that offer a tree verify it whole, to measure s_r,
and a declined tree is verified whole anyway every PROBE rounds, so that the measurement follows
the text: that bounds what trying costs.

(A first version timed whole rounds, tree against chain, and took the faster: rounds differ far
more by what the text lets a drafter guess than by the tree, and on the demo with a 4-bit copy of
itself as the draft it measured 0.89x the chain's speed. A second priced the whole tree by the
tokens tree rounds won beyond their chains, all its branches or none.)

Its choice follows the clock, so a seeded answer sampled above temperature 0 (which must repeat)
never uses it (app/engine/speculative.py); at temperature 0 a tree changes no token, only the
time.
"""

from __future__ import annotations

from dataclasses import replace

from app.engine.tree import ROOT, TokenTree, chain_length, on_chain

TRIES = 3  # tree rounds verified whole before the prices decide
MARGIN = 0.03  # how much faster each branch must make the round (the price is an estimate)
PROBE = 16  # declined trees between two verified whole anyway
WIDTH = 3  # branches a tree holds: the chain and up to two alternatives
ALTERNATIVE_TOKENS = 4  # the longest alternative branch (they are seldom right, and each node costs)
MODES = ("auto", "on", "off")
# a sibling's share of right answers where the chain was wrong, before any is measured: 1 in 4
PRIOR_RIGHT, PRIOR_TRIED = 1.0, 4.0
RANKS = WIDTH - 1  # siblings counted by rank: the first alternative at a depth, the second


def branches(tree: TokenTree) -> list[tuple[int, int, list[int]]]:
    """The alternatives beside the chain: (depth, rank among the alternatives at that depth, the
    branch's nodes, its first node first), in the tree's order."""
    n = chain_length(tree)
    out: list[tuple[int, int, list[int]]] = []
    seen: dict[int, int] = {}
    owner: dict[int, int] = {}  # node -> index in out
    for node in range(n, len(tree)):
        parent = tree.parents[node]
        if parent == ROOT or parent < n:  # hangs from the chain: a branch begins
            depth = tree.depths[node]
            rank = seen.get(depth, 0)
            seen[depth] = rank + 1
            owner[node] = len(out)
            out.append((depth, rank, [node]))
        else:
            owner[node] = owner[parent]
            out[owner[node]][2].append(node)
    return out


class TreeChooser:
    """`choose(...)` before a round whose drafter offered alternatives, `record(...)` after a
    round that verified a tree."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"trees must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.trees = self.declined = 0
        self.right = [0.0] * RANKS  # by rank: siblings that were the target's token where the chain was wrong
        self.tried = [0.0] * RANKS  # by rank: siblings the walk reached where the chain was wrong
        self._since_probe = 0
        self.failed = ""  # why a tree's pass failed: the answer verifies chains from then on

    def sibling_share(self, rank: int) -> float:
        """s_r: how often a sibling of this rank was right where the chain was wrong (with the prior)."""
        rank = min(rank, RANKS - 1)
        return (self.right[rank] + PRIOR_RIGHT) / (self.tried[rank] + PRIOR_TRIED)

    def choose(self, costs, proposal):
        """The proposal with the tree to verify: whole (mode "on", the first TRIES trees, a probe),
        the branches that pay (priced with `costs`, the drafting source's adaptive.CostModel), or
        none (tree None: the chain)."""
        if self.mode != "auto":
            return proposal if self.mode == "on" else replace(proposal, tree=None)
        if self.trees < TRIES:
            return proposal
        shaped = self.shape(costs, proposal)
        if shaped.tree is not None:
            return shaped
        self._since_probe += 1
        if self._since_probe >= PROBE:  # verified whole anyway, to measure: not declined
            self._since_probe = 0
            return proposal
        self.declined += 1
        return shaped

    def shape(self, costs, proposal):
        """Keep the alternative branches that raise the round's expected tokens per second, best
        first (the module's rule); the chain alone where none does."""
        tree = proposal.tree
        n = chain_length(tree)
        chain_v = costs.verify_cost(n + 1) if costs is not None else None
        if chain_v is None:
            return proposal  # nothing measured to price it with: verify it whole, and measure
        acceptance = costs.acceptances()
        reach = [1.0]
        for a in acceptance[:n]:
            reach.append(reach[-1] * a)
        priced = []
        for depth, rank, nodes in branches(tree):
            wrong = 1.0 - (acceptance[depth] if depth < len(acceptance) else 0.0)
            priced.append((reach[min(depth, n)] * wrong * self.sibling_share(rank), nodes))
        priced.sort(key=lambda item: -item[0])
        draft, tokens, width, kept = costs.draft_cost(n), costs.expected_tokens(n), n + 1, []
        for gain, nodes in priced:
            wider = costs.verify_cost(width + len(nodes))
            if (tokens + gain) / (draft + wider) > (1 + MARGIN) * tokens / (draft + costs.verify_cost(width)):
                tokens, width = tokens + gain, width + len(nodes)
                kept += nodes
        if not kept:
            return replace(proposal, tree=None)
        return replace(proposal, **_keep_nodes(proposal, tree, range(n), kept))

    def record(self, extra: int, tree: TokenTree | None = None, path: tuple[int, ...] = ()) -> None:
        """A round that verified `tree` (its walk took `path`) emitted `extra` tokens beyond what its
        chain would have: count, by rank, the siblings the walk reached where the chain was wrong,
        and whether it took them."""
        self.trees += 1
        if tree is None:
            return
        followed = on_chain(path)
        for depth, rank, nodes in branches(tree):
            if depth != followed:
                continue  # not reached, or reached where the chain's draft was right
            rank = min(rank, RANKS - 1)
            self.tried[rank] += 1
            self.right[rank] += len(path) > depth and path[depth] == nodes[0]


def _keep_nodes(proposal, tree: TokenTree, chain, kept) -> dict:
    """The fields of `proposal` for the tree of the chain and the `kept` nodes (each with its
    ancestors), node probabilities carried over."""
    nodes = sorted({*chain, *kept})
    index = {old: new for new, old in enumerate(nodes)}
    parents = tuple(ROOT if tree.parents[old] == ROOT else index[tree.parents[old]] for old in nodes)
    smaller = TokenTree(tuple(tree.tokens[old] for old in nodes), parents)
    p = tuple(proposal.tree_p[old] for old in nodes) if len(proposal.tree_p) == len(tree) else ()
    return {"tree": smaller, "tree_p": p, "branches": 1 + sum(1 for parent in parents[len(chain):]
                                                                if parent == ROOT or parent < len(chain))}
