"""Chip colours, one set per theme: accepted drafts green, rejected drafts red (struck through),
the target's own tokens blue. The inline tint of the chat uses the same hues. A speedup's figure
is green or red only where its verdict (app/chat/baseline.py) says faster or slower."""

from __future__ import annotations

import html
from dataclasses import dataclass

from app.chat.baseline import FASTER, SLOWER
from app.chat.trace import ACCEPTED, REJECTED, TARGET


@dataclass(frozen=True)
class ChipColors:
    background: str
    text: str


LIGHT = {ACCEPTED: ChipColors("#d3f0dc", "#14532d"), REJECTED: ChipColors("#fbd5d5", "#9b1c1c"),
         TARGET: ChipColors("#dbe4ff", "#1e3a8a")}
DARK = {ACCEPTED: ChipColors("#1f4d33", "#c6f6d5"), REJECTED: ChipColors("#5c2326", "#fecaca"),
        TARGET: ChipColors("#273a6b", "#dbe4ff")}
LABELS = {ACCEPTED: "accepted draft", REJECTED: "rejected draft", TARGET: "target's own"}
# the band behind a round written inside a reasoning model's thinking block (the chat folds that text)
THINKING_ROW = {False: "#efe8fb", True: "#2f2641"}


# the speedup's figure by its verdict, {dark: colour}; "about as fast" has none: the text's own
VERDICT_COLORS = {FASTER: {False: "#2e9d5b", True: "#4cc47f"}, SLOWER: {False: "#c0392b", True: "#ff7b72"}}


def chip_colors(dark: bool) -> dict[str, ChipColors]:
    return DARK if dark else LIGHT


def verdict_color(verdict: str, dark: bool) -> str | None:
    """Green for faster, red for slower, None (the theme's text colour) for about as fast."""
    return VERDICT_COLORS.get(verdict, {}).get(dark)


def visible(text: str) -> str:
    """Whitespace a reader can see: a middle dot for a space, a return arrow for a newline."""
    if not text:
        return "∅"
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "→").replace("\r", "")


def tinted_html(text: str, spans: list[tuple[int, str]], dark: bool) -> str:
    """The answer as plain text, each stretch coloured by who wrote it. Characters past the
    spans (there should be none) stay untinted."""
    colors = chip_colors(dark)
    parts, at = [], 0
    for n, kind in spans:
        piece = text[at: at + n]
        at += n
        if piece:
            c = colors.get(kind, colors[TARGET])
            parts.append(f'<span style="background-color:{c.background}; color:{c.text};">{html.escape(piece)}</span>')
    parts.append(html.escape(text[at:]))
    return f'<p style="white-space:pre-wrap;">{"".join(parts)}</p>'
