"""A round as its clients take it: the engine's Round with the token chips the side panel draws
(app/chat/trace.py) and its text by part. Made on the service's thread for a local answer
(app/service.py), by the remote target for a server's (app/remote/target.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.trace import RoundTrace
from app.engine.events import Round


@dataclass(frozen=True)
class Traced:
    """One round of the answer, with what the side panel draws of it (its token chips), and its
    text by part: ("answer", text), and ("thinking", text) for a reasoning model's thinking block
    (app/chat/thinking.py; the tags are left out)."""

    round: Round
    trace: RoundTrace
    pieces: tuple[tuple[str, str], ...] = ()

    def part(self, which: str) -> str:
        return "".join(text for kind, text in self.pieces if kind == which)


@dataclass(frozen=True)
class Text:
    """Text the answer ends with that no round carried (the start of a tag held back, which
    turned out not to be one), by part as in Traced; just before Finished."""

    pieces: tuple[tuple[str, str], ...]

    def part(self, which: str) -> str:
        return "".join(text for kind, text in self.pieces if kind == which)
