"""A prompt read in chunks (app/engine/prefill.py): the same answers as one pass, every prompt
position's hidden state handed to a drafter that reads them, and Stop heard between chunks, on
both backends (chunks of 8 here, so tiny models' prompts span several)."""

from __future__ import annotations

import pytest

from app.engine import prefill
from app.engine.backends import load_backend
from app.engine.drafters import Drafter, ModelDrafter, Proposal
from app.engine.events import Finished, Round
from app.engine.speculative import generate

PROMPT = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198, 40, 41, 42, 40, 41, 42, 40, 41, 7, 8, 9, 10, 11, 12]
N = 24


class StateReader(Drafter):
    """Proposes nothing; keeps the hidden states each target pass hands over."""

    wants_target_state = True

    def __init__(self):
        self.handed = []

    def propose(self, committed, k, params, should_stop=None):
        return Proposal((), ())

    def accepted(self, committed, proposal, n_accepted, state=None):
        if state is not None:
            self.handed.append((len(committed), state.start, None if state.hidden is None else len(state.hidden)))


def _count_prefills(backend, monkeypatch) -> tuple[list[int], object]:
    """(the length of each prefill pass of `backend`'s class from now on, the unpatched prefill)."""
    reads, original = [], type(backend).prefill

    def counted(self, ids):
        reads.append(len(ids))
        return original(self, ids)

    monkeypatch.setattr(type(backend), "prefill", counted)
    return reads, original


def _answer(target, drafter=None, **options):
    events = list(generate(target, lambda ids: "", PROMPT, drafter=drafter, max_tokens=N, **options))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1]


@pytest.fixture(params=["torch", "mlx"])
def backends(request, tiny_pair):
    suffix = "" if request.param == "torch" else "_mlx"
    return {role: load_backend(tiny_pair[role + suffix], request.param) for role in ("target", "near")}


def test_chunks_give_the_one_pass_answer_and_every_prompt_row(backends, monkeypatch):
    target = backends["target"]
    whole, _ = _answer(target)
    whole_near, _ = _answer(target, ModelDrafter(backends["near"]), draft_tokens=3)
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)  # 25 prompt tokens: passes of 8, 8, 8 and 1
    reads, original = _count_prefills(target, monkeypatch)
    assert _answer(target)[0] == whole
    assert reads[:3] == [8, 8, 8]  # the prompt really was read in chunks
    assert _answer(target, ModelDrafter(backends["near"]), draft_tokens=3)[0] == whole_near == whole
    reader = StateReader()
    assert _answer(target, reader)[0] == whole
    # the prefill's hand-over covers all 25 prompt positions, joined across the chunks
    assert reader.handed[0] == (len(PROMPT) + 1, 0, len(PROMPT))


def test_stop_is_heard_between_chunks_and_the_next_answer_is_whole(backends, monkeypatch):
    target = backends["target"]
    whole, _ = _answer(target)
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)
    reads, original = _count_prefills(target, monkeypatch)
    tokens, finished = _answer(target, should_stop=lambda: len(reads) >= 1)  # Stop during the first chunk
    assert tokens == [] and isinstance(finished, Finished)
    assert finished.stats.finish_reason == "cancelled" and finished.stats.tokens == 0
    assert reads == [8]  # the second chunk never ran
    # the draft model's prompt is read in chunks too, and Stop ends it there
    draft_reads = []
    draft = backends["near"]
    monkeypatch.setattr(type(draft), "prefill", lambda self, ids: (draft_reads.append(len(ids)), original(self, ids)))
    tokens, finished = _answer(target, ModelDrafter(draft), should_stop=lambda: len(draft_reads) >= 1)
    assert tokens == [] and finished.stats.finish_reason == "cancelled" and len(draft_reads) == 1
    # what the cut prefill left in the caches is not taken for the prompt's
    assert _answer(target, reuse_cache=True)[0] == whole
    assert _answer(target, ModelDrafter(draft), draft_tokens=3, reuse_cache=True)[0] == whole
