"""A token tree verified in one pass of the lean step (app/engine/tree.py; issue 48).

The pass reads the tokens the cache lacks (at least the last one emitted: the tree's root) in
order, then every node of the tree, each at RoPE position `root + 1 + depth` and attending to the
context, the pending tokens and its own ancestors. Keys and values are written in the pass's
order; after the verdict the accepted path's are moved into place behind the pending tokens and
the rest dropped (StaticKV.keep).

It runs on the lean step: on the compiled CPU call (kernels_numba._attend_tree), where each node
is bit for bit a one-token step along its path, and on the PyTorch body with an ancestor mask.
Not yet on the CUDA graphs, transformers' forward or MLX. A drafter that reads the target's
inner states (an MTP layer, an aligned head, EAGLE-3) is handed the kept rows' states, in the
order the cache keeps them, as after a chain's pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.engine.backends.static_kv_torch import StaticKV
from app.engine.backends.verdict_torch import probs_from_logits
from app.engine.sampling import SamplingParams
from app.engine.tree import ROOT, TokenTree, TreeVerdict, attention_mask, parent_rows, shown_nodes, walk


def tree_positions(pending: int, start: int, tree: TokenTree, device: torch.device) -> torch.Tensor:
    """The RoPE positions (n,) of a pass that reads `pending` tokens causally after `start` cached
    ones, then `tree`'s nodes, each at its depth below the last pending token."""
    positions = list(range(start, start + pending)) + [start + pending + d for d in tree.depths]
    return torch.tensor(positions, device=device)


@torch.inference_mode()
def tree_logits(backend, ids: Sequence[int], tree: TokenTree) -> torch.Tensor:
    """One pass over `ids` and then `tree`'s nodes -> logits (len(ids) + len(tree), V'): row
    len(ids) - 1 predicts the root's children, row len(ids) + i node i's. All of the pass stays
    in the cache until `keep_path`. Where the backend hands inner states to a drafter, every
    row's state is held until `keep_path` keeps the kept ones'."""
    if not ids:
        raise ValueError("a tree's pass needs its root: the last token emitted, not yet read")
    lean = backend._lean
    if lean is None or not isinstance(backend.cache, StaticKV):
        raise NotImplementedError("trees are verified on the lean step's eager passes")
    start, pending = backend.cache.length, len(ids)
    if backend.cache.fixed:  # a buffer the graphs use, allocated once for the whole context
        backend.cache.reserve(start + pending + len(tree), planned=backend._planned())
    hidden = backend._want_hidden
    positions = tree_positions(pending, start, tree, backend._device)
    native = lean.takes_tree_natively(hidden)
    # the PyTorch body's mask (n, start + n); the compiled call takes each token's parent instead
    mask = None if native else torch.from_numpy(attention_mask(pending, start, tree)).to(backend._device)
    # a chain is the causal pass the compiled call takes as it is (the same bits, without the gathers)
    parent = None if tree.is_chain else ([t - 1 for t in range(pending)]
                                         + [pending + p if p != ROOT else pending - 1 for p in tree.parents])
    logits, states = lean.forward_tree(backend._ids([*ids, *tree.tokens]), backend.cache, positions, mask, parent,
                                       hidden)
    backend.cache.appended(len(ids) + len(tree))
    backend._hidden = None if states is None else states[None]
    return logits[:, : backend.vocab_limit].float()


@torch.inference_mode()  # the buffer is an inference tensor (allocated inside a pass)
def keep_path(backend, pending: int, path: Sequence[int], length_before: int) -> None:
    """After `tree_logits`: the pending tokens and the accepted nodes `path` stay, in order, in
    the cache and in the inner states the drafter is handed (`last_hidden`)."""
    first = length_before + pending
    backend.cache.keep(first, [first + node for node in path])
    if backend._hidden is not None:
        rows = torch.tensor([*range(pending), *(pending + node for node in path)], device=backend._hidden.device)
        backend._hidden = backend._hidden.index_select(1, rows)


@torch.inference_mode()
def verify_tree(backend, ids: Sequence[int], tree: TokenTree, params: SamplingParams) -> TreeVerdict:
    """The walk of app/engine/tree.py over one pass: at temperature 0 the longest path that
    follows the target's argmax; above 0 the path its own draws follow (children are taken as
    deterministic: exact for any tree)."""
    before = backend.cache.length
    logits = tree_logits(backend, ids, tree)
    pending = len(ids)

    def choose(node: int) -> int:
        row = logits[pending - 1 if node == ROOT else pending + node]
        if params.greedy:
            return int(torch.argmax(row))
        return int(torch.multinomial(probs_from_logits(row, params), 1, generator=backend._generator))

    verdict = walk(tree, choose)
    keep_path(backend, pending, verdict.path, before)
    shown = shown_nodes(tree, verdict.path)  # the target's q of each token the round shows
    if not shown:
        return verdict
    rows = torch.tensor(parent_rows(tree, shown, pending))
    tokens = torch.tensor([tree.tokens[n] for n in shown])
    q = torch.softmax(logits[rows.to(logits.device)], -1).gather(1, tokens.to(logits.device).view(-1, 1))[:, 0]
    return TreeVerdict(verdict.path, verdict.token, tuple(q.tolist()))
