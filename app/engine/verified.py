"""What verifying a round gives the loop (app/engine/speculative.py's verify_round for a chain,
app/engine/tree_round.py's verify_tree_round for a tree)."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.backends.base import Verdict
from app.engine.drafters import TargetState


@dataclass(frozen=True)
class Verified:
    verdict: Verdict
    seconds: float  # the target's pass and the decision
    # the target's checkpoint before the pass and rewind after it, and the drafter's own rollback
    # (a draft model's trim, or its restore and replay), replays included
    rollback_s: float
    # tokens read again to rebuild recurrent state after a rollback (0 on attention-only caches):
    # passed through the whole model again, or, with layer replay (PyTorch), the tokens whose
    # recurrent state the recurrent layers alone recomputed from the inputs they recorded
    replayed: int
    state: TargetState | None = None  # the committed positions' hidden states, when asked for
    # a tree's round: (the chain's drafts, how many of them the walked path took): what adaptive k
    # learns from it, with the pass's time at its own width (every node's)
    chain: tuple[int, int] | None = None
    path: tuple[int, ...] = ()  # a tree's round: the nodes the walk took
