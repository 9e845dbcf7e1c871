"""Where aligned drafts live and how one is written: whole or not at all.

Each result is a folder under the data folder's `aligned/`. It is written into a hidden
`.<name>.partial-<pid>` folder beside it and renamed into place only once every file is on disk,
so a cancelled, crashed or killed job leaves no folder that looks like a draft; partial folders of
jobs no longer running are removed the next time a job starts. The original draft is never
touched: choosing it again undoes the alignment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from app.align.cancel import never, stop_if_cancelled
from app.models.aligned_head import MANIFEST, read_manifest
from app.paths import data_dir, make_folder

PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)$")


def aligned_dir() -> Path:
    return make_folder(data_dir() / "aligned", "aligned drafts")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's (or Windows' access rules): leave it
        return True
    return True


def remove_stale_partials(root: Path | None = None) -> list[Path]:
    root = root or aligned_dir()
    removed = []
    for entry in root.iterdir():
        match = PARTIAL.match(entry.name)
        if match and entry.is_dir() and not _alive(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def result_name(target_name: str, kind: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", target_name).strip("-.")[:60] or "model"
    return f"{slug}-{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def write_result(name: str, write: Callable[[Path], None], manifest: dict, root: Path | None = None,
                 cancelled: Callable[[], bool] = never) -> Path:
    """Call `write(folder)` on a partial folder, add the manifest, then move it into place under
    `name` (a number appended if taken). Anything raised removes the partial folder, AlignCancelled
    too: a cancel heard before the rename leaves no draft, as a cancel does in any earlier step."""
    root = root or aligned_dir()
    partial = root / f".{name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        write(partial)
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        for path in partial.iterdir():  # on disk before the rename makes it a draft
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        stop_if_cancelled(cancelled)
        final, n = root / name, 1
        while final.exists():
            n += 1
            final = root / f"{name}-{n}"
        os.replace(partial, final)
        return final
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def update_manifest(folder: Path, **fields) -> None:
    manifest = read_manifest(folder)
    manifest.update(fields)
    temporary = folder / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(temporary, folder / MANIFEST)


def aligned_for(target: Path, root: Path | None = None) -> list[Path]:
    """Aligned drafts whose manifest names `target`'s folder, newest first."""
    root = root or aligned_dir()
    wanted = str(Path(target).resolve())
    found = [entry for entry in root.iterdir()
             if entry.is_dir() and not entry.name.startswith(".")
             and read_manifest(entry).get("target", {}).get("folder") == wanted]
    return sorted(found, key=lambda p: read_manifest(p).get("created_at", 0), reverse=True)
