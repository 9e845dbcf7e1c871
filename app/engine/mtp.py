"""The target's own multi-token-prediction (MTP) layer as its drafter (DeepSeek-V3 report, sec.
2.2; Qwen3.5/3.6 ship one such layer): the layer reads the next token's embedding beside the
target's last hidden state at the position before it, and its output, through the target's head,
predicts the token after. For k drafts the layer is chained on its own output (as vLLM chains a
single MTP layer).

The layer keeps its own KV cache, one entry per committed position whose token and hidden state
it has read ("pairs": entry i read the token at position i + 1 beside the target's hidden state at
position i). The target's passes hand over the hidden states (`wants_target_state`); a proposal
first reads the pairs the target committed since the last one, then chains. Entries written while
chaining used the layer's own output instead of the target's state: they go at the next
`accepted`, whatever the verdict, and the pairs of the committed positions take their place.

Per-backend layers: app/engine/backends/mtp_torch.py, app/engine/backends/mtp_mlx.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app.engine.backends.base import ModelBackend
from app.engine.drafters import Drafter, Proposal, TargetState, draft_seed, draft_tree
from app.engine.sampling import SamplingParams
from app.models.errors import ModelFileError
from app.models.draft_heads import no_mtp_reason
from app.models.mtp_weights import find_mtp


class MTPHead(Protocol):
    weights_bytes: int

    def reset(self) -> None: ...

    @property
    def length(self) -> int: ...

    def trim(self, length: int) -> None: ...

    def seed(self, seed: int | None) -> None: ...

    def draft(self, tokens: Sequence[int], rows: Any, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """What backend.draft returns (with `runner_up`, each step's runner-up too: a head whose
        class says `runner_ups = True`)."""

    def concat(self, rows: Any, more: Any) -> Any:
        """Rows of hidden states one after the other, on the head's array library."""

    def restart_vocab(self, tokens: Sequence[int]) -> None:
        """A head with a draft vocabulary: its conversation part becomes `tokens` (the conversation
        changed under it); a head without one ignores it."""


class MTPDrafter(Drafter):
    wants_target_state = True

    def __init__(self, head: MTPHead, name: str = "built-in MTP head", source: str = "mtp",
                 target_layers: tuple[int, ...] = ()):
        self.head = head
        self.name = name
        self.source = source  # what the side panel's rounds say drafted them
        self.target_layers = target_layers  # the target's inner layers the head reads (EAGLE-3's three)
        self._restart(0)

    @property
    def weights_bytes(self) -> int:
        return self.head.weights_bytes

    @property
    def one_time_work(self) -> int:
        """The head's captured graphs so far (speculative.one_time_work)."""
        return getattr(self.head, "one_time_work", 0)

    @property
    def graph_note(self) -> str:
        """Why the head runs (some of) its passes without CUDA graphs, "" where nothing failed."""
        return getattr(self.head, "graph_note", "")

    def _restart(self, base: int) -> None:
        """An empty layer cache whose first pair will be the one of position `base`."""
        self.head.reset()
        self._base = base  # the position of pair 0's hidden state
        self._pairs: list[int] = []  # the token each cache entry read
        self._rows = None  # the target's hidden states not yet read, of positions base + len(pairs) on

    @property
    def _next(self) -> int:
        """The position of the first hidden state the layer has not read."""
        return self._base + len(self._pairs)

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        self.head.seed(draft_seed(seed))
        if not reuse:
            self._restart(0)

    def finish(self, committed: Sequence[int] | None) -> None:
        if committed is None:  # a pass failed midway: what the layer holds is unknown
            self._restart(0)
        else:  # keep the pairs and unread rows: a follow-up turn that extends them goes on from there
            self.head.trim(len(self._pairs))

    def _take(self, committed: Sequence[int], state: TargetState) -> None:
        """Line up the target's rows from position `state.start` with what the layer holds: pairs
        of positions before it stay where their tokens are still the committed ones (a follow-up
        turn after the target kept its cache); rows in between must be at hand, or the layer
        starts afresh at `state.start` (its positions are relative: it then reads from there)."""
        start, rows = state.start, state.hidden
        valid = 0
        while (valid < len(self._pairs) and self._base + valid < start
               and self._base + valid + 1 < len(committed)
               and self._pairs[valid] == committed[self._base + valid + 1]):
            valid += 1
        unread = 0 if self._rows is None else self._rows.shape[0]
        if valid == len(self._pairs) and start <= self._next + unread:  # the same conversation, going on
            kept = None if self._rows is None else self._rows[: start - self._next]
            self._rows = rows if kept is None or kept.shape[0] == 0 else self.head.concat(kept, rows)
            return
        if valid < len(self._pairs) and self._base + valid == start:  # it kept what it shares with the last
            del self._pairs[valid:]
            self.head.trim(valid)
        else:  # another conversation, or rows between are gone (never read them out of place)
            self._restart(start)
        self._rows = rows
        # a new chat, a set-aside one taken up again, a regenerated answer: the head's draft
        # vocabulary takes this conversation's tokens up to here, not the last one's
        self.head.restart_vocab(committed[1 : start + 1])

    def accepted(self, committed, proposal, n_accepted, state=None) -> None:
        self.head.trim(len(self._pairs))  # the chained steps' entries go, whatever the verdict
        if state is not None:
            self._take(committed, state)

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        return self._propose(committed, k, params, should_stop)

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """The chain, and its runner-up tokens as leaves where the layer was unsure
        (drafters.runner_up_tree): the target's pass hands back the states of the path it keeps,
        whichever branch that is, so the layer reads on from there as after a chain."""
        if not self.drafts_trees:
            return self.propose(committed, k, params, should_stop)
        return self._propose(committed, k, params, should_stop, width)

    @property
    def drafts_trees(self) -> bool:
        return getattr(self.head, "runner_ups", False)  # a head whose steps name their runner-ups

    def _propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                 should_stop: Callable[[], bool] | None, width: int = 1) -> Proposal:
        started = time.perf_counter()
        pending = len(committed) - 1  # the position of the token the target has not read yet
        unread = 0 if self._rows is None else self._rows.shape[0]
        if unread == 0 or self._next + unread != pending:
            # no state for the positions before the pending token: nothing to draft from (the
            # engine then takes a plain step, whose pass hands the state over)
            return Proposal((), (), seconds=time.perf_counter() - started)
        tokens = list(committed[self._next + 1 : pending + 1])
        (ids, p, probs, ids_array), (tree, branches, tree_p) = draft_tree(
            lambda runner_up: self.head.draft(tokens, self._rows, k, params, should_stop, runner_up=runner_up), width)
        self._pairs.extend(tokens)
        self._rows = None
        return Proposal(ids, p, probs, ids_array, time.perf_counter() - started, self.source, len(tokens),
                        tree=tree, branches=branches, tree_p=tree_p)


