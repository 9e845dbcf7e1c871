"""A DFlash block drafter (z-lab, 2026): one pass of a few layers drafts a whole block after the
last committed token, conditioned on the target's states from the layers it names.

The drafter keeps a KV cache of context features, one entry per committed position whose state
it has read, in order from position `base`. The target's passes hand over the states
(`wants_target_state`, `target_layers`); a proposal reads those not yet read, then runs the block
[last token, mask, mask, ...] at the positions after and drafts from its outputs. The block's own
entries never stay in the cache, so a verdict needs no rollback: the next proposal reads the
states of whatever the target committed.

Per-backend blocks: app/engine/backends/dflash_torch.py, app/engine/backends/dflash_mlx.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from app.engine.backends.base import ModelBackend
from app.engine.drafters import Drafter, Proposal, TargetState, draft_seed, draft_tree
from app.engine.sampling import SamplingParams


class BlockHead(Protocol):
    weights_bytes: int
    spec: Any  # app/models/dflash_head.DFlashHead

    def reset(self) -> None: ...

    @property
    def length(self) -> int: ...

    def trim(self, length: int) -> None: ...

    def seed(self, seed: int | None) -> None: ...

    def concat(self, rows: Any, more: Any) -> Any: ...

    def draft(self, anchor: int, rows: Any, start: int, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """(ids, p, probs, ids array), and with `runner_up` each position's runner-up (token, p)
        too: a block whose class says `runner_ups = True`."""


class DFlashDrafter(Drafter):
    wants_target_state = True
    name = "DFlash drafter"

    def __init__(self, block: BlockHead):
        self.block = block
        self.target_layers = tuple(block.spec.layers)
        self.drafts_per_pass = block.spec.block_size - 1  # one pass drafts up to this many
        self._restart(0)

    def drafts_in_one_pass(self, source: str | None) -> bool:
        return True

    @property
    def weights_bytes(self) -> int:
        return self.block.weights_bytes

    @property
    def one_time_work(self) -> int:
        """The drafter's captured graphs so far (speculative.one_time_work)."""
        return getattr(self.block, "one_time_work", 0)

    @property
    def graph_note(self) -> str:
        """Why the drafter runs its blocks without CUDA graphs, "" where nothing failed."""
        return getattr(self.block, "graph_note", "")

    def _restart(self, base: int) -> None:
        self.block.reset()
        self._base = base  # the position of the cache's first entry
        self._read: list[int] = []  # the committed token at each cached position (to tell a conversation apart)
        self._rows = None  # states handed over and not read yet, of positions base + len(read) on

    @property
    def _next(self) -> int:
        return self._base + len(self._read)

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        self.block.seed(draft_seed(seed))
        if not reuse:
            self._restart(0)

    def finish(self, committed: Sequence[int] | None) -> None:
        if committed is None:  # a pass failed midway: what the cache holds is unknown
            self._restart(0)

    def accepted(self, committed, proposal, n_accepted, state: TargetState | None = None) -> None:
        if state is not None:
            self._take(committed, state)

    def _take(self, committed: Sequence[int], state: TargetState) -> None:
        """Line up the target's rows from position `state.start` with the cache: entries whose
        tokens are still the committed ones stay (a follow-up turn after the target kept its
        cache), rows in between must be at hand, or the cache starts afresh at `state.start`
        (RoPE is relative: positions from there on are still the true ones)."""
        start, rows = state.start, state.hidden
        valid = 0
        while (valid < len(self._read) and self._base + valid < start and self._base + valid < len(committed)
               and self._read[valid] == committed[self._base + valid]):
            valid += 1
        unread = 0 if self._rows is None else self._rows.shape[0]
        if valid == len(self._read) and start <= self._next + unread:  # the same conversation, going on
            kept = None if self._rows is None else self._rows[: start - self._next]
            self._rows = rows if kept is None or kept.shape[0] == 0 else self.block.concat(kept, rows)
            return
        if self._base + valid == start:  # it kept what it shares with the last
            del self._read[valid:]
            self.block.trim(valid)
        else:  # another conversation, or rows between are gone
            self._restart(start)
        self._rows = rows

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        return self._propose(committed, k, params, should_stop)

    def propose_tree(self, committed: Sequence[int], k: int, width: int, params: SamplingParams,
                     should_stop: Callable[[], bool] | None = None) -> Proposal:
        """The block as the trunk, and beside each draft it was unsure of, that position's runner-up
        as a leaf (drafters.runner_up_tree). One token deep, as issue 48 has it: a block position
        is drafted from the anchor and the mask alone, never from the tokens before it in the
        block, so nothing below an alternative was drafted for it."""
        if not self.drafts_trees:
            return self.propose(committed, k, params, should_stop)
        return self._propose(committed, k, params, should_stop, width)

    @property
    def drafts_trees(self) -> bool:
        return getattr(self.block, "runner_ups", False)

    def _propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                 should_stop: Callable[[], bool] | None, width: int = 1) -> Proposal:
        started = time.perf_counter()
        anchor = len(committed) - 1  # the last committed token: the target has not read it yet
        unread = 0 if self._rows is None else self._rows.shape[0]
        if self._next + unread != anchor or anchor == 0:
            # no context for the positions before the anchor: nothing to draft from (the engine
            # then takes a plain step, whose pass hands the state over)
            return Proposal((), (), seconds=time.perf_counter() - started)
        (ids, p, probs, ids_array), (tree, branches, tree_p) = draft_tree(
            lambda runner_up: self.block.draft(committed[-1], self._rows, self._next, k, params, should_stop,
                                               runner_up=runner_up), width)
        self._read.extend(committed[self._next : anchor])
        self._rows = None
        return Proposal(ids, p, probs, ids_array, time.perf_counter() - started, "dflash", unread,
                        tree=tree, branches=branches, tree_p=tree_p)


def load_dflash_drafter(target: ModelBackend, head) -> DFlashDrafter:
    """A DFlash drafter (app/models/dflash_head.py: its folder, or the DFlashHead already read and
    checked against `target`) for `target`, on the target's backend."""
    import json
    from pathlib import Path

    from app.models.dflash_head import DFlashHead, read_dflash

    if not isinstance(head, DFlashHead):
        head = read_dflash(head, json.loads((Path(target.folder) / "config.json").read_text()))
    if target.name == "torch":
        from app.engine.backends.dflash_torch import TorchDFlashBlock

        return DFlashDrafter(TorchDFlashBlock(target, head))
    from app.engine.backends.dflash_mlx import MLXDFlashBlock

    return DFlashDrafter(MLXDFlashBlock(target, head))
