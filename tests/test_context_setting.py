"""The context a chat may hold: the model's own, less where asked (`--context`, Runner.load) or
where memory holds less; fitting, the engine and the memory check all use it."""

from __future__ import annotations

import pytest

from app.draft_choice import PROMPT_LOOKUP, DraftChoice
from app.chat.context import ContextOverflowError
from app.engine.events import Finished, Notice
from app.models.memory import MIN_CONTEXT, MemoryEstimate, longest_chat
from app.runner import ChatRequest, Runner


def _long_chat(turns: int) -> list[dict]:
    chat = []
    for n in range(turns):
        chat += [{"role": "user", "content": f"Question {n} about rivers?"},
                 {"role": "assistant", "content": f"Answer {n}: rivers flow."}]
    return chat + [{"role": "user", "content": "And the last one?"}]


def test_a_context_asked_for_bounds_every_chat(tiny_pair):
    runner = Runner()
    loaded = runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]), context=128,
                         progress=lambda m: None)
    assert loaded.context_length == runner.target.context_length == 128
    events = list(runner.chat(ChatRequest(tuple(_long_chat(6)), max_tokens=16)))
    assert isinstance(events[0], Notice) and "left out" in events[0].message
    assert isinstance(events[-1], Finished) and events[-1].stats.prompt_tokens <= 128 - 16
    with pytest.raises(ContextOverflowError, match="context holds 112"):
        list(runner.chat(ChatRequest(({"role": "user", "content": "word " * 200},), max_tokens=16)))
    # the same chat in the model's own 512 positions needs no fitting
    whole = Runner()
    whole.load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, context=100_000, progress=lambda m: None)
    assert whole.loaded.context_length == 512  # never more than the model reads
    assert not isinstance(next(iter(whole.chat(ChatRequest(tuple(_long_chat(6)), max_tokens=16)))), Notice)


def test_a_context_too_small_to_hold_anything_is_refused(tiny_pair):
    with pytest.raises(ValueError, match="cannot hold a message and an answer"):
        Runner().load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, context=1, progress=lambda m: None)


def test_the_longest_chat_memory_holds():
    target = MemoryEstimate("target", weights=1_000_000_000, kv_per_token=100_000, context=32_768)
    full = target.total(32_768)
    assert longest_chat([target], full) is None  # the planned context fits
    short = target.total(MIN_CONTEXT)
    assert longest_chat([target], short + 2_000 * 100_000) == MIN_CONTEXT + 2_000
    assert longest_chat([target], short - 1) == MIN_CONTEXT  # below this the check refuses instead


def test_where_memory_holds_less_chats_are_kept_within_it(demo):
    """The demo (8,192 positions) with memory for about 6,000 tokens of KV cache beside it."""
    runner = Runner()
    estimates = []
    real_check = runner._check_memory

    def spy(models, backend, progress):
        estimates.extend(models)
        return real_check(models, backend, progress)

    runner._check_memory = spy
    runner.free_memory = lambda backend, device: (10**12, "RAM")  # first, to read the estimates
    runner.load("demo", "torch", draft=PROMPT_LOOKUP, progress=lambda m: None)
    target = estimates[0]
    room = target.total(MIN_CONTEXT) + 2_000 * target.kv_per_token
    runner.free_memory = lambda backend, device: (room, "RAM")
    messages = []
    loaded = runner.load("demo", "torch", draft=PROMPT_LOOKUP, progress=messages.append)
    assert loaded.context_length == MIN_CONTEXT + 2_000 == runner.target.context_length
    assert any("Chats are kept within 6,096 tokens, what memory holds (the model reads 8,192)" in m for m in messages)
    assert "only for chats up to about 6,096 tokens" in loaded.notice
