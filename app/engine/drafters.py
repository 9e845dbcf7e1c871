"""Draft sources behind one small interface (transformers' candidate generators are the model:
`get_candidates` / `update_candidate_strategy`).

A drafter proposes up to k tokens after the committed sequence and is told how many the target
accepted, so it can roll its own state back. Drafters that condition on the target's hidden
states or read its KV cache (MTP heads, EAGLE-3, DFlash, Gemma 4 assistants) set
`wants_target_state` and receive, in `accepted()` after every target pass (the prefill, each
verify pass, each plain step), a `TargetState` with the final hidden states of the positions
that pass committed: one more class, not a redesign. Only then does the target keep them.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine.backends.base import ModelBackend
from app.engine.cache import Checkpoint
from app.engine.lookup import LookupIndex
from app.engine.prefill import prefill_chunked
from app.engine.reuse import remember, start_cache
from app.engine.sampling import SamplingParams
from app.models.names import display_name


@dataclass(frozen=True)
class Proposal:
    ids: tuple[int, ...]
    p: tuple[float, ...]  # the draft's probability of each proposed token (1.0: deterministic)
    probs: Any = None  # device array (k, V) of the draft distributions; None: one-hot at `ids`
    ids_array: Any = None  # the same ids as a device array, when the drafter has one
    seconds: float = 0.0
    source: str = ""  # which drafter wrote it ("model", "lookup"), for the side panel and stats
    # committed tokens the drafter read before its first draft (a draft model's catch-up, an MTP
    # layer's pairs), within `seconds`: after plain or lookup rounds a proposal pays for those first
    read: int = 0
    # alternatives beside `ids` (app/engine/tree.py's TokenTree, whose first path is `ids`), from a
    # drafter asked for a tree; None: a chain. After a tree's verdict, `ids` is the walked path
    # (and the first child where it stopped) and `tree` what was verified.
    tree: Any = None
    branches: int = 1  # the paths the drafter offered (a chain: 1), whether or not a tree was verified
    tree_p: tuple[float, ...] = ()  # the draft's probability of each node of `tree` (as `p` of `ids`)


@dataclass(frozen=True)
class TargetState:
    """What the target's passes hand a drafter that conditions on them (MTP heads, EAGLE, Gemma 4
    assistants), asked for with `wants_target_state`: the last hidden state (the final norm's
    output, what the head reads) of each position a pass committed, and the target itself for
    read access to its cache."""

    # (n, hidden) on the device, positions start .. start + n - 1; with the drafter's
    # target_layers, (n, len(target_layers) * hidden): those layers' states side by side
    hidden: Any
    start: int  # the position of hidden's first row in the committed sequence
    backend: ModelBackend | None = None


UNSURE = 0.5  # a draft token this likely or less gets its runner-up beside it in a tree (docs/trees.md)


def runner_up_tree(ids: tuple[int, ...], p: tuple[float, ...], second: tuple[int, ...],
                   second_p: tuple[float, ...], width: int):
    """A drafted chain with, at its least sure positions (the draft's own probability under
    UNSURE: EAGLE-2's confidence rule, Li et al. 2024), the runner-up token as a leaf beside the
    draft there: up to width - 1 of them. Leaves only: below an alternative the draft has read
    nothing to draft from. -> (the TokenTree, or None where no position was unsure; the branches;
    each node's draft probability)."""
    from app.engine.tree import TokenTree

    unsure = sorted((q, i) for i, q in enumerate(p[:len(second)])
                    if q < UNSURE and second[i] != ids[i] and second_p[i] > 0)[:max(width - 1, 0)]
    at = sorted(i for _, i in unsure)
    if not at:
        return None, 1, ()
    paths = [ids, *(ids[:i] + (second[i],) for i in at)]
    return TokenTree.from_paths(paths), len(paths), (*p, *(second_p[i] for i in at))


def draft_tree(draft: Callable[[bool], tuple], width: int):
    """`draft(runner_up)` called as a tree needs it: with each step's runner-up where the tree may
    hold alternatives (width > 1). -> ((ids, p, probs, ids array), (tree, branches, tree_p) as
    runner_up_tree gives them, or a chain's (None, 1, ()))."""
    if width <= 1:
        return draft(False), (None, 1, ())
    ids, p, probs, ids_array, (second, second_p) = draft(True)
    return (ids, p, probs, ids_array), runner_up_tree(ids, p, second, second_p, width)


def draft_seed(seed: int | None) -> int | None:
    """The draft's own seed, derived from the user's: a seeded answer repeats, yet the draft's
    stream never mirrors the target's (None: each backend draws its own from the OS)."""
    if seed is None:
        return None
    return int.from_bytes(hashlib.sha256(f"tandem-draft:{seed}".encode()).digest()[:8], "little") >> 1


class Drafter(ABC):
    name: str = "drafter"
    wants_target_state: bool = False
    # with wants_target_state: the target's inner layers whose states it reads, side by side
    # (EAGLE-3's low, middle and high layers); () the final norm's output
    target_layers: tuple[int, ...] = ()

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        """A new generation begins after `prompt_ids`; `seed` is the user's (None: unseeded);
        `reuse`: a cache may keep what it holds of the prompt (app/engine/reuse.py); a drafter
        that reads the prompt stops reading when `should_stop()` turns true."""

    def finish(self, committed: Sequence[int] | None) -> None:
        """The generation ended with `committed` (None: a pass failed, caches are unknown)."""

    @abstractmethod
    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        """Up to `k` tokens that may follow `committed` (fewer, or none, is allowed; a drafter
        that takes several steps returns what it has when `should_stop()` turns true)."""

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """Like `propose`, with up to `width` alternative branches of up to k tokens in
        `Proposal.tree` where the drafter has them (its first branch is the chain `propose` gives).
        A drafter without alternatives proposes its chain."""
        return self.propose(committed, k, params, should_stop)

    @property
    def drafts_trees(self) -> bool:
        """Whether `propose_tree` can give alternatives (prompt lookup's other matches)."""
        return False

    def room(self, committed: Sequence[int]) -> int | None:
        """The most tokens it can propose after `committed` and still roll back (None: no limit)."""
        return None

    def next_source(self, committed: Sequence[int]) -> str | None:
        """Which of its sources will propose after `committed`, for a drafter that has several
        (the loop then chooses k with that source's own measurements); None: it has one."""
        return None

    def drafts_in_one_pass(self, source: str | None) -> bool:
        """Whether `source` (next_source's answer) drafts all its tokens in one pass, so that its
        cost does not grow with k (a DFlash block); else each draft token costs a step."""
        return False

    def acceptance_follows_text(self, source: str | None) -> bool:
        """Whether `source`'s acceptance is a property of the text being written (prompt lookup
        is right where the answer copies its context, and wrong elsewhere) rather than of the
        drafter: adaptive k then measures it afresh for each answer (DraftLengthController.new_answer)."""
        return False

    def accepted(self, committed: Sequence[int], proposal: Proposal, n_accepted: int,
                 state: TargetState | None = None) -> None:
        """The target accepted `n_accepted` of `proposal`; `committed` is the new sequence. A
        drafter that `wants_target_state` is called after every target pass (the prefill and
        plain steps too, with an empty proposal) with the hidden states of the positions that
        pass committed, so it sees each committed position exactly once."""

    def can_speculate(self) -> str | None:
        """None when speculation is possible; otherwise the reason it is not."""
        return None


class ModelDrafter(Drafter):
    """A small model with the target's tokenizer, decoding k tokens autoregressively."""

    def __init__(self, backend: ModelBackend):
        self.backend = backend
        self.name = f"draft model {display_name(backend.folder)}"
        self._mark: Checkpoint | None = None  # the draft's cache before its last proposal
        self._chain: tuple[int, tuple[int, ...]] | None = None  # (committed then, its drafts): see accepted

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        kept = start_cache(self.backend, prompt_ids, reuse)
        self.backend.seed(draft_seed(seed))
        # with the target's prefill, not in round 1's draft time; in chunks, so Stop is heard
        prefill_chunked(self.backend, prompt_ids[kept:], should_stop or (lambda: False))

    def finish(self, committed: Sequence[int] | None) -> None:
        remember(self.backend, committed)  # the draft's cache holds a prefix of it (see accepted)

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        start = time.perf_counter()
        self._mark = self.backend.checkpoint()  # where a draft with recurrent layers goes back to
        # Catch up on what the draft has not seen (the last committed token, and after a fully
        # accepted round also its own last draft, or a lookup round's tokens), then draft k tokens.
        catch_up = list(committed[self.backend.cache_len :])
        ids, p, probs, ids_array = self.backend.draft(catch_up, k, params, should_stop)
        self._chain = (len(committed), ids)
        return Proposal(ids, p, probs, ids_array, time.perf_counter() - start, "model", len(catch_up))

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """The chain, and its runner-up tokens as leaves where it was unsure (runner_up_tree)."""
        if not self.drafts_trees:
            return self.propose(committed, k, params, should_stop)
        start = time.perf_counter()
        self._mark = self.backend.checkpoint()
        catch_up = list(committed[self.backend.cache_len :])
        (ids, p, probs, ids_array), (tree, branches, tree_p) = draft_tree(
            lambda runner_up: self.backend.draft(catch_up, k, params, should_stop, runner_up=runner_up), width)
        self._chain = (len(committed), ids)
        return Proposal(ids, p, probs, ids_array, time.perf_counter() - start, "model", len(catch_up), tree=tree,
                        branches=branches, tree_p=tree_p)

    @property
    def drafts_trees(self) -> bool:
        return self.backend.name in ("torch", "mlx")  # its runner-up tokens (each backend's DraftSteps)

    def room(self, committed: Sequence[int]) -> int | None:
        # A draft of k appends the catch-up and k - 1 drafts to the draft's own cache.
        room = self.backend.rollback_room()
        if room is None:
            return None
        return max(room - (len(committed) - self.backend.cache_len) + 1, 0)

    def accepted(self, committed, proposal, n_accepted, state=None) -> None:
        # The draft cache holds the old committed tokens + its drafts[:k-1], and the new committed
        # sequence is old + what the round took + one target token: the common prefix is what
        # stays. (After a tree's round what it took may leave the drafts at an alternative.)
        keep = min(self.backend.cache_len, len(committed) - 1)
        if self._chain is not None:
            at, drafts = self._chain
            agree = next((i for i, t in enumerate(drafts) if at + i >= len(committed) or committed[at + i] != t),
                         len(drafts))
            keep = min(keep, at + agree)
        mark, self._mark, self._chain = self._mark, None, None
        if mark is None:  # a lookup round: the model drafted nothing, so its cache is unchanged
            self.backend.truncate(keep)
            return
        held = self.backend.rewind(mark, keep)
        # Where recurrent state went back to before this round's catch-up and its layers did not
        # advance it again themselves (layer replay), read the kept tokens again now, or the
        # catch-up would grow with every rejected round.
        self.backend.prefill(committed[held:keep])

    def can_speculate(self) -> str | None:
        if self.backend.rollback_room() is not None:
            self.backend.reset()  # a window's room: decide on a fresh cache, not the previous answer's
        if not self.backend.can_trim():
            return self.backend.no_rollback_reason().replace("the target", "the draft model", 1)
        return None


class PromptLookupDrafter(Drafter):
    """Prompt lookup decoding (Saxena 2023): find the latest earlier occurrence of the last n
    tokens (n from max_ngram down to min_ngram) in prompt + output and propose what followed;
    with min_ngram > 1, also where a copy resumes after an edit (app/engine/lookup.py)."""

    name = "prompt lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index = LookupIndex(max_ngram, min_ngram)

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        start = time.perf_counter()
        follow = self.index.continuation(committed, k)
        if follow:
            return Proposal(follow, (1.0,) * len(follow), seconds=time.perf_counter() - start, source="lookup")
        return Proposal((), (), seconds=time.perf_counter() - start)

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """The continuations of the tail's different matches, latest first, merged into a trie
        (their shared prefixes once): the first is the chain `propose` gives."""
        from app.engine.tree import TokenTree

        from app.engine.tree_choice import ALTERNATIVE_TOKENS

        start = time.perf_counter()
        paths = self.index.continuations(committed, k, width)
        if not paths:
            return Proposal((), (), seconds=time.perf_counter() - start)
        # the alternatives shorter than the chain: they are seldom right, and each node widens the pass
        paths = [paths[0], *(path[:ALTERNATIVE_TOKENS] for path in paths[1:])]
        tree = TokenTree.from_paths(paths)
        return Proposal(paths[0], (1.0,) * len(paths[0]), seconds=time.perf_counter() - start, source="lookup",
                        tree=None if tree.is_chain else tree, branches=len(paths), tree_p=(1.0,) * len(tree))

    @property
    def drafts_trees(self) -> bool:
        return True

    def finish(self, committed: Sequence[int] | None) -> None:
        self.index.clear()  # its memory grows with the chat; the next answer indexes its own

    def acceptance_follows_text(self, source: str | None) -> bool:
        return True


def chat_lookup() -> PromptLookupDrafter:
    """Prompt lookup as Tandem drafts with it (`ngram`, and beside a model): matches of 3-4 tokens
    only. On the demo's GGUF (bench suite, 8 prompts, 2 repeats, one run) it ran 1.62x [1.56-1.68]
    the target alone, against 1.30x [1.14-1.47] with matches of 1-3 tokens: a one-token match is
    mostly wrong (45% of first drafts accepted against 90%) and widens the verify pass for nothing."""
    return PromptLookupDrafter(max_ngram=4, min_ngram=3)


MAX_LOOKUP = 64  # the longest lookup continuation looked at when choosing the source


class LookupThenModelDrafter(Drafter):
    """Prompt lookup where the answer repeats its context, the draft model (or MTP layer) everywhere else.

    A lookup proposal costs microseconds where a model draft costs a forward pass per token, and
    where the text is being copied (an edited email, a function written out again) it is as
    right as the model. Lookup takes the round only on a match of at least `min_ngram` tokens
    that offers `min_tokens` or more, so chance one-token matches do not displace a better
    model draft. The model's cache simply lags during lookup rounds and catches up, in one
    pass, the next time it drafts. Any drafter keeps verification exact: this only changes
    which tokens are proposed."""

    def __init__(self, model: Drafter, lookup: PromptLookupDrafter | None = None, min_tokens: int = 3):
        self.model = model  # a draft model, or any drafter that drafts by computing (an MTP layer)
        self.lookup = lookup or chat_lookup()
        self.min_tokens = min_tokens
        self._decided: tuple[int, str, Proposal] | None = None  # next_source's choice, for propose
        self.name = f"{model.name} + prompt lookup"
        # a drafter fed by the target's passes is fed on lookup rounds too: it sees every position
        self.wants_target_state = model.wants_target_state
        self.target_layers = model.target_layers  # the states its model reads

    @property
    def backend(self) -> ModelBackend | None:
        return getattr(self.model, "backend", None)  # a draft model's; None for an MTP layer

    @property
    def one_time_work(self) -> int:
        return getattr(self.model, "one_time_work", 0)  # a draft head's captures (a draft model's: its backend's)

    @property
    def graph_note(self) -> str:
        return getattr(self.model, "graph_note", "")  # a draft head's capture that failed

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        self.model.start(prompt_ids, seed, reuse, should_stop)

    def finish(self, committed: Sequence[int] | None) -> None:
        self.model.finish(committed)
        self.lookup.finish(committed)

    def drafts_in_one_pass(self, source: str | None) -> bool:
        return source == "model" and self.model.drafts_in_one_pass(None)

    def acceptance_follows_text(self, source: str | None) -> bool:
        return source == "lookup" or self.model.acceptance_follows_text(None)

    def next_source(self, committed: Sequence[int]) -> str:
        found = self.lookup.propose(committed, MAX_LOOKUP, SamplingParams())
        source = "lookup" if len(found.ids) >= self.min_tokens else "model"
        self._decided = (len(committed), source, found)
        return source

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        decided, self._decided = self._decided, None
        if decided is not None and decided[0] == len(committed):  # the source the loop chose k for
            _, source, found = decided
            found = replace(found, ids=found.ids[:k], p=found.p[:k])
        else:
            found = self.lookup.propose(committed, k, params)
            source = "lookup" if len(found.ids) >= min(k, self.min_tokens) else "model"
        if source == "lookup":
            return found
        proposal = self.model.propose(committed, k, params, should_stop)
        return replace(proposal, seconds=proposal.seconds + found.seconds)

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """On a lookup round, lookup's tree (its chain is what `propose` gives); the model's chain
        otherwise. (The model's cache lags through lookup rounds whatever they verify.)"""
        decided = self._decided
        if decided is not None and decided[0] == len(committed) and decided[1] == "lookup":
            self._decided = None
            return self.lookup.propose_tree(committed, k, width, params, should_stop)
        if decided is not None and decided[0] == len(committed):
            self._decided = None
            proposal = self.model.propose_tree(committed, k, width, params, should_stop)
            return replace(proposal, seconds=proposal.seconds + decided[2].seconds)
        return self.propose(committed, k, params, should_stop)

    @property
    def drafts_trees(self) -> bool:
        return True

    def room(self, committed: Sequence[int]) -> int | None:
        return self.model.room(committed)

    def accepted(self, committed, proposal, n_accepted, state=None) -> None:
        self.model.accepted(committed, proposal, n_accepted, state)

    def can_speculate(self) -> str | None:
        return self.model.can_speculate()


def head_passes(drafter, device: str) -> str:
    """How a draft head on PyTorch (an MTP layer, an EAGLE-3 head, a DFlash drafter) runs its passes
    (head_graphs_torch.py), for the draft's detail: "" for other drafters and for MLX's heads."""
    inner = getattr(drafter, "model", drafter)
    head = getattr(inner, "head", None) or getattr(inner, "block", None)
    mode = getattr(head, "graph_mode", None)
    if mode is None:
        return ""
    if mode == "capture":
        return "passes: CUDA graphs"
    if mode == "static":
        return "passes: fixed buffers, eagerly"
    return "passes: eager (CUDA graphs turned off)" if str(device).startswith("cuda") else ""
