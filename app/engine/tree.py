"""A tree of drafted tokens, flattened into one verify pass (issue 48's first wired step).

Each node is a drafted token whose parent is an earlier node, or the root: the last token the
target has read (or will read first in the same pass). Nodes are kept parents-first, so a pass
takes them in order and a node's ancestors always sit before it. In the pass each node is
- placed at RoPE position `start + depth` (its depth below the root, 0 for the root's children);
- shown only the context and its own ancestors (SpecInfer's tree attention, Miao et al., 2024).

The verdict walks the tree from the root: at each node the target's own token is chosen (its
argmax at temperature 0, a draw from its distribution above 0); where a child carries that token
the walk descends into it, else the chosen token ends the round. A drafter's children here are
deterministic (lookup's trie, a draft's top-k), so this is exact: every emitted token is the
target's own choice given the accepted prefix, whatever the tree held. (For children sampled
from a draft distribution, SpecInfer's rule and recursive rejection sampling accept more; they
are not used here, since no drafter here samples its children.)

The pass's mask is built here once, as NumPy (`attention_mask`); the backends turn it and `depths`
into their own arrays and positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

ROOT = -1  # a node whose parent is the root


@dataclass(frozen=True)
class TokenTree:
    tokens: tuple[int, ...]  # node i's token
    parents: tuple[int, ...]  # node i's parent: an earlier node, or ROOT

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i}'s parent {parent} is not an earlier node or the root")
        seen = set()
        for token, parent in zip(self.tokens, self.parents, strict=True):
            if (parent, token) in seen:
                raise ValueError(f"two children of one node carry token {token}: merge them")
            seen.add((parent, token))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TokenTree:
        """The trie of `paths` (each a chain of tokens below the root), shared prefixes merged,
        nodes in the order first met."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for path in paths:
            parent = ROOT
            for token in path:
                key = (parent, int(token))
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(parent)
                parent = index[key]
        return cls(tuple(tokens), tuple(parents))

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Node i's depth below the root (0: a child of the root)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(0 if parent == ROOT else out[parent] + 1)
        return tuple(out)

    def path(self, node: int) -> tuple[int, ...]:
        """The nodes from the root's child down to `node`."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return tuple(reversed(out))

    @cached_property
    def visible(self) -> tuple[frozenset[int], ...]:
        """Node i's ancestors and itself: the tree nodes its attention may see."""
        return tuple(frozenset(self.path(i)) for i in range(len(self)))

    def children(self, node: int) -> dict[int, int]:
        """{token: child node} below `node` (ROOT for the root)."""
        return {t: i for i, (t, p) in enumerate(zip(self.tokens, self.parents, strict=True)) if p == node}

    def first_child(self, node: int) -> int | None:
        """`node`'s first child (the drafter's first guess there), or None."""
        return next((i for i, p in enumerate(self.parents) if p == node), None)

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))


@dataclass(frozen=True)
class TreeVerdict:
    path: tuple[int, ...]  # the accepted nodes, root's child first
    token: int  # the target's own token after them
    # the target's probability (temperature 1, for display) of each node of the path and of the
    # first child where the walk stopped, when the backend gives it
    q: tuple[float, ...] = ()

    def emitted(self, tree: TokenTree) -> list[int]:
        return [tree.tokens[i] for i in self.path] + [self.token]


def walk(tree: TokenTree, choose: Callable[[int], int]) -> TreeVerdict:
    """The verdict: `choose(node)` is the target's own token at `node` (ROOT: at the root), chosen
    from the logits the pass gave there. Descends while a child carries the chosen token."""
    node, path = ROOT, []
    while True:
        token = choose(node)
        child = tree.children(node).get(token)
        if child is None:
            return TreeVerdict(tuple(path), token)
        path.append(child)
        node = child


def shown_nodes(tree: TokenTree, path: Sequence[int]) -> list[int]:
    """The nodes a round shows: the walked path, then the drafter's first guess where it stopped."""
    first = tree.first_child(path[-1] if path else ROOT)
    return [*path, *(() if first is None else (first,))]


def parent_rows(tree: TokenTree, nodes: Sequence[int], pending: int) -> list[int]:
    """For each node, the row of its tree pass whose logits predicted it: its parent's, or for a
    child of the root the last pending token's."""
    return [pending - 1 if tree.parents[n] == ROOT else pending + tree.parents[n] for n in nodes]


def attention_mask(pending: int, start: int, tree: TokenTree):
    """The mask of a pass that reads `pending` tokens causally after `start` cached ones, then
    `tree`'s nodes: (n, start + n) bool, True where a row may look (the context, the pending tokens
    causally, and each node its ancestors and itself)."""
    import numpy as np

    n = pending + len(tree)
    mask = np.zeros((n, start + n), bool)
    mask[:, :start] = True
    mask[:pending, start:start + pending] = np.tril(np.ones((pending, pending), bool))
    mask[pending:, start:start + pending] = True
    for i, seen in enumerate(tree.visible):
        mask[pending + i, [start + pending + j for j in seen]] = True
    return mask


def chain_length(tree: TokenTree) -> int:
    """The tree's first path, the drafter's chain: nodes 0, 1, ... each the child of the one before."""
    return next((i for i, parent in enumerate(tree.parents) if parent != i - 1), len(tree))


def on_chain(path: Sequence[int]) -> int:
    """How far a walked path followed the chain (node i at depth i) before it left it or stopped."""
    return next((i for i, node in enumerate(path) if node != i), len(path))
