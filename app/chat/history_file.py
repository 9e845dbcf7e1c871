"""The chat history's file: opened checked (a damaged one moved aside as found, a newer one left
alone), made private to its owner, connected and migrated (app/chat/history_schema.py) in one
transaction; and, in words, why an open or a write failed. app/chat/history.py's store opens
its file here and writes each transaction through `transaction`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from app.chat.history_format import Migration, format_problem

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


def check_integrity(path: Path, busy_timeout: float, migrations: Sequence[Migration]) -> str | None:
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
            return format_problem(db, migrations)  # whole pages can still hold a format no migration fits
        detail = " ".join(" ".join(problems).split())  # one line for a dialog; the file keeps the rest
        return detail if len(detail) <= 120 else detail[:119] + "…"
    except sqlite3.DatabaseError as exc:
        if _code(exc) in _DAMAGED_CODES:
            return str(exc)
        raise _open_error(path, exc) from exc
    finally:
        db.close()


def connect(path: Path, busy_timeout: float, migrations: Sequence[Migration]) -> sqlite3.Connection:
    try:
        # isolation_level=None: no implicit transactions; _transaction opens each one explicitly.
        db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        _refuse_newer(path, version, migrations)  # before anything below changes the file
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA foreign_keys = ON")
        with transaction(db):
            # BEGIN IMMEDIATE takes the write lock, so a second Tandem writing this file is found now.
            (version,) = db.execute("PRAGMA user_version").fetchone()
            _refuse_newer(path, version, migrations)
            for step in migrations[version:]:
                step(db)
            db.execute(f"PRAGMA user_version = {len(migrations)}")
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


def _refuse_newer(path: Path, version: int, migrations: Sequence[Migration]) -> None:
    if version < 0:  # set aside by open() when it finds one; here only if one appeared since
        raise HistoryError(f"The chat history at {path} records format {version}, which no Tandem writes; the "
                           "file was left as it is. Move it aside and start Tandem again for a new history.")
    if version > len(migrations):
        raise HistoryError(
            f"The chat history at {path} was written by a newer Tandem (format {version}; this version reads up "
            f"to {len(migrations)}). Update Tandem to open it; the file was left as it is."
        )


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    with db:  # commits when the block ends, rolls back on any exception (a failed commit too)
        db.execute("BEGIN IMMEDIATE")
        yield


def make_private(path: Path) -> None:
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


def move_aside(path: Path) -> Path:
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


def write_message(path: Path, exc: sqlite3.Error) -> str:
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
