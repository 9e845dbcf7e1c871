"""Answers the history refused, kept in a file when Tandem quits, where a file still fits.

The history's own folder comes first (the user looks there), then Tandem's cache folder, then
the system's temporary folder: a full disk often holds only one of them. Each file is written
whole under a temporary name and renamed, so a disk that fills mid-write leaves no empty or
half file that looks like a recovery (one once did: created, then ENOSPC, then nothing in it).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path


def recovery_folders(history_path: Path) -> list[Path]:
    from app.paths import cache_dir

    folders = [history_path.parent]
    try:
        folders.append(cache_dir())
    except OSError:  # the cache folder cannot be made either
        pass
    folders.append(Path(tempfile.gettempdir()))
    return list(dict.fromkeys(folders))


def write_recovery(answers: list[dict], history_path: Path) -> tuple[Path | None, list[str]]:
    """(the file the answers went to, or None; why each folder tried before it refused)."""
    data = json.dumps(answers, ensure_ascii=False, indent=1).encode("utf-8")
    name = f"unsaved-answers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    refused = []
    for folder in recovery_folders(history_path):
        target = folder / name
        partial = folder / f".{name}.partial"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # readable by the user only
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, target)
            return target, refused
        except OSError as exc:
            refused.append(f"{folder}: {exc.strerror or exc}")
            try:
                partial.unlink()
            except OSError:
                pass
    return None, refused
