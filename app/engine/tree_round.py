"""A round that verifies a tree of drafts (app/engine/tree.py; issue 48), beside the chain's
`verify_round` in app/engine/speculative.py: one target pass over the pending token and the tree,
the target's own walk down it, and the cache (and the states a drafter reads) keeping the walked
path. The round is then shown and counted as a chain: the walked path and the first guess where
the walk stopped."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from app.engine.backends.base import ModelBackend, Verdict
from app.engine.drafters import Proposal, TargetState
from app.engine.sampling import SamplingParams
from app.engine.tree import on_chain, shown_nodes
from app.engine.verified import Verified


def verify_tree_round(target: ModelBackend, committed: Sequence[int], proposal: Proposal,
                      params: SamplingParams, want_state: bool = False) -> tuple[Proposal, Verified]:
    """One target pass over the pending token and the tree of `proposal` (app/engine/tree.py):
    the cache keeps the committed tokens and the walked path, in order, and so do the hidden
    states handed over with `want_state`. Returns the proposal as the round shows it, a chain:
    the walked path, then the drafter's first guess where the walk stopped (the rejected draft);
    its `tree` stays for the panel and the trace."""
    start = time.perf_counter()
    mark = target.checkpoint()
    catch_up = list(committed[mark.length:])
    tree = proposal.tree
    try:
        verdict = target.verify_tree(catch_up, tree, params)
    except BaseException:  # the pass may have left every node in the cache
        target.rewind(mark, mark.length)
        raise
    seconds = time.perf_counter() - start
    kept = len(catch_up) + len(verdict.path)
    if target.cache_len != mark.length + kept:  # never decode on after rejected drafts: say so loudly
        raise RuntimeError(f"after a tree's verdict the target's cache holds {target.cache_len - mark.length} "
                           f"new positions, not the {kept} kept")
    nodes = shown_nodes(tree, verdict.path)
    ids = tuple(tree.tokens[n] for n in nodes)
    chain = len(proposal.ids)  # the first path, nodes 0.. in the trie's order
    followed = on_chain(verdict.path)
    p = tuple(proposal.tree_p[n] for n in nodes) if len(proposal.tree_p) == len(tree) else (1.0,) * len(ids)
    shown = replace(proposal, ids=ids, p=p, probs=None, ids_array=None)
    taken = Verdict(len(verdict.path), verdict.token, verdict.q)
    state = TargetState(target.last_hidden()[:kept], mark.length, target) if want_state else None
    return shown, Verified(taken, seconds, 0.0, 0, state, chain=(chain, followed), path=verdict.path)


def tree_fits(tree, stop_ids: frozenset[int], vocab_limit: int) -> bool:
    """Whether a tree can be verified as it is: no node past the answer's end (a stop token) nor
    outside the target's vocabulary (else its chain alone is, cut as a chain is cut)."""
    return all(0 <= t < vocab_limit and t not in stop_ids for t in tree.tokens)
