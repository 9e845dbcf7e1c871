"""A reasoning model's answer in two parts: the thinking it writes first, then the answer.

Qwen3.x, QwQ and the DeepSeek-R1 distills write their reasoning between `<think>` and `</think>`.
Some templates open the block in the prompt itself (the R1 distills end the generation prompt
with `<think>\\n`), so whether an answer starts inside it is read from the prompt's end. Templates
with a switch (Qwen3's `enable_thinking`) take it as a per-chat setting; switched off, the
template writes an empty block into the prompt and the model answers at once.

`ThinkingSplitter` splits the streamed text as it comes: tags are removed, and a tag cut between
two rounds is held back until it is whole.
"""

from __future__ import annotations

THINKING, ANSWER = "thinking", "answer"
OPEN, CLOSE = "<think>", "</think>"
SWITCH = "enable_thinking"  # the template variable Qwen3.x's templates read


def thinks(chat_template: str, vocab: dict[str, int] | None = None) -> bool:
    """The model writes a thinking block: its template or vocabulary knows the tags."""
    return CLOSE in chat_template or (vocab is not None and CLOSE in vocab)


def starts_thinking(prompt_text: str) -> bool:
    """The prompt leaves the model inside an open thinking block (e.g. `...assistant\\n<think>\\n`)."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


class ThinkingSplitter:
    def __init__(self, thinking: bool = False):
        self.phase = THINKING if thinking else ANSWER
        self._held = ""  # the start of what may be a tag
        self._after_tag = thinking  # the whitespace right after a tag is the template's, not the text's
        self.thinking = ""  # everything so far, by part
        self.answer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        """(part, text) pieces of `text`, in order, tags left out."""
        text = self._held + text
        self._held = ""
        pieces: list[tuple[str, str]] = []
        while text:
            tag = CLOSE if self.phase == THINKING else OPEN
            at = text.find(tag)
            if at >= 0:
                self._emit(pieces, text[:at])
                text = text[at + len(tag):]
                self.phase = ANSWER if self.phase == THINKING else THINKING
                self._after_tag = True
                continue
            keep = _partial_suffix(text, tag)
            self._emit(pieces, text[:len(text) - keep])
            self._held = text[len(text) - keep:]
            break
        return pieces

    def finish(self) -> list[tuple[str, str]]:
        """What was held back when the text ended (a tag that never completed is text)."""
        held, self._held = self._held, ""
        pieces: list[tuple[str, str]] = []
        self._emit(pieces, held)
        return pieces

    def _emit(self, pieces: list[tuple[str, str]], text: str) -> None:
        if self._after_tag:
            text = text.lstrip()
            if not text:
                return
            self._after_tag = False
        if not text:
            return
        if self.phase == THINKING:
            self.thinking += text
        else:
            self.answer += text
        if pieces and pieces[-1][0] == self.phase:
            pieces[-1] = (self.phase, pieces[-1][1] + text)
        else:
            pieces.append((self.phase, text))


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