def load_mtp_drafter(target: ModelBackend) -> MTPDrafter:
    """The target checkpoint's own MTP layer as a drafter, on the target's backend; a clear
    ModelFileError where the checkpoint has none."""
    weights = find_mtp(target.folder)
    if weights is None:
        raise ModelFileError(no_mtp_reason(target.folder))
    if target.name == "torch":
        from app.engine.backends.mtp_torch import TorchMTPHead

        return MTPDrafter(TorchMTPHead(target, weights))
    from app.engine.backends.mtp_mlx import MLXMTPHead

    return MTPDrafter(MLXMTPHead(target, weights))


def load_head_drafter(target: ModelBackend, folder) -> MTPDrafter:
    """A draft head aligned to the target (app/align/; app/models/aligned_head.py): the same
    layer as a built-in MTP layer, read from its own folder, drafting the same way."""
    import json
    from pathlib import Path

    from app.models.aligned_head import draft_vocab, head_weights

    config = json.loads((Path(target.folder) / "config.json").read_text())
    weights = head_weights(folder, config)
    vocab = draft_vocab(folder, target.vocab_size)  # FR-Spec's subset, where the head has one
    if target.name == "torch":
        from app.engine.backends.mtp_torch import TorchMTPHead

        return MTPDrafter(TorchMTPHead(target, weights, vocab), "aligned draft head", "head")
    from app.engine.backends.mtp_mlx import MLXMTPHead

    return MTPDrafter(MLXMTPHead(target, weights, aligned=True, vocab=vocab), "aligned draft head", "head")


def load_eagle3_drafter(target: ModelBackend, head) -> MTPDrafter:
    """An EAGLE-3 head (app/models/eagle3_head.py: its folder, or the Eagle3Head already read and
    checked against `target`) drafting for `target`, on the target's backend: the MTP drafter's
    pairs and chaining, fed the states of the three layers the head reads."""
    import json
    from pathlib import Path

    from app.models.eagle3_head import Eagle3Head, read_eagle3

    if not isinstance(head, Eagle3Head):
        head = read_eagle3(head, json.loads((Path(target.folder) / "config.json").read_text()))
    if target.name == "torch":
        from app.engine.backends.eagle3_torch import TorchEagle3Head

        return MTPDrafter(TorchEagle3Head(target, head), "EAGLE-3 head", "eagle3", head.layers)
    from app.engine.backends.eagle3_mlx import MLXEagle3Head

    return MTPDrafter(MLXEagle3Head(target, head), "EAGLE-3 head", "eagle3", head.layers)
