"""Where Tandem keeps its files: user data (history), user cache (models), and bundled assets.

`TANDEM_HOME` moves everything under one folder (tests, portable installs); otherwise the
platform's usual folders from platformdirs are used.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import platformdirs

APP_NAME = "Tandem"
SETTINGS_FILE = "Tandem.conf"


class FolderError(OSError):
    """A folder Tandem needs cannot be made; the message says which, why, and what to do."""


def _home_override() -> Path | None:
    value = os.environ.get("TANDEM_HOME")
    return Path(value).expanduser() if value else None


def _in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` (or path itself) that is not a folder."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def make_folder(path: Path, what: str) -> Path:
    """mkdir -p, or a FolderError naming `what` ("data", "cache"), the path, the cause and the fix."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = _in_the_way(path)
        if blocker is not None:
            cause = f"{blocker} is a file, not a folder"
        elif exc.errno == errno.ENOSPC:
            cause = "the disk is full"
        else:
            cause = exc.strerror or type(exc).__name__
        if (home := _home_override()) is not None:
            advice = (f"TANDEM_HOME is set to {home}: point it at a folder you can write to, or unset it"
                      + (", or move that file away." if blocker is not None else "."))
        elif blocker is not None:
            advice = "Move or rename that file, or set TANDEM_HOME to a folder you can write to."
        else:
            advice = f"Check that you can write to {path.parent}, or set TANDEM_HOME to a folder you can write to."
        error = FolderError(f"Tandem cannot create its {what} folder {path}: {cause}. {advice}")
        error.errno = exc.errno
        raise error from exc
    return path


def make_output_folder(path: Path, what: str) -> Path:
    """mkdir -p for a folder the user named to write `what` into (`tandem-cli import`'s output,
    `align --out`), or a FolderError that says what is in the way: mkdir's own "File exists" on a
    file there reads as advice about links and permissions."""
    path = Path(path).expanduser()
    blocker = _in_the_way(path)
    if blocker is not None:
        if blocker.is_symlink() and not blocker.exists():
            cause = f"{blocker} is a symbolic link that points nowhere (or loops)"
        else:
            cause = f"{'it' if blocker == path else blocker} is a file, not a folder"
        error = FolderError(f"cannot write {what} to {path}: {cause}. Give a folder's path (it is made if it does "
                            "not exist), or move that file away.")
        error.errno = errno.ENOTDIR
        raise error
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        cause = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or type(exc).__name__
        error = FolderError(f"cannot make the folder {path} for {what}: {cause}. Check that you may write to "
                            f"{path.parent}, or give another folder.")
        error.errno = exc.errno
        raise error from exc
    return path


def data_dir() -> Path:
    """History database and other user data."""
    home = _home_override()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return make_folder(path, "data")


def settings_file() -> Path | None:
    """Where the window's QSettings live under TANDEM_HOME; None: the platform's usual place
    (QSettings' own default, ~/.config/Tandem/Tandem.conf on Linux)."""
    home = _home_override()
    return home / SETTINGS_FILE if home else None


def cache_dir() -> Path:
    """Converted models and downloads: safe to delete, rebuilt on demand."""
    override = os.environ.get("TANDEM_CACHE")
    if override:
        path = Path(override).expanduser()
    elif (home := _home_override()) is not None:
        path = home / "cache"
    else:
        path = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return make_folder(path, "cache")


def models_dir() -> Path:
    return make_folder(cache_dir() / "models", "model cache")


def resources_dir() -> Path:
    """The `resources/` folder, also inside a PyInstaller bundle (sys._MEIPASS)."""
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def asset(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)
