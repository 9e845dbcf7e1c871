"""A chat as a Markdown file (File → Export chat as Markdown…): what a user pastes into notes, an
issue or a document. Qt-free, so the text is tested without a window.

The answers are Markdown already and go in as written; each turn gets a heading naming who wrote
it, and an answer's line says which version it is, how it ended when it did not end by itself,
and its figures. The chat is written as it is shown: the branch on screen, where a question was
edited (its heading says which version of it). The title is the chat's words, never a "…". The
file is written whole under a temporary name and renamed, so a full disk leaves no half file behind.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from app.chat.history_titles import shown_title

FILE_NAME_CHARS = 80
ENDINGS = {"stopped": "stopped by you", "interrupted": "interrupted (Tandem closed while it was written)",
           "error": "ended by an error"}


def chat_markdown(conversation, messages, model: str = "", now: float | None = None) -> str:
    """`conversation`: app.chat.history.Conversation; `messages`: its Messages in order."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() if now is None else now))
    lines = [f"# {_one_line(shown_title(conversation.title))}", ""]
    lines += [f"*Exported from Tandem on {when}" + (f" · answers by {model}" if model else "") + "*", ""]
    if conversation.system_prompt.strip():
        lines += ["**System prompt:**", "", _quoted(conversation.system_prompt), ""]
    for message in messages:
        if message.role == "user":
            edited = getattr(message, "branches", 0) > 1
            lines += [f"## You (version {message.branch} of {message.branches})" if edited else "## You", "",
                      message.content.rstrip(), ""]
            continue
        lines += [f"## Tandem{_answer_note(message)}", "", message.content.rstrip() or "*(no text)*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _answer_note(message) -> str:
    parts = []
    if getattr(message, "versions", 0) > 1:
        parts.append(f"version {message.version} of {message.versions}")
    if message.status in ENDINGS:
        parts.append(ENDINGS[message.status])
    stats = message.stats if isinstance(message.stats, dict) else {}
    tokens, speed = stats.get("tokens"), stats.get("tokens_per_s")
    if isinstance(tokens, int) and isinstance(speed, (int, float)):
        parts.append(f"{tokens} tokens at {speed:.1f} tok/s")
    acceptance = stats.get("acceptance")
    if stats.get("drafted") and isinstance(acceptance, (int, float)):
        parts.append(f"{acceptance:.0%} of drafts accepted")
    return f" ({' · '.join(parts)})" if parts else ""


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "Untitled chat"


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.rstrip().splitlines())


def file_name(title: str) -> str:
    """A file name from a chat's title: "Prime numbers in Python" -> "Prime numbers in Python.md",
    without characters a file system refuses, cut at a word past FILE_NAME_CHARS."""
    name = _one_line(re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " ", shown_title(title))).strip(" .")
    if len(name) > FILE_NAME_CHARS:
        cut = name[: FILE_NAME_CHARS + 1]
        name = (cut[: cut.rfind(" ")] if " " in cut else cut[:FILE_NAME_CHARS]).strip(" .")
    return f"{name or 'chat'}.md"


def write_text(path: Path, text: str) -> None:
    """The whole text under a temporary name beside `path`, then renamed over it (OSError as raised)."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        try:
            partial.unlink()
        except OSError:
            pass
        raise
