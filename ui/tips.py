"""Tooltips that wrap. Qt shows a plain-text tooltip on one line however long it is (the
temperature's was 1,470 px wide) and wraps only when the line would leave the screen, so a long
tip is broken into lines here, at a width that reads comfortably."""

from __future__ import annotations

import textwrap

TIP_CHARS = 60  # about 420 px in the usual UI fonts


def wrap_tip(text: str, width: int = TIP_CHARS) -> str:
    """`text` with its paragraphs (lines) wrapped at `width` characters; a path longer than that is
    broken too, rather than widen the tip."""
    return "\n".join("\n".join(textwrap.wrap(line, width, break_on_hyphens=False)) for line in text.split("\n"))
