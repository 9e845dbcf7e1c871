"""Faults injected where a real one cannot be made in a test: the history's connection failing
the way sqlite3 fails when the disk fills up or its folder turns read-only mid-answer."""

from __future__ import annotations


class FailingWrites:
    """The store's connection, where every statement that writes raises `error`; reads pass."""

    def __init__(self, db, error):
        self._db, self._error = db, error

    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise self._error
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)

    def __enter__(self):
        return self._db.__enter__()

    def __exit__(self, *exc):
        return self._db.__exit__(*exc)
