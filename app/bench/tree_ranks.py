"""How often a tree of drafts would beat a chain, measured before any tree is built (issue 48:
"measure it first"): acceptance by depth and by rank among siblings, and the target passes an
answer takes with a chain or with a tree of a given shape.

At temperature 0 the target's answer is fixed, so a drafter is judged against it exactly, with
no verify pass run: from each round's start, walk the target's own next tokens down the drafter's
candidates. A chain accepts while the target's token is the drafter's first choice; a tree of
widths (w1, w2, ...) accepts while it is among the first w_d choices at depth d. The next round
starts one token past what was accepted (the target's own token), as the engine's rounds do.

A draft model's candidates are its top choices, teacher-forced along the target's answer: along
the accepted path the draft reads exactly the target's tokens, so one pass of the draft over the
whole sequence gives its ranking at every depth (`model_ranks`); a tree of widths (w1, w2, ...)
then holds w1 x w2 x ... nodes at each depth (EAGLE-2's static shape; its dynamic shape expands
only where the draft is unsure, which `by_confidence` measures).

Prompt lookup's candidates (Saxena 2023's rule, without the edit resync: app/engine/lookup.py):
every earlier occurrence of the longest tail n-gram that occurs, and what followed each, merged
into a trie. Siblings rank by recency (the latest occurrence first: the chain is the drafter's
own choice, rank 0 at every depth).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.lookup import LookupIndex


def lookup_matches(tokens: Sequence[int], end: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Where the tail of tokens[:end] occurred before, latest first: the drafter's own rule
    (app/engine/lookup.LookupIndex.matches), every occurrence rather than the latest alone."""
    return list(LookupIndex(max_ngram, min_ngram).matches(tokens[:end]))


def lookup_ranks(tokens: Sequence[int], start: int, depth: int, max_ngram: int = 3,
                 min_ngram: int = 1) -> list[int]:
    """The rank among its siblings of each of the target's tokens tokens[start], tokens[start+1],
    ... in lookup's trie of candidates from the context tokens[:start], down to `depth`; it ends
    where the target's token is not a candidate (or the answer ends). Rank 0 is the chain's."""
    return lookup_walk(tokens, start, depth, max_ngram, min_ngram)[0]


def lookup_walk(tokens: Sequence[int], start: int, depth: int, max_ngram: int = 3,
                min_ngram: int = 1) -> tuple[list[int], bool]:
    """(lookup_ranks' ranks, whether the walk ended at a depth that had candidates none of which
    was the target's token: a miss no sibling could have saved)."""
    followers = lookup_matches(tokens, start, max_ngram, min_ngram)  # positions of the next candidate
    ranks = []
    for d in range(depth):
        if start + d >= len(tokens) or not followers:
            break
        siblings: list[int] = []  # distinct candidates, latest occurrence first
        for position in followers:
            if position < start and tokens[position] not in siblings:  # a draft copies committed tokens only
                siblings.append(tokens[position])
        wanted = tokens[start + d]
        if not siblings:
            break
        if wanted not in siblings:
            return ranks, True
        ranks.append(siblings.index(wanted))
        followers = [p + 1 for p in followers if p < start and tokens[p] == wanted]
    return ranks, False


def accepted(ranks: Sequence[int], widths: Sequence[int]) -> int:
    """Drafts a tree of `widths` (one per depth; a chain is all 1s) accepts, given the ranks."""
    n = 0
    for rank, width in zip(ranks, widths, strict=False):
        if rank >= width:
            break
        n += 1
    return n


def tree_nodes(tokens: Sequence[int], start: int, widths: Sequence[int], max_ngram: int = 3,
               min_ngram: int = 1) -> int:
    """Drafted tokens a pass verifies for a tree of `widths` from tokens[:start]: every trie node
    within the widths (each parent keeps its first w_d children by recency), the width of the
    verify pass less its one committed token."""
    return len(lookup_tree(tokens[:start], widths, max_ngram, min_ngram))


@dataclass
class Passes:
    """One answer decoded by a drafter of a given shape, counted pass by pass."""

    passes: int = 0
    accepted: int = 0
    accepted_by_depth: list[int] | None = None  # [d]: rounds whose draft at depth d was accepted
    widths: list[int] | None = None  # each pass's width: 1 + the drafted tokens it verified


def count_passes(tokens: Sequence[int], prompt_length: int, widths: Sequence[int], max_ngram: int = 3,
                 min_ngram: int = 1) -> Passes:
    """Target passes for the answer tokens[prompt_length:] with lookup drafting in the shape
    `widths` (the first answer token comes from the prefill, as in the engine)."""
    result = Passes(accepted_by_depth=[0] * len(widths), widths=[])
    position = prompt_length + 1
    while position < len(tokens):
        ranks = lookup_ranks(tokens, position, len(widths), max_ngram, min_ngram)
        n = accepted(ranks, widths)
        result.widths.append(1 + tree_nodes(tokens, position, widths, max_ngram, min_ngram))
        for d in range(n):
            result.accepted_by_depth[d] += 1
        result.passes += 1
        result.accepted += n
        position += n + 1
    return result


