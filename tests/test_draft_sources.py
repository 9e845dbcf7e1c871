"""Prompt lookup beside a model or head: each source chooses its own draft length.

A lookup proposal is free and, where the text is copied, long and right; a model's costs a pass a
token. With one draft length for both, a model that did not pay turned lookup off with it (the
bench measured the demo's head + lookup at 0.88x where lookup alone ran 1.21x).
"""

from __future__ import annotations

import pytest

from app.engine.adaptive import DraftLengthController
from app.engine.backends import load_backend
from app.engine.drafters import Drafter, LookupThenModelDrafter, Proposal
from app.engine.events import Round
from app.engine.speculative import generate

PROMPT = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198]
N = 120


def _decode(ids):
    return " ".join(map(str, ids))


def test_each_source_learns_its_own_draft_length():
    c = DraftLengthController()
    model, lookup = c.for_source("model"), c.for_source("lookup")
    assert c.for_source("model") is model and c.for_source(None) is c
    # the target's cost per width does not depend on who drafted: measured once for all
    assert model.costs.t_verify is c.costs.t_verify is lookup.costs.t_verify
    c.record_plain(0.050)
    picks = {"model": [], "lookup": []}
    for _ in range(80):
        for name, control, right, cost in (("model", model, 0, 0.017), ("lookup", lookup, None, 1e-5)):
            k = control.choose()
            picks[name].append(k)
            if k:
                control.record_round(k, k if right is None else right, draft_s=k * cost, verify_s=0.050 + 0.004 * k)
            else:
                c.record_plain(0.050)
    assert sum(1 for k in picks["model"][-40:] if k) <= 2  # a draft that never pays: plain, a rare probe
    assert min(picks["lookup"][-40:]) >= 8  # while lookup, always right and free, drafts long


def test_a_block_drafters_cost_is_per_pass_so_long_blocks_pay():
    """A DFlash block costs one pass whatever it drafts: priced per token, a 60 ms pass whose
    first 8 drafts are right looked as dear at k = 8 as eight 60 ms steps, which never pays
    against a 50 ms plain step; priced per pass, the controller drafts the block."""
    per_token, per_pass = DraftLengthController(), DraftLengthController()
    per_pass.costs.per_pass = True
    for c in (per_token, per_pass):
        c.record_plain(0.050)
        for k in range(1, 16):  # every width measured: a pass costs a little more per position
            c.costs.record_verify(k + 1, 0.050 + 0.002 * k)
        for _ in range(60):
            k = c.choose()
            if k:
                accepted = min(k, 8)  # the block's first 8 drafts right, the rest wrong
                c.record_round(k, accepted, draft_s=0.060 if c is per_pass else 0.060 * k, verify_s=0.050 + 0.002 * k)
            else:
                c.record_plain(0.050)
    assert per_pass.costs.draft_cost(15) == per_pass.costs.draft_cost(1) == pytest.approx(0.060, rel=0.2)
    assert per_pass.choose() >= 8 > per_token.choose()


class _Scripted(Drafter):
    """Knows the target's answer: `right` proposes it, otherwise one wrong token then the answer.
    A model's proposal says it cost 10 ms a token (a tiny target's pass costs about 1 ms), lookup's
    nothing, so what adaptive k weighs does not hang on this machine's timing."""

    def __init__(self, prompt, plain, right: bool, every: int = 1, source: str = "model"):
        self.prompt_len, self.plain, self.right, self.every, self.source = len(prompt), plain, right, every, source
        self.proposed: list[int] = []  # k of each non-empty proposal

    def propose(self, committed, k, params, should_stop=None):
        done = len(committed) - self.prompt_len
        if done % self.every:  # a lookup that finds no match here
            return Proposal((), ())
        ids = list(self.plain[done:done + k])
        if ids and not self.right:
            ids[0] += 1
        if ids:
            self.proposed.append(len(ids))
        cost = 0.010 * len(ids) if self.source == "model" else 0.0
        return Proposal(tuple(ids), (1.0,) * len(ids), seconds=cost, source=self.source)


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load_backend(tiny_pair["target"], "torch")


def test_a_model_that_never_pays_leaves_lookup_drafting(target):
    plain = [t for e in generate(target, _decode, PROMPT, max_tokens=N) if isinstance(e, Round) for t in e.emitted]
    model = _Scripted(PROMPT, plain, right=False)
    lookup = _Scripted(PROMPT, plain, right=True, every=5, source="lookup")  # a match at one position in five
    drafter = LookupThenModelDrafter(model, lookup=lookup, min_tokens=3)
    events = list(generate(target, _decode, PROMPT, drafter=drafter, max_tokens=N, controller=DraftLengthController()))
    rounds = [e for e in events if isinstance(e, Round)]
    assert [t for r in rounds for t in r.emitted] == plain  # exact, whoever drafted
    lookup_rounds = [r for r in rounds if r.source == "lookup"]
    assert lookup_rounds and all(r.accepted == len(r.drafted) for r in lookup_rounds)
    # the wrong model drafted in its first rounds (the warm-up), then only in a probe or two (with one
    # draft length for both, lookup's long right rounds kept it drafting: 25 proposals here) ...
    assert len(model.proposed) <= 6, model.proposed
    # ... while lookup kept proposing whole continuations after it
    assert sum(len(r.drafted) for r in lookup_rounds) >= N // 3, [len(r.drafted) for r in lookup_rounds]


