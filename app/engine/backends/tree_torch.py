"""A token tree verified in one pass of the lean step (app/engine/tree.py; issue 48).

The pass reads the tokens the cache lacks (at least the last one emitted: the tree's root) in
order, then every node of the tree, each at RoPE position `root + 1 + depth` and attending to the
context, the pending tokens and its own ancestors. Keys and values are written in the pass's
order; after the verdict the accepted path's are moved into place behind the pending tokens and
the rest dropped (StaticKV.keep).

It runs on the lean step: on the compiled CPU call (kernels_numba._attend_tree), where each node
is bit for bit a one-token step along its path, and on the PyTorch body with an ancestor mask.
It runs on transformers' forward too (the families the lean step does not cover), which takes
the same mask as a custom 4-D attention mask (0 where a row may look, the dtype's least value
elsewhere; transformers' masking_utils returns a 4-D mask as it is) and each token's RoPE position
as `position_ids`; its cache's plain attention layers keep the path the same way (`_keep_layers`).
Not yet on the CUDA graphs (MLX: tree_mlx.py). A drafter that reads the target's inner states (an
MTP layer, an aligned head, EAGLE-3) is handed the kept rows' states, in the order the cache keeps
them, as after a chain's pass.
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
    if lean is None:
        return _transformers_tree_logits(backend, ids, tree)
    if not isinstance(backend.cache, StaticKV):
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


def _transformers_tree_logits(backend, ids: Sequence[int], tree: TokenTree) -> torch.Tensor:
    """tree_logits through transformers' forward (the backend's tree_note has checked that its
    cache holds plain attention layers only)."""
    cache, device = backend.cache, backend._device
    start, pending = cache.length, len(ids)
    allowed = torch.from_numpy(attention_mask(pending, start, tree)).to(device)
    # the activations' dtype, as transformers' own masks take (SDPA wants a float mask in the query's)
    embeddings = backend.model.get_input_embeddings()
    dtype = getattr(getattr(embeddings, "weight", None), "dtype", None) or backend.model.dtype
    # additive, as eager attention adds it and SDPA takes a float mask; one batch, one head axis
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    n = pending + len(tree)
    out = backend.model(input_ids=backend._ids([*ids, *tree.tokens]), attention_mask=mask[None, None],
                        position_ids=tree_positions(pending, start, tree, device)[None], cache=cache.store,
                        use_cache=True, logits_to_keep=n)
    cache.appended(n)
    return out.logits[0, :, : backend.vocab_limit].float()


def _keep_layers(cache, first: int, rows: list[int]) -> None:
    """The positions `rows` (ascending, all at or after `first`) moved to `first`, `first + 1`,
    ... in every layer of a transformers cache (plain attention layers: `transformers_tree_note`),
    the rest after them dropped."""
    if rows:
        index = torch.tensor(rows, device=cache.store.layers[0].keys.device)
        for layer in cache.store.layers:
            # gathered first (a copy), then written: a row may move onto one not yet read
            layer.keys[..., first:first + len(rows), :] = layer.keys.index_select(-2, index)
            layer.values[..., first:first + len(rows), :] = layer.values.index_select(-2, index)
    cache.trim(first + len(rows))


@torch.inference_mode()  # the buffer is an inference tensor (allocated inside a pass)
def keep_path(backend, pending: int, path: Sequence[int], length_before: int) -> None:
    """After `tree_logits`: the pending tokens and the accepted nodes `path` stay, in order, in
    the cache and in the inner states the drafter is handed (`last_hidden`)."""
    first = length_before + pending
    if isinstance(backend.cache, StaticKV):
        backend.cache.keep(first, [first + node for node in path])
    else:
        _keep_layers(backend.cache, first, [first + node for node in path])
    rows = [*range(pending), *(pending + node for node in path)]
    if backend._hidden is not None:
        backend._hidden = backend._hidden[:, rows]
    for index, states in backend._layer_rows.items():  # transformers' forward: each asked layer's, (1, n, H)
        backend._layer_rows[index] = states[:, rows]


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


def transformers_tree_note(backend) -> str:
    """"" where transformers' forward verifies trees for `backend`, else why it verifies chains."""
    from transformers.cache_utils import DynamicLayer

    from app.engine.backends.kv_cache_torch import BlockGrownLayer
    from app.engine.backends.torch_cache import TorchCache
    from app.models.attention_torch import NAME as TANDEM_SDPA

    if backend.compiled:
        return "trees of drafts are verified without torch.compile's compiled layers"
    cache = backend.cache
    if not isinstance(cache, TorchCache):
        return "trees of drafts are verified on transformers' own cache, which this model does not use"
    if cache.recurrent:
        return "its recurrent layers read a pass in order, so a tree's siblings would corrupt each other's state"
    if any(type(layer) not in (DynamicLayer, BlockGrownLayer) for layer in cache.store.layers):
        return "layers that keep a sliding window (or another cache of their own) verify chains of drafts"
    config = backend.model.config
    inner = getattr(backend.model, "model", None)
    # positions by depth reach attention only through RoPE computed from position_ids; ALiBi
    # (Bloom, MPT, Falcon's alibi) biases by where a key sits in the pass, and Bloom and Falcon
    # read the mask as (batch, length): a tree's nodes would be biased wrongly or refused
    if getattr(config, "alibi", False) or getattr(inner, "rotary_emb", None) is None:
        return ("trees of drafts need rotary positions taken from position ids, which this model's attention "
                "does not use")
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager", TANDEM_SDPA):  # those that take a float mask as it is
        return f"trees of drafts need a custom attention mask, which {attention} attention does not take"
    return ""
