"""The chat history: conversations and their messages in one SQLite file in the user data folder.

A store is used from one thread (the GUI thread) for its whole life, so its connection is never
shared between threads. Every write is one transaction: a crash keeps all of it or none of it.
`begin_answer` stores the user's message with an empty answer marked 'interrupted' before
generation starts, so an app killed mid-answer never loses what the user typed.

An answer keeps every version Regenerate wrote (`answer_versions`); its row in `messages` holds
the version on screen, so the conversation (and what the model reads next) is that version.
A write that fails says why in a HistoryWriteError (locked, disk full, read-only), and the same
write can be tried again later. The file and its journals are readable by their owner only.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from app import paths
from app.chat.history_format import format_problem
from app.chat.history_rows import STATUSES, UnreadableParts, conversation_fields, message_fields, version_fields

DEFAULT_TITLE = "New chat"
TITLE_CHARS = 48
BUSY_TIMEOUT_S = 2.0

# Primary SQLite result codes (the low byte of an extended code). Only these two kinds of failure
# get special handling: a busy file is left alone, a damaged one is moved aside.
_BUSY_CODES = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
_DAMAGED_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_FULL_CODES = {13}  # SQLITE_FULL
_READONLY_CODES = {8}  # SQLITE_READONLY
PRIVATE_MODE = 0o600  # chats are as private as the hub token
log = logging.getLogger(__name__)


class HistoryError(Exception):
    """The history cannot be opened or written; the message says why and what the user can do."""


class HistoryWriteError(HistoryError):
    """A write the file refused (locked by another program, disk full, read-only): nothing of it
    was stored, and the same write may succeed later."""


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


def _migrate_to_v1(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL,
            updated REAL NOT NULL)"""
    )
    db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('complete', 'stopped', 'error', 'interrupted')),
            settings TEXT,
            stats TEXT,
            trace TEXT,
            created REAL NOT NULL)"""
    )
    db.execute("CREATE UNIQUE INDEX messages_in_order ON messages (conversation_id, position)")
    db.execute("CREATE INDEX conversations_by_updated ON conversations (updated)")


def _migrate_to_v2(db: sqlite3.Connection) -> None:
    """Regenerate keeps the answers it replaces: every answer becomes its own first version."""
    db.execute(
        """CREATE TABLE answer_versions (
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            content TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('complete', 'stopped', 'error', 'interrupted')),
            settings TEXT,
            stats TEXT,
            trace TEXT,
            created REAL NOT NULL,
            PRIMARY KEY (message_id, number))"""
    )
    db.execute("ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 0")  # the one on screen
    db.execute(
        "INSERT INTO answer_versions (message_id, number, content, status, settings, stats, trace, created) "
        "SELECT id, 1, content, status, settings, stats, trace, created FROM messages WHERE role = 'assistant'"
    )
    db.execute("UPDATE messages SET version = 1 WHERE role = 'assistant'")


def _migrate_to_v3(db: sqlite3.Connection) -> None:
    """Reasoning models: an answer keeps the thinking written before it."""
    db.execute("ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE answer_versions ADD COLUMN thinking TEXT NOT NULL DEFAULT ''")


# MIGRATIONS[i] brings a database from user_version i to i + 1. Append steps; never edit a shipped one.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_migrate_to_v1, _migrate_to_v2, _migrate_to_v3)


def default_path() -> Path:
    return paths.data_dir() / "history.sqlite3"


def auto_title(text: str) -> str:
    """The first non-empty line of a message, cut to about TITLE_CHARS characters."""
    line = next((" ".join(line.split()) for line in text.splitlines() if line.strip()), "")
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


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
        damage = _check_integrity(path, busy_timeout)
        if damage is not None:
            moved = _move_aside(path)
            recovery = (
                f"The chat history at {path} was damaged ({damage}) and has been moved to {moved}; "
                "a new, empty history was started. Nothing was deleted."
            )
        _make_private(path)
        store = cls(_connect(path, busy_timeout), path, clock, busy_timeout)
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
        """The conversation as it reads: each answer in the version on screen."""
        rows = self._db.execute(
            f"{_MESSAGE_SELECT} WHERE m.conversation_id = ? ORDER BY m.position", (conv_id,)
        ).fetchall()
        return [m for row in rows if (m := _message(row, self.unreadable)) is not None]

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
                "SELECT id, role FROM messages WHERE conversation_id = ? ORDER BY position DESC LIMIT 1", (conv_id,)
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
        """Edit and resend: the last user message and everything after it give way to the new turn."""
        _check_status(status)
        with self._write():
            self._touch(conv_id)
            last_user = self._db.execute(
                "SELECT position, content FROM messages WHERE conversation_id = ? AND role = 'user' "
                "ORDER BY position DESC LIMIT 1",
                (conv_id,),
            ).fetchone()
            if last_user is None:
                raise HistoryError(f"Conversation {conv_id} has no message of yours to edit.")
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conv_id, last_user["position"])
            )
            # If that was the first message and named the chat, the name follows the edit (by
            # _append_turn); a title the user chose stays.
            self._db.execute(
                "UPDATE conversations SET title = ? WHERE id = ? AND title = ? AND NOT EXISTS ("
                "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user')",
                (DEFAULT_TITLE, conv_id, auto_title(last_user["content"]), conv_id),
            )
            answer = (answer_text, status, settings, stats, trace)
            user_id, answer_id = self._append_turn(conv_id, new_user_text, answer)
        return self._get_message(user_id), self._get_message(answer_id)

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
            with _transaction(self._db):
                yield
        except sqlite3.Error as exc:
            raise HistoryWriteError(_write_message(self.path, exc)) from exc

    def _set_column(self, conv_id: int, column: str, value: str) -> None:
        with self._write():
            cursor = self._db.execute(f"UPDATE conversations SET {column} = ? WHERE id = ?", (value, conv_id))
            if cursor.rowcount == 0:
                raise HistoryError(f"There is no conversation {conv_id} in the chat history; it may have been deleted.")

    def _touch(self, conv_id: int) -> None:
        cursor = self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (self._clock(), conv_id))
        if cursor.rowcount == 0:
            raise HistoryError(f"There is no conversation {conv_id} in the chat history; it may have been deleted.")

    def _append_turn(self, conv_id: int, user_text: str, answer: tuple) -> tuple[int, int]:
        self._touch(conv_id)
        # The first message of a still-untitled chat names it.
        self._db.execute(
            "UPDATE conversations SET title = ? WHERE id = ? AND title = ? AND NOT EXISTS ("
            "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user')",
            (auto_title(user_text), conv_id, DEFAULT_TITLE, conv_id),
        )
        (position,) = self._db.execute(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ?", (conv_id,)
        ).fetchone()
        user_id = self._insert_message(conv_id, position, "user", (user_text, "complete", None, None, None))
        answer_id = self._insert_message(conv_id, position + 1, "assistant", answer)
        self._insert_version(answer_id, 1, answer)
        self._db.execute("UPDATE messages SET version = 1 WHERE id = ?", (answer_id,))
        return user_id, answer_id

    def _insert_message(self, conv_id: int, position: int, role: str, body: tuple) -> int:
        text, status, settings, stats, trace = body
        cursor = self._db.execute(
            "INSERT INTO messages (conversation_id, position, role, content, status, settings, stats, trace, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conv_id, position, role, text, status, _dump(settings), _dump(stats), _dump(trace), self._clock()),
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


# Opening: look before touching, then connect and migrate


def _check_integrity(path: Path, busy_timeout: float) -> str | None:
    """What is wrong with the file, or None. A read-only connection, because closing a writable one
    checkpoints the WAL into the main file: a damaged file must be moved aside exactly as found."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    try:
        # quick_check reads every page once (O(file size)), without the slower index cross-checks.
        problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
        if problems == ["ok"]:
            return format_problem(db, MIGRATIONS)  # whole pages can still hold a format no migration fits
        detail = " ".join(" ".join(problems).split())  # one line for a dialog; the file keeps the rest
        return detail if len(detail) <= 120 else detail[:119] + "…"
    except sqlite3.DatabaseError as exc:
        if _code(exc) in _DAMAGED_CODES:
            return str(exc)
        raise _open_error(path, exc) from exc
    finally:
        db.close()


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    try:
        # isolation_level=None: no implicit transactions; _transaction opens each one explicitly.
        db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        _refuse_newer(path, version)  # before anything below changes the file
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA foreign_keys = ON")
        with _transaction(db):
            # BEGIN IMMEDIATE takes the write lock, so a second Tandem writing this file is found now.
            (version,) = db.execute("PRAGMA user_version").fetchone()
            _refuse_newer(path, version)
            for step in MIGRATIONS[version:]:
                step(db)
            db.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
    except BaseException as exc:
        db.close()
        if isinstance(exc, sqlite3.Error):
            raise _open_error(path, exc) from exc
        raise
    db.row_factory = sqlite3.Row
    # a search reads every title and text: one stored as a number or a blob must match nothing, not raise
    db.create_function("casefold", 1, lambda text: text.casefold() if isinstance(text, str) else "",
                       deterministic=True)
    return db


