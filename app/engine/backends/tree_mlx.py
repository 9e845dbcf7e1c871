"""A token tree verified in one pass of an mlx-lm model (app/engine/tree.py; issue 48), as
tree_torch.py does on PyTorch's lean step.

mlx-lm's models take no positions and no mask: each attention layer rotates its queries and keys
from one cache offset (`self.rope(x, offset=cache.offset)`: consecutive positions), and the
model builds its mask with its module's `create_attention_mask`. For the length of one tree pass
both are stood in for, per model family:
- each attention layer's `rope` by `_TreeRope`, which calls the layer's own RoPE module (its
  scaling rules included) once for the pending tokens, at their consecutive positions, and once
  per depth of the tree, with every node of that depth at position `root + 1 + depth`;
- the module's `create_attention_mask` by one returning the tree's mask: each node sees the
  context, the pending tokens and its own ancestors (SpecInfer's tree attention).

Keys and values are written in the pass's order; after the verdict the accepted path's are moved
into place behind the pending tokens and the rest dropped, in every layer's KVCache, and so are
the hidden states a drafter reads (`capture_hidden`).

Families covered, FAMILIES: their model calls `create_attention_mask(h, cache[0])` from its own
module and each attention layer `self.rope(x, offset=cache.offset)` (RoPE on part of a head, as
StableLM and GLM-4 do, included: the layer's own module does it); each is tested with a tiny
model (tests/test_tree_mlx.py). mlx-lm's Gemma 2 attends globally in every layer, and the tree
keeps to what its one-token steps do. Any other family, a sliding window (RotatingKVCache), a
quantized KV cache or recurrent layers verify chains, and `tree_note` says which.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import mlx.core as mx

from app.engine.backends.sampling_mlx import probs_from_logits
from app.engine.sampling import SamplingParams
from app.engine.tree import ROOT, TokenTree, TreeVerdict, attention_mask, parent_rows, shown_nodes, walk

# mlx-lm's model modules whose passes are stood in for as above, each tested with a tiny model
# (mistral's configs load as llama)
FAMILIES = ("cohere", "ernie4_5", "gemma", "gemma2", "glm4", "granite", "helium", "llama", "mixtral", "olmo2",
            "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "stablelm", "starcoder2")


def tree_words(model_type: str) -> str:
    """Whether a model of `model_type` verifies trees of drafts on MLX, from its config alone
    (`tandem-cli models info` on a Mac; a loaded model's `tree_note` also sees its cache)."""
    from mlx_lm.utils import MODEL_REMAPPING

    family = MODEL_REMAPPING.get(model_type, model_type)
    if family in FAMILIES:
        return (f"on MLX: trees of drafts verified (mlx-lm's {family} model, its RoPE and mask stood in for; a "
                "sliding-window or quantized KV cache verifies chains)")
    return f"on MLX: drafts verified as chains (trees on mlx-lm's {', '.join(FAMILIES)} models; not {family})"


def _family(backend) -> str:
    return type(backend._text_model()).__module__.rsplit(".", 1)[-1]


def why_not(backend) -> str:
    """"" where this MLX model verifies trees, else why it verifies chains."""
    from mlx_lm.models.cache import KVCache

    family = _family(backend)
    if family not in FAMILIES:
        return f"trees of drafts are verified on MLX for {', '.join(FAMILIES)} models, not {family}"
    kinds = {type(layer).__name__ for layer in backend.cache.layers if type(layer) is not KVCache}
    if kinds:
        return f"its cache layers ({', '.join(sorted(kinds))}) verify chains of drafts only"
    module = sys.modules[type(backend._text_model()).__module__]
    if not hasattr(module, "create_attention_mask"):
        return f"mlx-lm's {family} model builds its mask in a way Tandem does not stand in for"
    return ""


class _TreeRope:
    """A layer's RoPE for one tree pass: the pending tokens at consecutive positions from the
    cache's offset, then each depth's nodes at one position (its own call, the nodes side by side
    in a batch axis, so that mx.fast.rope gives them all that one position)."""

    def __init__(self, rope, pending: int, depths: Sequence[int]):
        self.rope, self.pending = rope, pending
        by_depth: dict[int, list[int]] = {}
        for i, depth in enumerate(depths):
            by_depth.setdefault(depth, []).append(pending + i)
        self.groups = sorted(by_depth.items())
        order = [*range(pending), *(i for _, members in self.groups for i in members)]
        self.inverse = mx.array([order.index(i) for i in range(len(order))])

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        # x (B, heads, n, head_dim); offset: the cache's length before this pass
        parts = [self.rope(x[:, :, :self.pending], offset=offset)] if self.pending else []
        for depth, members in self.groups:
            nodes = mx.expand_dims(mx.take(x, mx.array(members), axis=2), -2)  # (B, H, m, 1, hd)
            parts.append(self.rope(nodes, offset=offset + self.pending + depth)[..., 0, :])
        return mx.take(mx.concatenate(parts, axis=2), self.inverse, axis=2)


def _attention_layers(backend) -> list:
    return [layer.self_attn for layer in backend._text_model().layers]


def tree_logits(backend, ids: Sequence[int], tree: TokenTree) -> mx.array:
    """One pass over `ids` and then `tree`'s nodes -> logits (len(ids) + len(tree), V') float32:
    row len(ids) - 1 predicts the root's children, row len(ids) + i node i's. All of the pass stays
    in the cache until `keep_path`."""
    if not ids:
        raise ValueError("a tree's pass needs its root: the last token emitted, not yet read")
    why = why_not(backend)
    if why:
        raise NotImplementedError(why)
    start, pending = backend.cache.length, len(ids)
    module = sys.modules[type(backend._text_model()).__module__]
    mask = mx.array(attention_mask(pending, start, tree))
    attention = _attention_layers(backend)
    ropes = [layer.rope for layer in attention]
    own_mask = module.create_attention_mask
    try:
        for layer, rope in zip(attention, ropes, strict=True):
            layer.rope = _TreeRope(rope, pending, tree.depths)
        module.create_attention_mask = lambda *args, **kwargs: mask
        logits = backend.model(mx.array([[*ids, *tree.tokens]]), cache=backend.cache.layers)
    finally:
        module.create_attention_mask = own_mask
        for layer, rope in zip(attention, ropes, strict=True):
            layer.rope = rope
    backend.cache.appended(pending + len(tree))
    return logits[0, :, : backend.vocab_limit].astype(mx.float32)


def keep_path(backend, pending: int, path: Sequence[int], length_before: int) -> None:
    """After `tree_logits`: the pending tokens and the accepted nodes `path` stay, in order, in
    every layer's cache and in the hidden states kept for a drafter."""
    first = length_before + pending
    end = first + len(path)
    taken = mx.array([first + node for node in path], dtype=mx.int32)
    for layer in backend.cache.layers:
        if path:
            keys, values = mx.take(layer.keys, taken, axis=2), mx.take(layer.values, taken, axis=2)
            layer.keys[..., first:end, :] = keys
            layer.values[..., first:end, :] = values
        layer.offset = end
    backend.cache.counted = min(backend.cache.counted, end)
    backend.keep_hidden_rows([*range(pending), *(pending + node for node in path)])


def verify_tree(backend, ids: Sequence[int], tree: TokenTree, params: SamplingParams) -> TreeVerdict:
    """The walk of app/engine/tree.py over one pass (children taken as deterministic: exact for
    any tree), as tree_torch.verify_tree."""
    before = backend.cache.length
    logits = tree_logits(backend, ids, tree)
    pending = len(ids)
    greedy = mx.argmax(logits, axis=-1).tolist() if params.greedy else None

    def choose(node: int) -> int:
        row = pending - 1 if node == ROOT else pending + node
        if greedy is not None:
            return int(greedy[row])
        probs = probs_from_logits(logits[row], params)
        return int(mx.random.categorical(mx.log(probs), key=backend._next_key()).item())

    verdict = walk(tree, choose)
    keep_path(backend, pending, verdict.path, before)
    shown = shown_nodes(tree, verdict.path)  # the target's q of each token the round shows
    if not shown:
        return verdict
    rows = mx.array(parent_rows(tree, shown, pending))
    tokens = mx.array([tree.tokens[n] for n in shown])
    q = mx.take_along_axis(mx.softmax(logits[rows], axis=-1), tokens[:, None], axis=-1)[:, 0]
    return TreeVerdict(verdict.path, verdict.token, tuple(q.tolist()))