def rank_table(tokens: Sequence[int], prompt_length: int, depth: int, ranks_shown: int = 3,
               max_ngram: int = 3, min_ngram: int = 1) -> list[list[int]]:
    """table[d][r]: answer positions where the target's token at depth d (after d accepted ones)
    was lookup's rank-r candidate; column ranks_shown counts ranks >= ranks_shown, and the last
    column the positions where lookup had candidates there but not the target's token. Over every
    start in the answer, not only a chain's round starts: the drafter's quality, not one schedule's."""
    table = [[0] * (ranks_shown + 2) for _ in range(depth)]
    for start in range(prompt_length + 1, len(tokens)):
        ranks, missed = lookup_walk(tokens, start, depth, max_ngram, min_ngram)
        for d, rank in enumerate(ranks):
            table[d][min(rank, ranks_shown)] += 1
        if missed:
            table[len(ranks)][-1] += 1
    return table


def model_ranks(logits, answer_start: int, tokens: Sequence[int]):
    """(rank, the draft's own top-1 probability) of each answer token tokens[i], i >= answer_start,
    in the draft's distribution from tokens[:i]. `logits`: a numpy array (len(tokens), vocab) of
    the draft's logits over the whole sequence (row i predicts token i + 1)."""
    import numpy as np

    rows = np.asarray(logits[answer_start - 1:len(tokens) - 1], dtype=np.float64)
    wanted = np.asarray(tokens[answer_start:], dtype=np.int64)
    chosen = rows[np.arange(len(wanted)), wanted]
    ranks = (rows > chosen[:, None]).sum(axis=1)
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    top1 = shifted.max(axis=1) / shifted.sum(axis=1)
    return ranks.tolist(), top1.tolist()


def ranked_passes(ranks: Sequence[int], widths: Sequence[int]) -> Passes:
    """Passes over an answer whose tokens ranked `ranks` in a draft model's choices (model_ranks;
    ranks[0] is the token after the prefill's), for a top-k tree of `widths`: a round accepts
    while each token ranks below its depth's width; its pass verifies every node of the tree."""
    nodes, level = 0, 1
    for width in widths:
        level *= width
        nodes += level
    result = Passes(accepted_by_depth=[0] * len(widths), widths=[])
    position = 1  # the first answer token comes from the prefill
    while position < len(ranks):
        n = accepted(ranks[position:position + len(widths)], widths)
        for d in range(n):
            result.accepted_by_depth[d] += 1
        result.passes += 1
        result.accepted += n
        result.widths.append(1 + nodes)
        position += n + 1
    return result


def by_confidence(ranks: Sequence[int], top1: Sequence[float], edges=(0.5, 0.8)) -> list[tuple[str, int, float, float]]:
    """Where the draft's first choice was wrong, how often its second or third was right, by the
    draft's own top-1 probability: [(band, positions, share wrong at rank 0, share right at rank 1-2
    among the wrong)]. EAGLE-2 expands where the draft is unsure; this says whether that pays."""
    bands = []
    bounds = (0.0, *edges, 1.0 + 1e-9)
    for low, high in zip(bounds, bounds[1:], strict=False):
        inside = [r for r, p in zip(ranks, top1, strict=True) if low <= p < high]
        wrong = [r for r in inside if r > 0]
        saved = sum(1 for r in wrong if r <= 2)
        bands.append((f"{low:.1f}-{min(high, 1.0):.1f}", len(inside), len(wrong) / len(inside) if inside else 0.0,
                      saved / len(wrong) if wrong else 0.0))
    return bands


def lookup_tree(tokens: Sequence[int], widths: Sequence[int], max_ngram: int = 3, min_ngram: int = 1):
    """The tree `tree_nodes` counts, as a TokenTree to verify (app/engine/tree.py): lookup's trie
    below the end of `tokens`, each parent keeping its first w_d children by recency."""
    from app.engine.tree import TokenTree

    start = len(tokens)
    level: list[tuple[tuple[int, ...], list[int]]] = [((), lookup_matches(tokens, start, max_ngram, min_ngram))]
    paths: list[tuple[int, ...]] = []
    for width in widths:
        below = []
        for prefix, followers in level:
            children: dict[int, list[int]] = {}
            for p in followers:
                if p < start:
                    children.setdefault(tokens[p], []).append(p + 1)
            below += [((*prefix, token), after) for token, after in list(children.items())[:width]]
        paths += [prefix for prefix, _ in below]
        level = below
        if not level:
            break
    return TokenTree.from_paths(paths)