def _refuse_newer(path: Path, version: int) -> None:
    if version < 0:  # set aside by open() when it finds one; here only if one appeared since
        raise HistoryError(f"The chat history at {path} records format {version}, which no Tandem writes; the "
                           "file was left as it is. Move it aside and start Tandem again for a new history.")
    if version > len(MIGRATIONS):
        raise HistoryError(
            f"The chat history at {path} was written by a newer Tandem (format {version}; this version reads up "
            f"to {len(MIGRATIONS)}). Update Tandem to open it; the file was left as it is."
        )


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    with db:  # commits when the block ends, rolls back on any exception (a failed commit too)
        db.execute("BEGIN IMMEDIATE")
        yield


def _make_private(path: Path) -> None:
    """Create the history file readable by its owner only, or make an older one so. SQLite gives
    its -wal, -shm and journal files the database file's mode, so they follow."""
    if os.name != "posix" or str(path) == ":memory:":
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_MODE))
    except FileExistsError:
        pass
    except OSError as exc:
        raise HistoryError(
            f"Could not create the chat history at {path} ({exc.strerror or exc}). "
            "Check that the folder exists, is yours and is writable."
        ) from exc
    for suffix in ("", "-wal", "-shm", "-journal"):
        part = Path(f"{path}{suffix}")
        try:
            if part.exists() and part.stat().st_mode & 0o777 != PRIVATE_MODE:
                part.chmod(PRIVATE_MODE)
        except OSError as exc:  # another user's file: it stays as it is, and still opens
            log.warning("could not make %s private: %s", part, exc)


