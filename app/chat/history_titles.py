"""A chat's name, as stored: the first line of its first message, whole, or cut cleanly at a word
when that line is longer than a title. Never with a "…": the list elides a title only when it
draws it, so an export's heading and file name get the words, not a mark of where a column ended.

Tandem stored titles cut at 47 characters with a "…" until issue 46; `restored_title` gives such a
title back its words (app/chat/history_schema.py, once per file), and `shown_title` leaves the
mark out of a name that kept it (one the user typed, or whose question is gone).
"""

from __future__ import annotations

DEFAULT_TITLE = "New chat"
TITLE_CHARS = 100  # longer first lines are cut at the last word that fits
_CUT_MARK = "…"
_OLD_TITLE_CHARS = 48  # the cut of the titles stored before issue 46


def auto_title(text: str) -> str:
    """The first non-empty line of a message, its spaces collapsed, cut at a word past TITLE_CHARS."""
    line = _first_line(text)
    if not line:
        return DEFAULT_TITLE
    if len(line) <= TITLE_CHARS:
        return line
    cut = line[: TITLE_CHARS + 1]
    cut = cut[: cut.rfind(" ")] if " " in cut else cut[:TITLE_CHARS]  # a word, not half of one
    return cut.rstrip(" ,;:-–—") or line[:TITLE_CHARS]


def restored_title(title: str, first_question: str) -> str | None:
    """The title to store instead of one Tandem cut with a "…" from `first_question`, or None
    where `title` is not such a cut (a name the user chose stays as it is)."""
    line = _first_line(first_question)
    if len(line) > _OLD_TITLE_CHARS and title == line[: _OLD_TITLE_CHARS - 1].rstrip() + _CUT_MARK:
        return auto_title(first_question)
    return None


def shown_title(title: str) -> str:
    """A title for an export's heading and file name: on one line, without a trailing "…"."""
    return " ".join(title.split()).removesuffix(_CUT_MARK).rstrip()


def _first_line(text: str) -> str:
    return next((" ".join(line.split()) for line in text.splitlines() if line.strip()), "")
