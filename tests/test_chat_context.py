"""Fitting a conversation into the context: whole oldest turns go in chunks, the system prompt and
the last message stay, and the kept prefix holds still across turns so KV caches are reused."""

from __future__ import annotations

import pytest

from app.draft_choice import PROMPT_LOOKUP
from app.chat.context import ContextOverflowError, fit_messages

OVERHEAD = 2  # tokens a chat template adds around each message


def count_tokens(messages: list[dict]) -> int:
    return sum(len(m["content"].split()) + OVERHEAD for m in messages)


def _turn(n: int, words: int = 8) -> list[dict]:
    return [
        {"role": "user", "content": " ".join([f"q{n}"] * words)},
        {"role": "assistant", "content": " ".join([f"a{n}"] * words)},
    ]


def _chat(turns: int, system: str = "be brief", words: int = 8) -> list[dict]:
    messages = [{"role": "system", "content": system}] if system else []
    for n in range(turns):
        messages += _turn(n, words)
    return messages + [{"role": "user", "content": "last question"}]


def test_a_chat_that_fits_is_returned_unchanged():
    messages = _chat(3)
    kept, dropped = fit_messages(messages, count_tokens, limit=count_tokens(messages))
    assert kept is messages and dropped == 0


def test_whole_oldest_turns_go_and_the_system_prompt_and_last_message_stay():
    messages = _chat(12)  # 12 turns of 20 tokens, system 4, last message 4: 248 tokens
    kept, dropped = fit_messages(messages, count_tokens, limit=200)
    assert count_tokens(kept) <= 200
    assert kept[0] == messages[0] and kept[-1] == messages[-1]
    assert kept[1]["role"] == "user"
    assert dropped % 2 == 0 and dropped > 0
    assert kept[1:] == messages[1 + dropped :]  # exactly the oldest messages went


def test_an_overflow_of_one_turn_drops_a_large_chunk():
    messages = _chat(12)
    limit = count_tokens(messages) - 1  # one token too many: a sliding window would drop one turn
    kept, dropped = fit_messages(messages, count_tokens, limit)
    room_turns = (limit - count_tokens(messages[:1])) // 20
    assert dropped // 2 >= room_turns / 3  # at least a third of the turns the context holds
    assert count_tokens(kept) <= limit


def test_the_kept_prefix_holds_still_as_the_chat_grows():
    limit, cuts, starts = 200, [], []
    for turns in range(8, 60):
        messages = _chat(turns)
        kept, dropped = fit_messages(messages, count_tokens, limit)
        assert count_tokens(kept) <= limit
        # Not wasteful: the context stays more than half full once the chat has filled it.
        assert count_tokens(kept) > limit / 2
        cuts.append(dropped // 2)
        starts.append(kept[1]["content"] if dropped else None)
    moves = [b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b != a]
    assert all(move > 0 for move in moves)  # the window only ever moves forward
    assert all(move >= 3 for move in moves)  # and in chunks (the context holds ~9 turns)
    assert len(moves) <= len(cuts) // 3  # so the prefix survives most turns
    assert len(set(starts)) == len(moves) + 1


def test_never_an_answer_first_after_the_system_prompt():
    greeting = [{"role": "system", "content": "sys"}, {"role": "assistant", "content": "Hello! " * 30}]
    messages = greeting + _turn(0) + _turn(1) + [{"role": "user", "content": "last"}]
    kept, dropped = fit_messages(messages, count_tokens, limit=60)
    assert [m["role"] for m in kept[:2]] == ["system", "user"]
    assert count_tokens(kept) <= 60 and dropped >= 1


def test_several_system_messages_and_no_system_message():
    systems = [{"role": "system", "content": "one"}, {"role": "system", "content": "two"}]
    messages = systems + _chat(10, system="")
    kept, _ = fit_messages(messages, count_tokens, limit=100)
    assert kept[:2] == systems and kept[2]["role"] == "user" and count_tokens(kept) <= 100
    bare = _chat(10, system="")
    kept, dropped = fit_messages(bare, count_tokens, limit=100)
    assert kept[0]["role"] == "user" and kept[-1] == bare[-1] and kept == bare[dropped:]


def test_only_the_system_prompt_and_last_message_when_nothing_else_fits():
    messages = _chat(5)
    kept, dropped = fit_messages(messages, count_tokens, limit=count_tokens([messages[0], messages[-1]]))
    assert kept == [messages[0], messages[-1]] and dropped == 10


def test_a_message_too_long_for_the_context_is_refused_with_the_numbers():
    messages = [{"role": "system", "content": "sys " * 10}] + _turn(0) + [{"role": "user", "content": "word " * 500}]
    with pytest.raises(ContextOverflowError) as raised:
        fit_messages(messages, count_tokens, limit=256)
    error = raised.value
    assert isinstance(error, ValueError)
    assert (error.needed, error.limit) == (514, 256)
    text = str(error)
    assert "514" in text and "256" in text and "system prompt takes 12" in text
    assert "Shorten it" in text and "new chat" in text


def test_the_runner_fits_a_long_chat_itself_and_says_what_it_left_out(tiny_pair):
    """Every client gets the fitting (the CLI and the pair trial too, not only the window): the
    oldest turns go, a Notice says so, and a message that cannot fit is refused in words."""
    from app.engine.events import Finished, Notice
    from app.runner import ChatRequest, Runner

    runner = Runner()
    loaded = runner.load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, progress=lambda m: None)
    chat = []
    for n in range(40):  # far more than the tiny model's 512 positions
        chat += [{"role": "user", "content": f"Question {n}: tell me about rivers and lakes."},
                 {"role": "assistant", "content": f"Answer {n}: rivers flow into lakes and seas."}]
    chat.append({"role": "user", "content": "And the last question?"})
    events = list(runner.chat(ChatRequest(tuple(chat), max_tokens=16)))
    assert isinstance(events[0], Notice) and "earlier messages were left out" in events[0].message
    left_out = int(events[0].message.split()[0])
    assert left_out % 2 == 0 and 0 < left_out < len(chat)  # whole turns
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.stats.prompt_tokens <= loaded.context_length - 16
    with pytest.raises(ContextOverflowError, match=f"context holds {loaded.context_length - 16}"):
        list(runner.chat(ChatRequest(({"role": "user", "content": "word " * 2000},), max_tokens=16)))
