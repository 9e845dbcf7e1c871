"""A drafter for tests that knows the answer: every rollback length on demand."""

from __future__ import annotations

from app.engine.drafters import Drafter, Proposal


class ScriptedDrafter(Drafter):
    """Proposes the target's own continuation (read off its plain answer) with one wrong token
    at a position that cycles through 0..k (k: none wrong), so that every rollback length from
    k down to 0 happens; records what it expected accepted and what was."""

    name = "scripted"

    def __init__(self, prompt, plain, vocab: int):
        self.prompt_len, self.plain, self.vocab = len(prompt), plain, vocab
        self.rounds = 0
        self.expected: list[int] = []
        self.got: list[int] = []
        self.rejected: set[int] = set()  # how many drafts each round's rollback took back

    def propose(self, committed, k, params, should_stop=None):
        done = len(committed) - self.prompt_len
        ids = list(self.plain[done:done + k])
        wrong_at = self.rounds % (k + 1)
        self.rounds += 1
        if wrong_at < len(ids):
            ids[wrong_at] = (ids[wrong_at] + 1) % self.vocab
        self.expected.append(min(wrong_at, len(ids)))
        return Proposal(tuple(ids), (1.0,) * len(ids), source="scripted")

    def accepted(self, committed, proposal, n_accepted, state=None):
        if proposal.ids:
            self.got.append(n_accepted)
            self.rejected.add(len(proposal.ids) - n_accepted)
