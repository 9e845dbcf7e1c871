"""The answer as it is committed: stop tokens, max tokens, stop strings and streamed text."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.engine.detokenize import StreamingDetokenizer
from app.engine.stops import StopStrings


class AnswerStream:
    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: Sequence[int],
                 stop_ids: frozenset[int], stop_strings: Sequence[str], max_tokens: int):
        self._detok = StreamingDetokenizer(decode, context=list(prompt_ids))
        self._stops = StopStrings(tuple(stop_strings))
        self._stop_ids = stop_ids
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.parts: list[str] = []
        self.finish: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def take(self, emitted: Sequence[int]) -> tuple[tuple[int, ...], str]:
        """Commit tokens in order until one ends the answer. Returns (kept tokens, new text)."""
        kept, text = [], []
        for token in emitted:
            if token in self._stop_ids:
                self.finish = "stop"
                break
            kept.append(token)
            self.tokens.append(token)
            shown, hit = self._stops.feed(self._detok.add(token))
            text.append(shown)
            if hit:
                self.finish = "stop_string"
                break
            if len(self.tokens) >= self.max_tokens:
                self.finish = "length"
                break
        delta = "".join(text)
        self.parts.append(delta)
        return tuple(kept), delta

    def close(self) -> str:
        """Text still held back (a partial character or a possible stop string) at the end."""
        if self.finish == "stop_string":
            return ""
        tail, _ = self._stops.feed(self._detok.flush())
        tail += self._stops.flush()
        self.parts.append(tail)
        return tail

    @property
    def text(self) -> str:
        return "".join(self.parts)
