"""The chat history: conversations and their messages in one SQLite file in the user data folder.

A store is used from one thread (the GUI thread) for its whole life, so its connection is never
shared between threads. Every write is one transaction: a crash keeps all of it or none of it.
`begin_answer` stores the user's message with an empty answer marked 'interrupted' before
generation starts, so an app killed mid-answer never loses what the user typed.

An answer keeps every version Regenerate wrote (`answer_versions`); its row in `messages` holds
the version on screen, so the conversation (and what the model reads next) is that version.
A question edited and sent again keeps the one it replaces, with everything that followed it, as
a branch beside the new one (as ChatGPT and LM Studio do): each message follows one before it
(`parent_id`), and `messages` reads the branch on screen only (`shown`); `show_branch` goes to
another. Titles are stored whole (app/chat/history_titles.py): the list elides them when drawn.
A write that fails says why in a HistoryWriteError (locked, disk full, read-only), and the same
write can be tried again later. The file and its journals are readable by their owner only.

This module holds the store and what it hands back; the file's opening and the words for its
failures are app/chat/history_file.py's, its tables app/chat/history_schema.py's, the checks of
each field read back app/chat/history_rows.py's. Callers import all they need from here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.chat.history_file import (HistoryError, HistoryWriteError, check_integrity, connect, make_private,
                                   move_aside, transaction, write_message)
from app.chat.history_rows import STATUSES, UnreadableParts, conversation_fields, message_fields, version_fields
from app.chat.history_titles import DEFAULT_TITLE, TITLE_CHARS, auto_title  # noqa: F401 (callers' names)
# passed to history_file as each file opens (never bound there), so a test adds a step by patching it here
from app.chat.history_schema import MIGRATIONS

BUSY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    settings: dict
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    position: int
    role: str  # "user" | "assistant"
    content: str
    status: str  # one of STATUSES
    settings: dict | None  # the generation settings an answer was made with
    stats: dict | None  # tokens, acceptance, tokens/s: whatever the caller measured
    trace: Any  # the per-round trace the UI colours tokens with; opaque here
    created: float
    version: int = 0  # an answer: which of its versions this is (1-based); 0 for a user's message
    versions: int = 0  # an answer: how many versions it has
    thinking: str = ""  # a reasoning model's thinking before the answer (shown folded)
    branch: int = 0  # a question: which of its versions this is (1-based; an edit adds one); 0 for an answer
    branches: int = 0  # a question: how many versions it has, each with the answers that followed it

    def as_chat(self) -> dict:
        """The message as the model reads it again: the answer, not the thinking (reasoning
        templates leave earlier turns' thinking out as well)."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class AnswerVersion:
    """One version of an answer: the first, or one that Regenerate wrote."""

    message_id: int
    number: int  # 1-based, in the order they were written
    content: str
    status: str
    settings: dict | None
    stats: dict | None
    trace: Any
    created: float
    thinking: str = ""


def default_path() -> Path:
    return paths.data_dir() / "history.sqlite3"


class HistoryStore:
    """Open with `HistoryStore.open(path)`; use from one thread; close it (or use `with`)."""

    def __init__(self, db: sqlite3.Connection, path: Path, clock: Callable[[], float],
                 busy_timeout: float = BUSY_TIMEOUT_S):
        self._db = db
        self._clock = clock
        self._busy_timeout = busy_timeout
        self.path = path
        self.recovery_message: str | None = None  # set when a damaged file was moved aside
        self.unreadable = UnreadableParts(path)  # rows' fields that could not be read (app/chat/history_rows.py)

    @classmethod
    def open(
        cls, path: Path | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S, clock: Callable[[], float] = time.time
    ) -> HistoryStore:
        path = Path(path) if path is not None else default_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(
                f"Could not create the folder of the chat history, {path.parent} ({exc.strerror or exc}). "
                "Check that the path is a folder you can write to."
            ) from exc
        recovery = None
        damage = check_integrity(path, busy_timeout, MIGRATIONS)
        if damage is not None:
            moved = move_aside(path)
            recovery = (
                f"The chat history at {path} was damaged ({damage}) and has been moved to {moved}; "
                "a new, empty history was started. Nothing was deleted."
            )
        make_private(path)
        store = cls(connect(path, busy_timeout, MIGRATIONS), path, clock, busy_timeout)
        store.recovery_message = recovery
        return store

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def waiting_at_most(self, seconds: float) -> Iterator[None]:
        """Writes inside wait at most `seconds` for another program's lock: a retry in the
        background must not hold up the window for the full busy timeout."""
        self._db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        try:
            yield
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")

    # Conversations

    def create_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str = "", settings=None) -> Conversation:
        now = self._clock()
        with self._write():
            cursor = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, settings, created, updated) VALUES (?, ?, ?, ?, ?)",
                (title, system_prompt, json.dumps(settings or {}), now, now),
            )
        return self.get_conversation(cursor.lastrowid)

    # Editing a conversation's details does not move it up the list; only new messages do.
    def rename(self, conv_id: int, title: str) -> None:
        self._set_column(conv_id, "title", title)

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._set_column(conv_id, "system_prompt", text)

    def set_settings(self, conv_id: int, settings: dict) -> None:
        self._set_column(conv_id, "settings", json.dumps(settings))

    def delete_conversation(self, conv_id: int) -> None:
        with self._write():
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))  # messages go by cascade

    def get_conversation(self, conv_id: int) -> Conversation:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
        if row is None:
            raise HistoryError(f"There is no conversation {conv_id} in the chat history; it may have been deleted.")
        conversation = _conversation(row, self.unreadable)
        if conversation is None:
            raise HistoryError(f"Conversation {conv_id} in the chat history cannot be read (its id is damaged).")
        return conversation

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest activity first. `search` matches titles and message text, ignoring case (Unicode-aware)."""
        needle = search.strip().casefold()
        rows = self._db.execute(
            """SELECT * FROM conversations AS c
               WHERE ?1 = '' OR instr(casefold(c.title), ?1) > 0 OR EXISTS (
                   SELECT 1 FROM messages AS m WHERE m.conversation_id = c.id AND instr(casefold(m.content), ?1) > 0)
               OR EXISTS (
                   SELECT 1 FROM answer_versions AS v JOIN messages AS m ON m.id = v.message_id
                   WHERE m.conversation_id = c.id AND instr(casefold(v.content), ?1) > 0)
               ORDER BY c.updated DESC, c.id DESC""",
            (needle,),
        ).fetchall()
        return [c for row in rows if (c := _conversation(row, self.unreadable)) is not None]

    def messages(self, conv_id: int) -> list[Message]:
        """The conversation as it reads: the branch on screen, each answer in the version on screen."""
        rows = self._db.execute(
            f"{_MESSAGE_SELECT} WHERE m.conversation_id = ? AND m.shown = 1 ORDER BY m.position", (conv_id,)
        ).fetchall()
        return [m for row in rows if (m := _message(row, self.unreadable)) is not None]

    def message(self, message_id: int) -> Message:
        """One message by id, on screen or in a branch out of view; HistoryError where there is none."""
        return self._get_message(message_id)

    def versions(self, answer_id: int) -> list[AnswerVersion]:
        """Every version of an answer, oldest first (none for an id that is not an answer)."""
        rows = self._db.execute(
            "SELECT * FROM answer_versions WHERE message_id = ? ORDER BY number", (answer_id,)
        ).fetchall()
        return [v for row in rows if (v := _version(row, self.unreadable)) is not None]

    # Turns: each method is one transaction

    def add_turn(
        self, conv_id: int, user_text: str, answer_text: str, status: str = "complete", settings=None, stats=None,
        trace=None,
    ) -> tuple[Message, Message]:
        _check_status(status)
        with self._write():
            user_id, answer_id = self._append_turn(conv_id, user_text, (answer_text, status, settings, stats, trace))
        return self._get_message(user_id), self._get_message(answer_id)

    def begin_answer(self, conv_id: int, user_text: str) -> int:
        """Store the user's message and an empty 'interrupted' answer; returns the answer's id."""
        with self._write():
            _, answer_id = self._append_turn(conv_id, user_text, ("", "interrupted", None, None, None))
        return answer_id

    def finish_answer(self, answer_id: int, text: str, status: str, settings=None, stats=None, trace=None,
                      version: int | None = None, thinking: str = "") -> Message:
        """Write version `version` of an answer (by default the one on screen), with the thinking
        a reasoning model wrote before it."""
        _check_status(status)
        with self._write():
            row = self._db.execute(
                "SELECT conversation_id, version FROM messages WHERE id = ? AND role = 'assistant'", (answer_id,)
            ).fetchone()
            if row is None:
                raise HistoryError(f"There is no answer {answer_id} in the chat history to finish.")
            number = row["version"] if version is None else version
            self._touch(row["conversation_id"])
            self._write_version(answer_id, number, (text, status, settings, stats, trace), thinking)
        return self._get_message(answer_id)

    def add_answer_version(
        self, conv_id: int, answer_text: str = "", status: str = "interrupted", settings=None, stats=None, trace=None
    ) -> Message:
        """Regenerate: the conversation's last message must be an answer; a new version of it is
        added and shown, and the earlier ones are kept. Returns the answer (its `version` is the new one)."""
        _check_status(status)
        with self._write():
            self._touch(conv_id)
            last = self._db.execute(
                "SELECT id, role FROM messages WHERE conversation_id = ? AND shown = 1 ORDER BY position DESC LIMIT 1",
                (conv_id,),
            ).fetchone()
            if last is None or last["role"] != "assistant":
                raise HistoryError(
                    f"Conversation {conv_id} does not end with an answer, so there is none to write again.")
            (number,) = self._db.execute(
                "SELECT COALESCE(MAX(number), 0) + 1 FROM answer_versions WHERE message_id = ?", (last["id"],)
            ).fetchone()
            self._insert_version(last["id"], number, (answer_text, status, settings, stats, trace))
            self._show_version(last["id"], number)
        return self._get_message(last["id"])

    def show_version(self, answer_id: int, number: int) -> Message:
        """Put version `number` of an answer on screen: the conversation reads it from now on
        (and after a restart). Looking at a version is not activity: the chat keeps its place."""
        with self._write():
            self._show_version(answer_id, number)
        return self._get_message(answer_id)

    def edit_last_user(
        self, conv_id: int, new_user_text: str, answer_text: str, status: str = "complete", settings=None,
        stats=None, trace=None,
    ) -> tuple[Message, Message]:
        """Edit and resend the last message of yours (`edit_user`)."""
        last_user = self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND role = 'user' AND shown = 1 "
            "ORDER BY position DESC LIMIT 1",
            (conv_id,),
        ).fetchone()
        if last_user is None:
            raise HistoryError(f"Conversation {conv_id} has no message of yours to edit.")
        return self.edit_user(last_user["id"], new_user_text, answer_text, status, settings, stats, trace)

    def edit_user(
        self, message_id: int, new_user_text: str, answer_text: str = "", status: str = "complete", settings=None,
        stats=None, trace=None,
    ) -> tuple[Message, Message]:
        """Edit and resend a message of yours on screen: the new text and its answer take its place, and
        the message with everything that followed it stays as a branch beside them (`show_branch`)."""
        _check_status(status)
        with self._write():
            edited = self._db.execute(
                "SELECT conversation_id, position, parent_id, content, shown FROM messages "
                "WHERE id = ? AND role = 'user'",
                (message_id,),
            ).fetchone()
            if edited is None:
                raise HistoryError(f"There is no message {message_id} of yours in the chat history to edit; "
                                   "its chat may have been deleted.")
            if not edited["shown"]:
                raise HistoryError("The message you edited is not on screen any more (another version of a message "
                                   "above it is shown); edit it where it is shown.")
            conv_id = edited["conversation_id"]
            self._touch(conv_id)
            self._leave_branch(conv_id, edited["position"], edited["parent_id"])
            # If that was the first message and named the chat, the name follows the edit (by
            # _append_turn); a title the user chose stays.
            self._db.execute(
                "UPDATE conversations SET title = ? WHERE id = ? AND title = ? AND NOT EXISTS ("
                "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' AND shown = 1)",
                # a damaged (binary) first message named no chat: nothing to follow
                (DEFAULT_TITLE, conv_id, auto_title(edited["content"]) if isinstance(edited["content"], str) else None,
                 conv_id),
            )
            answer = (answer_text, status, settings, stats, trace)
            user_id, answer_id = self._append_turn(conv_id, new_user_text, answer)
        return self._get_message(user_id), self._get_message(answer_id)

    def show_branch(self, message_id: int, number: int) -> Message:
        """Put version `number` of a question (`message_id`: any of its versions) on screen, with the
        answers that followed it (and, further down, the versions chosen there when it was last
        shown); returns that version.
        Like looking at an answer's version, this is not activity: the chat keeps its place."""
        with self._write():
            question = self._db.execute(
                "SELECT conversation_id, position, parent_id FROM messages WHERE id = ? AND role = 'user'",
                (message_id,),
            ).fetchone()
            if question is None:
                raise HistoryError(f"There is no message {message_id} of yours in the chat history.")
            conv_id, position = question["conversation_id"], question["position"]
            versions = self._siblings(conv_id, position, question["parent_id"])
            (on_screen,) = self._db.execute(
                "SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND position = ? AND parent_id IS ? "
                "AND role = 'user' AND shown = 1",
                (conv_id, position, question["parent_id"]),
            ).fetchone()
            if not on_screen:
                raise HistoryError(f"No version of your message {message_id} is on screen (a message above it is "
                                   "shown in another version), so there is none to go to from it.")
            if not 1 <= number <= len(versions):
                raise HistoryError(f"Your message {message_id} has no version {number} in the chat history.")
            self._leave_branch(conv_id, position, question["parent_id"])
            shown: int | None = versions[number - 1]
            self._db.execute("UPDATE messages SET chosen = 1 WHERE id = ?", (shown,))
            seen: set[int] = set()
            while shown is not None:  # down the branch, by the version chosen at each step
                if shown in seen:  # a damaged file whose links go round: stop rather than loop for good
                    raise HistoryError("The chat history's links between messages go round in this chat (the file "
                                       "is damaged), so this version cannot be shown.")
                seen.add(shown)
                self._db.execute("UPDATE messages SET shown = 1 WHERE id = ?", (shown,))
                after = self._db.execute(
                    "SELECT id FROM messages WHERE conversation_id = ? AND parent_id = ? "
                    "ORDER BY chosen DESC, id DESC LIMIT 1",
                    (conv_id, shown),
                ).fetchone()
                shown = after["id"] if after is not None else None
        return self._get_message(versions[number - 1])

    def save_race(self, question_id: int, race: dict) -> None:
        """Keep a race (the question answered by the target alone and speculatively) with the
        question it raced: in that message's stats, as {"race": ...} (a question has no other)."""
        with self._write():
            cursor = self._db.execute(
                "UPDATE messages SET stats = ? WHERE id = ? AND role = 'user'", (_dump({"race": race}), question_id)
            )
            if cursor.rowcount == 0:
                raise HistoryError(f"There is no question {question_id} in the chat history to keep a race with; "
                                   "its chat may have been deleted or edited.")

    # Helpers; callers hold a transaction

    @contextmanager
    def _write(self) -> Iterator[None]:
        try:
            with transaction(self._db):
                yield
        except sqlite3.Error as exc:
            raise HistoryWriteError(write_message(self.path, exc)) from exc

    def _set_column(self, conv_id: int, column: str, value: str) -> None:
        with self._write():
            cursor = self._db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conv_id))
            if cursor.rowcount == 0:
                raise HistoryError(f"There is no conversation {conv_id} in the chat history; it may have been deleted.")

    def _touch(self, conv_id: int) -> None:
        cursor = self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (self._clock(), conv_id))
        if cursor.rowcount == 0:
            raise HistoryError(f"There is no conversation {conv_id} in the chat history; it may have been deleted.")

    def _siblings(self, conv_id: int, position: int, parent_id: int | None) -> list[int]:
        """The versions of a question (the messages that follow the same one), oldest first."""
        rows = self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND position = ? AND parent_id IS ? AND role = 'user' "
            "ORDER BY id",
            (conv_id, position, parent_id),
        ).fetchall()
        return [row["id"] for row in rows]

    def _leave_branch(self, conv_id: int, position: int, parent_id: int | None) -> None:
        """Take the branch on screen from `position` down off the screen, kept as it is (what was
        chosen inside it stays chosen), and no version of the question there chosen."""
        self._db.execute(
            "UPDATE messages SET shown = 0 WHERE conversation_id = ? AND position >= ? AND shown = 1",
            (conv_id, position),
        )
        self._db.execute(
            "UPDATE messages SET chosen = 0 WHERE conversation_id = ? AND position = ? AND parent_id IS ?",
            (conv_id, position, parent_id),
        )

    def _append_turn(self, conv_id: int, user_text: str, answer: tuple) -> tuple[int, int]:
        self._touch(conv_id)
        # The first message of a still-untitled chat names it.
        self._db.execute(
            "UPDATE conversations SET title = ? WHERE id = ? AND title = ? AND NOT EXISTS ("
            "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' AND shown = 1)",
            (auto_title(user_text), conv_id, DEFAULT_TITLE, conv_id),
        )
        (position,) = self._db.execute(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ? AND shown = 1", (conv_id,)
        ).fetchone()
        user_id = self._insert_message(conv_id, position, "user", (user_text, "complete", None, None, None))
        answer_id = self._insert_message(conv_id, position + 1, "assistant", answer)
        self._insert_version(answer_id, 1, answer)
        self._db.execute("UPDATE messages SET version = 1 WHERE id = ?", (answer_id,))
        return user_id, answer_id

    def _insert_message(self, conv_id: int, position: int, role: str, body: tuple) -> int:
        """A message at `position` of the branch on screen, after the one shown before it."""
        text, status, settings, stats, trace = body
        before = self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND position = ? AND shown = 1", (conv_id, position - 1)
        ).fetchone()
        cursor = self._db.execute(
            "INSERT INTO messages (conversation_id, position, role, content, status, settings, stats, trace, created, "
            "parent_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conv_id, position, role, text, status, _dump(settings), _dump(stats), _dump(trace), self._clock(),
             before["id"] if before is not None else None),
        )
        return cursor.lastrowid

    def _insert_version(self, answer_id: int, number: int, body: tuple) -> None:
        text, status, settings, stats, trace = body
        self._db.execute(
            "INSERT INTO answer_versions (message_id, number, content, status, settings, stats, trace, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (answer_id, number, text, status, _dump(settings), _dump(stats), _dump(trace), self._clock()),
        )

    def _write_version(self, answer_id: int, number: int, body: tuple, thinking: str = "") -> None:
        """Write one version; the answer's row follows when that version is the one on screen."""
        text, status, settings, stats, trace = body
        cursor = self._db.execute(
            "UPDATE answer_versions SET content = ?, status = ?, settings = ?, stats = ?, trace = ?, created = ?, "
            "thinking = ? WHERE message_id = ? AND number = ?",
            (text, status, _dump(settings), _dump(stats), _dump(trace), self._clock(), thinking, answer_id, number),
        )
        if cursor.rowcount == 0:
            raise HistoryError(f"Answer {answer_id} has no version {number} in the chat history to write.")
        self._db.execute(
            "UPDATE messages SET content = ?, status = ?, settings = ?, stats = ?, trace = ?, created = ?, "
            "thinking = ? WHERE id = ? AND version = ?",
            (text, status, _dump(settings), _dump(stats), _dump(trace), self._clock(), thinking, answer_id, number),
        )

    def _show_version(self, answer_id: int, number: int) -> None:
        v = self._db.execute(
            "SELECT * FROM answer_versions WHERE message_id = ? AND number = ?", (answer_id, number)
        ).fetchone()
        if v is None:
            raise HistoryError(f"Answer {answer_id} has no version {number} in the chat history.")
        self._db.execute(
            "UPDATE messages SET version = ?, content = ?, status = ?, settings = ?, stats = ?, trace = ?, "
            "created = ?, thinking = ? WHERE id = ?",
            (number, v["content"], v["status"], v["settings"], v["stats"], v["trace"], v["created"], v["thinking"],
             answer_id),
        )

    def _get_message(self, message_id: int) -> Message:
        row = self._db.execute(f"{_MESSAGE_SELECT} WHERE m.id = ?", (message_id,)).fetchone()
        message = None if row is None else _message(row, self.unreadable)
        if message is None:
            raise HistoryError(f"Message {message_id} in the chat history cannot be read; it may have been deleted.")
        return message


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"Unknown answer status {status!r}; expected one of {', '.join(STATUSES)}.")


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _conversation(row: sqlite3.Row, unreadable: UnreadableParts) -> Conversation | None:
    fields = conversation_fields(row, unreadable)  # each checked; None: the row is skipped
    return None if fields is None else Conversation(**fields)


# a question's versions are the messages of yours that follow the same one (parent_id IS: the first has none)
_MESSAGE_SELECT = (
    "SELECT m.*, (SELECT COUNT(*) FROM answer_versions AS v WHERE v.message_id = m.id) AS version_count, "
    "(SELECT COUNT(*) FROM messages AS s WHERE m.role = 'user' AND s.conversation_id = m.conversation_id "
    "AND s.parent_id IS m.parent_id AND s.position = m.position AND s.role = 'user') AS branch_count, "
    "(SELECT COUNT(*) FROM messages AS s WHERE m.role = 'user' AND s.conversation_id = m.conversation_id "
    "AND s.parent_id IS m.parent_id AND s.position = m.position AND s.role = 'user' AND s.id <= m.id) AS branch_number "
    "FROM messages AS m"
)


def _message(row: sqlite3.Row, unreadable: UnreadableParts) -> Message | None:
    fields = message_fields(row, unreadable)
    return None if fields is None else Message(**fields)


def _version(row: sqlite3.Row, unreadable: UnreadableParts) -> AnswerVersion | None:
    fields = version_fields(row, unreadable)
    return None if fields is None else AnswerVersion(**fields)
