"""The chat history's tables, as the migrations build them: each step brings a file from one
format (PRAGMA user_version) to the next, and app/chat/history_file.py runs the missing ones when
it opens a file. A format is never changed once shipped; a new one is a new step.
"""

from __future__ import annotations

import sqlite3

from app.chat.history_format import Migration
from app.chat.history_titles import restored_title


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


def _migrate_to_v4(db: sqlite3.Connection) -> None:
    """Edit keeps what it replaces (issue 46): each message knows the one it follows (`parent_id`),
    so an edited question and everything after it stay beside the new one as a branch. `chosen`:
    of the messages that follow the same one (the versions of a question), the one the chat goes
    on with; `shown`: on the path the chat shows now (the chosen ones from the first message on).
    Only shown messages hold a place in the chat, so only they are unique by position."""
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
    db.execute("ALTER TABLE messages ADD COLUMN chosen INTEGER NOT NULL DEFAULT 1")
    db.execute("ALTER TABLE messages ADD COLUMN shown INTEGER NOT NULL DEFAULT 1")
    # every message so far is on the one path there was: it follows the message before it (found
    # by the index of positions, before it is replaced by one of the shown messages' only)
    db.execute(
        "UPDATE messages SET parent_id = (SELECT p.id FROM messages AS p WHERE p.conversation_id = "
        "messages.conversation_id AND p.position < messages.position ORDER BY p.position DESC LIMIT 1)"
    )
    db.execute("DROP INDEX IF EXISTS messages_in_order")
    # a damaged file may hold two messages at one place of a chat (its old index was lost): the
    # earliest stays on screen and the others are kept out of view, rather than the upgrade failing
    db.execute(
        "UPDATE messages SET shown = 0 WHERE id > (SELECT MIN(o.id) FROM messages AS o WHERE o.conversation_id = "
        "messages.conversation_id AND o.position IS messages.position)"
    )
    db.execute("CREATE UNIQUE INDEX messages_in_order ON messages (conversation_id, position) WHERE shown = 1")
    db.execute("CREATE INDEX messages_by_parent ON messages (conversation_id, parent_id)")


def _migrate_to_v5(db: sqlite3.Connection) -> None:
    """Titles whole (issue 46): one Tandem cut with a "…" from the chat's first question gets its
    words back; a name the user chose stays."""
    rows = db.execute(
        "SELECT c.id, c.title, (SELECT m.content FROM messages AS m WHERE m.conversation_id = c.id AND "
        "m.role = 'user' AND m.shown = 1 ORDER BY m.position LIMIT 1) FROM conversations AS c "
        "WHERE c.title LIKE '%…'"
    ).fetchall()
    for conv_id, title, question in rows:
        if isinstance(title, str) and isinstance(question, str) and (whole := restored_title(title, question)):
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (whole, conv_id))


# MIGRATIONS[i] brings a database from user_version i to i + 1. Append steps; never edit a shipped one.
MIGRATIONS: tuple[Migration, ...] = (_migrate_to_v1, _migrate_to_v2, _migrate_to_v3, _migrate_to_v4, _migrate_to_v5)