def test_a_backlog_read_before_drafting_is_not_the_cost_of_drafting():
    """A proposal after plain rounds first reads what they committed (an MTP layer's pairs, a draft
    model's catch-up): measured on the demo's head, 13 ms for a k = 1 probe after 24 plain rounds
    against 5 ms a round while it drafts on. Counted as drafting cost, the head never drafted again."""
    c = DraftLengthController()
    c.record_plain(0.042)
    c.record_round(4, 2, draft_s=0.045, verify_s=0.060, read=71)  # the first proposal reads the prompt
    assert c.costs.t_draft == pytest.approx(0.045 / 4)  # all it knows so far ...
    assert c.choose() == 4  # ... so it drafts on once to measure a round without the backlog
    c.record_round(4, 2, draft_s=0.020, verify_s=0.060, read=1)
    assert c.costs.t_draft == pytest.approx(0.005)  # which replaces the first figure
    c.record_round(1, 1, draft_s=0.013, verify_s=0.045, read=24)  # a probe after plain rounds
    assert c.costs.t_draft == pytest.approx(0.005)  # leaves the cost of drafting as it was
    c.record_round(2, 2, draft_s=0.012, verify_s=0.050, read=2)
    assert c.costs.t_draft == pytest.approx(0.8 * 0.005 + 0.2 * 0.006)  # a steady round counts
    assert DraftLengthController(fixed_k=3).choose() == 3


def test_a_short_draft_after_a_long_accepted_round_is_a_steady_round():
    """After 8 drafts all accepted an MTP layer reads the 9 pairs they committed before drafting
    again: that is what drafting on costs, though it is more than the next draft's own k + 1."""
    c = DraftLengthController()
    c.record_plain(0.042)
    c.record_round(8, 8, draft_s=0.040, verify_s=0.070, read=2)
    assert c.costs.t_draft == pytest.approx(0.005)
    c.record_round(1, 0, draft_s=0.008, verify_s=0.045, read=9)
    assert c.costs.t_draft == pytest.approx(0.8 * 0.005 + 0.2 * 0.0075)  # counted (capped at 1.5x)
    c.record_round(1, 1, draft_s=0.012, verify_s=0.045, read=30)  # after other rounds: a backlog
    assert c.costs.t_draft == pytest.approx(0.8 * 0.005 + 0.2 * 0.0075)


def test_proposals_say_what_they_read_first(target, tiny_pair, monkeypatch):
    """A draft model's proposal reads the tokens it has not seen: one or two while it drafts every
    round, all that lookup rounds committed after them; the loop hands that to the controller."""
    from app.engine.drafters import ModelDrafter

    plain = [t for e in generate(target, _decode, PROMPT, max_tokens=N) if isinstance(e, Round) for t in e.emitted]
    for with_lookup in (False, True):
        draft = ModelDrafter(load_backend(tiny_pair["near"], "torch"))
        lookup = _Scripted(PROMPT, plain, right=True, every=5, source="lookup")
        drafter = LookupThenModelDrafter(draft, lookup=lookup, min_tokens=3) if with_lookup else draft
        reads, record = [], DraftLengthController.record_round  # what the loop hands each source's controller
        monkeypatch.setattr(DraftLengthController, "record_round", lambda self, *args, record=record, reads=reads,
                            **kwargs: (reads.append(args[4]), record(self, *args, **kwargs)))
        controller = DraftLengthController(fixed_k=3)
        rounds = [e for e in generate(target, _decode, PROMPT, drafter=drafter, max_tokens=N, controller=controller)
                  if isinstance(e, Round) and e.drafted]
        model_reads = [r for r, e in zip(reads, rounds, strict=True) if e.source == "model"]
        assert model_reads[0] == 1  # the prefill fed it the prompt: then only the target's first token
        if not with_lookup:
            assert all(1 <= r <= 2 for r in model_reads)  # the correction, or the last draft and the bonus
        else:
            assert all(r == 0 for r, e in zip(reads, rounds, strict=True) if e.source == "lookup")
            assert max(model_reads) > 3  # a lookup round's tokens, read at the model's next proposal


class _Lookup(_Scripted):
    """Prompt lookup that finds a match every round: right where the answer copies, wrong elsewhere."""

    def __init__(self, prompt, plain, right: bool):
        super().__init__(prompt, plain, right, source="lookup")

    def acceptance_follows_text(self, source):
        return True


def test_a_copy_task_drafts_the_same_whatever_the_answer_before_it(target):
    """Issue 46: two regenerations of one copy task at temperature 0 drafted 1 and 15 tokens in the
    window. The controller kept what lookup's acceptance had been on earlier answers: after a chat
    where it was wrong it decided not to draft and waited a long probe interval. Lookup's
    acceptance is the text's, so each answer measures its own: a copy task drafts as it does after
    another copy task."""
    plain = [t for e in generate(target, _decode, PROMPT, max_tokens=N) if isinstance(e, Round) for t in e.emitted]

    def drafted(controller, right):
        rounds = [e for e in generate(target, _decode, PROMPT, drafter=_Lookup(PROMPT, plain, right),
                                      max_tokens=N, controller=controller) if isinstance(e, Round)]
        assert [t for r in rounds for t in r.emitted] == plain  # exact either way
        return sum(r.accepted for r in rounds)

    after_copy, after_general = DraftLengthController(), DraftLengthController()
    drafted(after_copy, right=True)
    for _ in range(3):  # general questions: every lookup draft rejected, plain decoding chosen
        drafted(after_general, right=False)
    copies = [drafted(after_general, right=True) for _ in range(2)]
    reference = drafted(after_copy, right=True)
    # the timing of this machine moves k, and so the accepted count, by up to a quarter (a CI run
    # saw 83 against 110); never whether it drafts: the bug drafted almost nothing after the chats
    assert min(copies) >= N // 2 and min(copies) >= 0.6 * reference, (copies, reference)