def _move_aside(path: Path) -> Path:
    """Rename the damaged file (and its -wal/-shm) to `<name>.corrupt-<time>`, never over an existing file."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while any(Path(f"{target}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        # The WAL first: a fresh database must never meet the old file's log.
        for suffix in ("-wal", "-shm", ""):
            source = Path(f"{path}{suffix}")
            if source.exists():
                source.rename(f"{target}{suffix}")
    except OSError as exc:
        raise HistoryError(
            f"The chat history at {path} is damaged and could not be moved aside ({exc}). "
            "Move or rename it yourself, then start Tandem again."
        ) from exc
    return target


def _open_error(path: Path, exc: sqlite3.Error) -> HistoryError:
    if _code(exc) in _BUSY_CODES:
        return HistoryError(_locked_message(path))
    return HistoryError(f"Could not open the chat history at {path}: {exc}. Check that the folder is writable.")


def _write_message(path: Path, exc: sqlite3.Error) -> str:
    """What went wrong with a write, in words; the failed write changed nothing."""
    code, text = _code(exc), str(exc).lower()
    if code in _BUSY_CODES or "locked" in text:
        why = "another program holds it locked (another Tandem may be running)"
    elif code in _FULL_CODES or "disk is full" in text:
        why = "the disk is full. Free some space on that disk"
    elif code in _READONLY_CODES or "readonly" in text or "read-only" in text:
        why = f"the data folder is read-only. Make {path.parent} writable"
    else:
        why = f"{exc}. Check the disk and the folder {path.parent}"
    return f"Could not save to the chat history at {path}: {why}."


def _locked_message(path: Path) -> str:
    return (
        f"The chat history at {path} is locked by another program; another Tandem may be running. "
        "Close it and try again."
    )


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise ValueError(f"Unknown answer status {status!r}; expected one of {', '.join(STATUSES)}.")


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _conversation(row: sqlite3.Row, unreadable: UnreadableParts) -> Conversation | None:
    fields = conversation_fields(row, unreadable)  # each checked; None: the row is skipped
    return None if fields is None else Conversation(**fields)


_MESSAGE_SELECT = (
    "SELECT m.*, (SELECT COUNT(*) FROM answer_versions AS v WHERE v.message_id = m.id) AS version_count "
    "FROM messages AS m"
)


def _message(row: sqlite3.Row, unreadable: UnreadableParts) -> Message | None:
    fields = message_fields(row, unreadable)
    return None if fields is None else Message(**fields)


def _version(row: sqlite3.Row, unreadable: UnreadableParts) -> AnswerVersion | None:
    fields = version_fields(row, unreadable)
    return None if fields is None else AnswerVersion(**fields)
