"""The chat history's rows read back field by field, each field checked where it is read.

SQLite checks neither types nor JSON: a TEXT column can hold a number, a blob, or text that is
not JSON, and a hand edit, another program or an older bug can leave any of them. One such row
once aborted the window on every start while SQLite's integrity check said "ok". So a row without
what identifies it (its id, a message's role) is skipped; any other field that cannot be read
takes its empty value (settings defaulted, figures left out, text empty) and is noted in
UnreadableParts, which tells the user once per part. The file itself is never changed here.
Qt-free; app/chat/history.py builds its dataclasses from what these functions return.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from app.chat.settings import ChatSettings
from app.json_fields import is_number, is_whole, shown

STATUSES = ("complete", "stopped", "error", "interrupted")
UNREADABLE_STATUS = "interrupted"  # an answer whose status cannot be read is shown as cut short
LISTED_PARTS = 3  # a notice names this many unreadable parts, then counts the rest

# An answer's figures (ui/chat/controller.stats_record; a question's holds its race): what the
# chat, the status bar and the race line format, by the type they format them as.
STATS_COUNTS = ("tokens", "prompt_tokens", "rounds", "decode_tokens", "drafted", "accepted", "reused_tokens")
STATS_FIGURES = ("acceptance", "tokens_per_s", "tokens_per_round", "prefill_s", "decode_s")
STATS_TEXTS = ("finish_reason", "error")


class UnreadableParts:
    """What could not be read from the history's rows, in words, and whom to tell: each part is
    told once (the window's banner, replaced as parts are found), however often it is read."""

    def __init__(self, path):
        self.path = path
        self.found: dict[tuple[str, str], str] = {}  # (where, field) -> "stats of an answer in chat 3 (...)"
        self._listener: Callable[[str], None] | None = None

    def note(self, where: str, field: str, why: str) -> None:
        if (where, field) in self.found:
            return
        self.found[(where, field)] = f"{field} of {where} ({why})"
        if self._listener is not None:
            self._listener(self.sentence())

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call `listener` with the sentence now (where parts were found already) and as parts are found."""
        self._listener = listener
        if self.found:
            listener(self.sentence())

    def sentence(self) -> str | None:
        if not self.found:
            return None
        parts = list(self.found.values())
        listed = "; ".join(parts[:LISTED_PARTS])
        if len(parts) > LISTED_PARTS:
            listed += f"; and {len(parts) - LISTED_PARTS} more"
        return (f"Parts of the chat history at {self.path} could not be read: {listed}. They are shown as "
                "unreadable (settings at their defaults, figures left out, text empty); the rest of each chat "
                "is kept, and the file was not changed.")


def conversation_fields(row: sqlite3.Row, parts: UnreadableParts) -> dict | None:
    """Conversation(**fields), or None for a row without a chat's id."""
    read = _Reader(row, parts, "the history")
    conv_id = read.identity("id")
    if conv_id is None:
        read.note("a chat", "it has no id Tandem can read; it is left out")
        return None
    read.where = f"chat {conv_id}"
    settings = read.json_object("settings") or {}
    refused = ChatSettings.read(settings)[1]  # each field as the chat will read it
    for name in refused:
        parts.note(read.where, f"the setting “{name}”", f"{shown(settings[name])} is not a value it takes; "
                   "the default is used")
    return {"id": conv_id, "title": read.text("title", f"Chat {conv_id}"), "system_prompt": read.text("system_prompt"),
            "settings": {k: v for k, v in settings.items() if k not in refused},
            "created": read.number("created"), "updated": read.number("updated")}


def message_fields(row: sqlite3.Row, parts: UnreadableParts) -> dict | None:
    """Message(**fields), or None for a row without its id or a role the chat can show."""
    read = _Reader(row, parts, "the history")
    message_id, conv_id, role = read.identity("id"), read.identity("conversation_id"), read.value("role")
    if conv_id is not None:
        read.where = f"chat {conv_id}"
    if message_id is None or conv_id is None or role not in ("user", "assistant"):
        read.note("a message", "it has no id, chat or role Tandem can read; it is left out")
        return None
    read.where = f"{'an answer' if role == 'assistant' else 'a question'} in chat {conv_id}"
    return {"id": message_id, "conversation_id": conv_id, "position": read.count("position"), "role": role,
            **_body(read), "version": read.count("version"), "versions": read.count("version_count"),
            "branch": read.count("branch_number"), "branches": read.count("branch_count")}


def version_fields(row: sqlite3.Row, parts: UnreadableParts) -> dict | None:
    """AnswerVersion(**fields), or None for a row without its answer or number."""
    read = _Reader(row, parts, "an answer")
    message_id, number = read.identity("message_id"), read.identity("number")
    if message_id is None or number is None:
        read.note("a version", "it has no answer or number Tandem can read; it is left out")
        return None
    read.where = f"version {number} of an answer"
    return {"message_id": message_id, "number": number, **_body(read)}


def _body(read: _Reader) -> dict:
    """What a message and an answer's version both hold."""
    status = read.value("status")
    if status not in STATUSES:
        read.note("status", f"{shown(status)} is none of {', '.join(STATUSES)}; shown as {UNREADABLE_STATUS}")
        status = UNREADABLE_STATUS
    return {"content": read.text("content"), "status": status, "settings": read.json_object("settings"),
            "stats": _stats(read), "trace": read.json("trace"), "created": read.number("created"),
            "thinking": read.text("thinking")}


def _stats(read: _Reader) -> dict | None:
    """The figures, each of the type it is shown as; a figure that is not is left out."""
    stats = read.json_object("stats")
    if stats is None:
        return None
    kept = {}
    for name, value in stats.items():
        if name in STATS_COUNTS:
            fits, wanted = is_whole(value) and 0 <= value < 2**63, "a whole number"
        elif name in STATS_FIGURES:
            fits, wanted = is_number(value), "a number"
        elif name in STATS_TEXTS:
            fits, wanted = isinstance(value, str), "text"
        else:  # a race's record (read by its own reader), or another version's figure: kept as it is
            fits, wanted = name != "race" or isinstance(value, dict), "a race's record"
        if fits:
            kept[name] = value
        else:
            read.note(f"the figure “{name}”", f"{shown(value)} is not {wanted}; left out")
    return kept


class _Reader:
    """One row's fields, each read as one type, with the row's `where` in any note."""

    def __init__(self, row: sqlite3.Row, parts: UnreadableParts, where: str):
        self.row, self.parts, self.where = row, parts, where
        self.columns = set(row.keys())

    def note(self, field: str, why: str) -> None:
        self.parts.note(self.where, field, why)

    def value(self, column: str):
        # a column the table lacks (a table unlike its recorded version) reads as missing
        return self.row[column] if column in self.columns else None

    def identity(self, column: str) -> int | None:
        """An id or a number that names a row: any whole number SQLite holds, else None (the
        caller skips the row and says so)."""
        value = self.value(column)
        return value if is_whole(value) else None

    def count(self, column: str) -> int:
        value = self.value(column)
        if is_whole(value) and value >= 0:
            return value
        self.note(column, f"{shown(value)} is not a whole number; 0 is used")
        return 0

    def number(self, column: str) -> float:
        value = self.value(column)
        if is_number(value):
            return float(value)
        self.note(column, f"{shown(value)} is not a time")
        return 0.0

    def text(self, column: str, default: str = "") -> str:
        value = self.value(column)
        if isinstance(value, bytes):  # text another program stored as a blob
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                pass
        if isinstance(value, str):
            return value
        self.note(column, f"{shown(value)} is not text")
        return default

    def json(self, column: str):
        """The column's JSON, or None where it holds none (NULL) or none that reads."""
        value = self.value(column)
        if value is None:
            return None
        try:
            return json.loads(value)
        except (TypeError, ValueError, RecursionError):  # a number, a blob that is not UTF-8, "{", [[[[...
            self.note(column, "not valid JSON; left out")
            return None

    def json_object(self, column: str) -> dict | None:
        value = self.json(column)
        if value is None or isinstance(value, dict):
            return value
        self.note(column, f"{shown(value)} is not a JSON object; left out")
        return None


