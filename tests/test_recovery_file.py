"""Answers the history refused, kept at quit (app/chat/recovery.py): where the history's own
folder is full, they go to the next folder that takes them, whole; no empty or half file is left
behind anywhere (a full disk once left an empty recovery file and the answer only on stderr)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from app.chat import recovery

ANSWERS = [{"answer_id": 3, "text": "Once upon a time" * 50, "status": "interrupted"}]


def _full(folders: set[Path], monkeypatch, after_bytes: int = 10):
    """Writes into `folders` fail with ENOSPC after `after_bytes` (the file exists by then)."""
    real_open, real_write = os.open, os.write
    full_fds: set[int] = set()

    def opening(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if Path(path).parent in folders:
            full_fds.add(fd)
        else:
            full_fds.discard(fd)  # a number reused after a failed file was closed
        return fd

    def writing(fd, data):
        if fd in full_fds:
            real_write(fd, bytes(data[:after_bytes]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(recovery.os, "open", opening)
    monkeypatch.setattr(recovery.os, "write", writing)


def test_a_full_history_folder_sends_the_answers_to_the_next_folder_whole(tmp_path, monkeypatch):
    history = tmp_path / "data" / "history.sqlite3"
    history.parent.mkdir()
    _full({history.parent}, monkeypatch)
    path, refused = recovery.write_recovery(ANSWERS, history)
    assert path is not None and path.parent != history.parent
    assert json.loads(path.read_text(encoding="utf-8")) == ANSWERS  # whole, and readable
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert list(history.parent.iterdir()) == []  # no empty or half file where the user would look
    assert refused and "No space left" in refused[0] and str(history.parent) in refused[0]
    path.unlink()


def test_when_no_folder_takes_them_nothing_is_left_and_each_refusal_is_said(tmp_path, monkeypatch):
    history = tmp_path / "data" / "history.sqlite3"
    history.parent.mkdir()
    folders = set(recovery.recovery_folders(history))
    assert len(folders) == 3  # beside the history, the cache folder, the temporary folder
    before = {folder: set(folder.iterdir()) for folder in folders}
    _full(folders, monkeypatch)
    path, refused = recovery.write_recovery(ANSWERS, history)
    assert path is None and len(refused) == 3
    for folder in folders:
        assert set(folder.iterdir()) == before[folder]
