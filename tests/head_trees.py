"""The check every draft head that reads the target's states shares when it drafts trees (an
aligned head, EAGLE-3; app/engine/mtp.py's propose_tree): at temperature 0 the answer is the
target's alone; tree rounds put the head's runner-ups beside its drafts; and every state the
target's passes hand the head (after a chain's verdict or a tree's, whichever branch the walk
took) is the state a fresh prefill of the committed tokens computes at those positions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.engine.tree import chain_length


@dataclass
class TreeRun:
    trees: int = 0  # tree rounds the head drafted
    off_chain: int = 0  # of them, rounds whose walk took a runner-up (the chain's draft was wrong there)
    states: int = 0  # hidden-state rows the head was handed, each checked


def _rows(x) -> np.ndarray:
    """A backend's rows of states (torch or MLX) as float32 numbers."""
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().copy()
    import mlx.core as mx

    return np.array(x.astype(mx.float32))


def check_head_trees(target, fresh, drafter, prompts, max_tokens: int = 24, k: int = 4, reader=None) -> TreeRun:
    """`reader`: the drafter that reads the states, where `drafter` holds it beside prompt lookup."""
    reader = reader or drafter
    handed: list[tuple[int, np.ndarray]] = []
    take = reader._take

    def recording(committed, state):
        handed.append((state.start, _rows(state.hidden)))
        take(committed, state)

    reader._take = recording
    run = TreeRun()
    try:
        for prompt in prompts:
            fresh.reset()
            plain = [t for e in generate(fresh, lambda ids: "", prompt, max_tokens=max_tokens)
                     if isinstance(e, Round) for t in e.emitted]
            handed.clear()
            rounds = [e for e in generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=max_tokens,
                                          draft_tokens=k, trees="on", params=SamplingParams(temperature=0.0))
                      if isinstance(e, Round)]
            tokens = [t for r in rounds for t in r.emitted]
            assert tokens == plain, "a head's trees changed the target's answer"
            for r in rounds:
                if r.tree is None:
                    continue
                run.trees += 1
                chain = r.tree.tokens[:chain_length(r.tree)]  # the tree's first path
                run.off_chain += tuple(r.drafted[:r.accepted]) != tuple(chain[:r.accepted])
            # every row handed over, against one prefill of the whole answer (its states at every position)
            assert fresh.capture_hidden(True, drafter.target_layers) == ""
            try:
                fresh.reset()
                fresh.prefill([*prompt, *tokens[:-1]])
                whole = _rows(fresh.last_hidden())
            finally:
                fresh.capture_hidden(False)
                fresh.reset()
            for start, rows in handed:
                np.testing.assert_allclose(rows, whole[start:start + rows.shape[0]], atol=2e-4, rtol=2e-4)
                run.states += rows.shape[0]
    finally:
        del reader._take
    return run
