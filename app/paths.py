"""Where Tandem keeps its files: user data (history), user cache (models), and bundled assets.

`TANDEM_HOME` moves everything under one folder (tests, portable installs); otherwise the
platform's usual folders from platformdirs are used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs

APP_NAME = "Tandem"


def _home_override() -> Path | None:
    value = os.environ.get("TANDEM_HOME")
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    """History database and other user data."""
    home = _home_override()
    path = home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Converted models and downloads: safe to delete, rebuilt on demand."""
    override = os.environ.get("TANDEM_CACHE")
    if override:
        path = Path(override).expanduser()
    elif (home := _home_override()) is not None:
        path = home / "cache"
    else:
        path = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resources_dir() -> Path:
    """The `resources/` folder, also inside a PyInstaller bundle (sys._MEIPASS)."""
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def asset(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)
