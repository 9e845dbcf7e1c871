"""Streaming detokenization that never splits a UTF-8 character or drops a leading space.

Each new token's text is the decode of a short window that starts a few tokens back, minus the
decode of that window without it (the prefix/read offsets of vLLM's incremental detokenizer):
decoding a token alone would lose SentencePiece's leading space, and a partial multi-byte
character decodes to U+FFFD, so text is held back until it completes.
"""

from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], context: list[int] | None = None):
        self._decode = decode
        # A little of the prompt as context, so the first answer token keeps its leading space.
        self._tokens: list[int] = list(context or [])[-4:]
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Feed one token; return the newly completed text (possibly empty)."""
        self._tokens.append(token_id)
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back at the end (an incomplete character stays as U+FFFD)."""
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset :])
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._tokens)
        self.text += delta
        return delta
