"""Whether a chat history file is in a format this Tandem can migrate and write: its recorded
version (PRAGMA user_version) known, and its tables holding the columns that version has.

SQLite's integrity check reads pages, not meaning: it says "ok" to a file whose version is -1 (the
migrations then ran again: "duplicate column name: thinking") or whose messages table lacks a
column its version has (every read of it raised). Such a file is set aside like a damaged one
(app/chat/history_file.py). A newer version is not checked here: history_file.py leaves that file
alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import lru_cache

Migration = Callable[[sqlite3.Connection], None]


def format_problem(db: sqlite3.Connection, migrations: Sequence[Migration]) -> str | None:
    """What makes the file unusable at its recorded version, in words, or None. `db` may be
    read-only: this only reads."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version < 0:
        return f"it records format {version}, which no Tandem writes"
    if version > len(migrations):
        return None  # a newer Tandem's: refused, and left as it is, when it is opened
    expected = expected_columns(tuple(migrations), version)
    found = _columns(db)  # tables of its own that another program added stay its own
    for table in sorted(expected):
        if table not in found:
            return f"it records format {version} but has no {table} table"
        missing = [c for c in expected[table] if c not in found[table]]
        if missing:
            return f"its {table} table lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        unfilled = [c for c, needed in found[table].items() if needed and c not in expected[table]]
        if unfilled:  # every write would fail: Tandem does not know to fill them
            return f"its {table} table has columns Tandem does not fill ({', '.join(unfilled)})"
    return None


@lru_cache(maxsize=8)
def expected_columns(migrations: tuple[Migration, ...], version: int) -> dict[str, dict[str, bool]]:
    """The tables and columns a file of `version` has, from the migrations it records as run, run
    again on an empty database in memory (one source of truth: a new migration needs no entry here)."""
    db = sqlite3.connect(":memory:")
    try:
        for step in migrations[:version]:
            step(db)
        return _columns(db)
    finally:
        db.close()


def _columns(db: sqlite3.Connection) -> dict[str, dict[str, bool]]:
    """{table: {column: whether an insert must name it}} for every table but SQLite's own."""
    tables = [name for (name,) in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'").fetchall()]
    found = {}
    for table in tables:
        quoted = '"' + table.replace('"', '""') + '"'
        # table_info rows: (cid, name, type, notnull, default, pk); an INTEGER PRIMARY KEY fills itself
        found[table] = {name: bool(notnull) and default is None and not pk
                        for _cid, name, _type, notnull, default, pk in db.execute(f"PRAGMA table_info({quoted})")}
    return found
