"""Fitting a conversation into the model's context: the oldest turns go first, in large chunks."""

from __future__ import annotations

import bisect
from collections.abc import Callable

TokenCounter = Callable[[list[dict]], int]  # the prompt's length in tokens, chat template included


class ContextOverflowError(ValueError):
    """Even the system prompt and the last message alone do not fit."""

    def __init__(self, needed: int, limit: int, system_tokens: int = 0):
        self.needed, self.limit = needed, limit
        system = f" (the system prompt takes {system_tokens})" if system_tokens else ""
        super().__init__(
            f"This message needs about {needed} tokens{system}, but the model's context holds {limit}. "
            "Shorten it, or start a new chat."
        )


def fit_messages(messages: list[dict], count_tokens: TokenCounter, limit: int) -> tuple[list[dict], int]:
    """The messages to send and how many were left out. `limit` is what the prompt may use: the
    context length less the room kept for the answer.

    The leading system message(s) and the last user message always stay; whole turns (a user
    message and the answers after it) go from the oldest end, so what is kept after the system
    prompt starts with a user message.
    """
    if count_tokens(messages) <= limit:
        return messages, 0
    system, turns, tail = _split(messages)
    system_tokens = count_tokens(system) if system else 0
    needed = count_tokens(system + tail)
    if needed > limit:
        raise ContextOverflowError(needed, limit, system_tokens)

    def fits(cut: int) -> bool:
        return count_tokens(_join(system, turns[cut:], tail)) <= limit

    cuts = _cut_points(turns, count_tokens, chunk=max(1, (limit - system_tokens) // 3))
    # Dropping more never costs more tokens, so the first cut that fits is found by bisection;
    # the last cut point drops every turn, and that fits (checked above).
    cut = cuts[bisect.bisect_left(cuts, True, key=fits)]
    return _join(system, turns[cut:], tail), sum(len(turn) for turn in turns[:cut])


def _split(messages: list[dict]) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """(leading system messages, the turns before the last user message, that message and what follows)."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    users = [i for i in range(start, len(messages)) if messages[i]["role"] == "user"]
    end = users[-1] if users else len(messages)
    turns: list[list[dict]] = []
    for message in messages[start:end]:
        # A turn starts at a user message; answers before the first one (a greeting) form a turn of their own.
        if message["role"] == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return messages[:start], turns, messages[end:]


def _cut_points(turns: list[list[dict]], count_tokens: TokenCounter, chunk: int) -> list[int]:
    """Where the kept history may start: every cut drops at least `chunk` tokens more than the one
    before it (a third of the room the system prompt leaves), and the last drops every turn.

    Why chunks, and why laid out from the conversation's start: the runner keeps both models' KV
    caches between turns and prefills only what is new after the longest common prefix. Sliding
    the window by one turn whenever the context is full would change the prefix right after the
    system prompt on every turn and re-prefill the whole history each time. These cut points
    depend only on the oldest turns, which never change, so as the conversation grows the chosen
    cut stays put until a third of the room has filled up again, and the cache is reused until then.
    """
    cuts, offset, last_cut_offset = [], 0, 0
    for index, turn in enumerate(turns):
        offset += count_tokens(turn)
        if offset - last_cut_offset >= chunk:
            cuts.append(index + 1)
            last_cut_offset = offset
    if not cuts or cuts[-1] != len(turns):
        cuts.append(len(turns))
    return cuts


def _join(system: list[dict], turns: list[list[dict]], tail: list[dict]) -> list[dict]:
    return system + [message for turn in turns for message in turn] + tail
