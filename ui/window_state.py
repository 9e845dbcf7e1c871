"""What the window remembers between runs (QSettings): size and position, splitter positions,
which panels are open, and the chat that was open.

Every value read back is checked: the file is plain text a person (or a crash) can damage, and
a value of the wrong type (`geometry=hello`) once aborted every start. A bad value is removed
and the default used, never fatal."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QCoreApplication, QSettings, QStandardPaths
from PySide6.QtWidgets import QMainWindow, QSplitter

from app import data_files
from app.data_files import NotAnswering
from app.paths import APP_NAME, SETTINGS_FILE, settings_file

GEOMETRY, SPLITTER = "window/geometry", "window/splitter"
SIDE_PANEL, SETTINGS_DRAWER = "window/side_panel", "window/settings_drawer"
THEME = "view/theme"  # "system", "light" or "dark" (ui/theme.py)
LAST_CONVERSATION = "chat/last_conversation"
TINT = "view/tint"  # the side panel's "Tint answers by origin"
DISMISSED_RECOVERIES = "chat/dismissed_recoveries"  # recovery files the user chose to leave (their names)
NOTICE = "tandemNotice"  # a property of the settings object: what to tell the user about its file (notice())


def open_settings() -> QSettings:
    """Tandem.conf under TANDEM_HOME when it is set (tests, portable installs), else where
    QSettings keeps an app's settings on this platform.

    QSettings reads the file as it is made, without a bound: a named pipe there kept the window
    from ever showing. So the file is checked first (app/data_files.py). One that is not a file is
    set aside (kept, renamed) and the settings start afresh; one that does not answer is left as
    it is and this session's settings live in a temporary file. Either way notice(settings) says so."""
    path = settings_file()
    file = path if path is not None else native_settings_file()
    problem = data_files.check(file) if file is not None else None
    if problem is None:
        return QSettings() if path is None else QSettings(str(path), QSettings.Format.IniFormat)
    why = str(problem).removeprefix(f"{file} ")
    if not isinstance(problem, NotAnswering):
        aside = file.with_suffix(f".damaged-{int(time.time())}")
        try:
            file.replace(aside)
        except OSError:
            pass
        else:
            settings = QSettings() if path is None else QSettings(str(path), QSettings.Format.IniFormat)
            settings.setProperty(NOTICE, f"Tandem could not read its settings file {file} (it {why}); it was set "
                                         f"aside as {aside.name} and the window starts with its usual layout.")
            return settings
    settings = QSettings(str(Path(tempfile.mkdtemp(prefix="tandem-settings-")) / SETTINGS_FILE),
                         QSettings.Format.IniFormat)
    settings.setProperty(NOTICE, f"Tandem could not read its settings file {file} (it {why}). It was left as it "
                                 "is; the window's layout and choices are kept for this session only.")
    return settings


def native_settings_file() -> Path | None:
    """The file QSettings() reads on Linux and other Unix desktops ($XDG_CONFIG_HOME/Tandem/Tandem.conf);
    None where the platform keeps settings elsewhere (the registry, a macOS preferences domain)."""
    if sys.platform in ("darwin", "win32"):
        return None
    app = QCoreApplication.instance()
    organization = (app.organizationName() if app else "") or APP_NAME
    name = (app.applicationName() if app else "") or APP_NAME
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return Path(folder) / organization / f"{name}.conf" if folder else None


def notice(settings: QSettings) -> str:
    """What the user should be told about the settings file as it was opened ("" where nothing)."""
    value = settings.property(NOTICE)
    return value if isinstance(value, str) else ""


def save(settings: QSettings, window: QMainWindow, splitter: QSplitter, *, side_panel: bool,
         drawer: bool, conversation_id: int | None) -> None:
    settings.setValue(GEOMETRY, window.saveGeometry())
    settings.setValue(SPLITTER, splitter.saveState())
    settings.setValue(SIDE_PANEL, side_panel)
    settings.setValue(SETTINGS_DRAWER, drawer)
    settings.setValue(LAST_CONVERSATION, conversation_id if conversation_id is not None else -1)
    settings.sync()


def restore_layout(settings: QSettings, window: QMainWindow, splitter: QSplitter) -> bool:
    """Geometry and splitter; False when there was nothing usable to restore (the first start,
    or a damaged value, which is removed)."""
    geometry, state = _bytes(settings, GEOMETRY), _bytes(settings, SPLITTER)
    if geometry is not None and not window.restoreGeometry(geometry):
        settings.remove(GEOMETRY)
        geometry = None
    if state is not None and not splitter.restoreState(state):
        settings.remove(SPLITTER)
    return geometry is not None


def _bytes(settings: QSettings, key: str) -> QByteArray | None:
    """Qt's saved state is bytes; anything else there (text, a number, a list) is damage."""
    value = settings.value(key)
    if value is None:
        return None
    if isinstance(value, (QByteArray, bytes, bytearray)) and len(value):
        return QByteArray(value)
    settings.remove(key)
    return None


def flag(settings: QSettings, key: str, default: bool) -> bool:
    value = settings.value(key, default)
    if isinstance(value, bool):
        return value
    if value in ("true", "1", 1):
        return True
    if value in ("false", "0", 0):
        return False
    settings.remove(key)  # neither true nor false: damaged
    return default


def last_conversation(settings: QSettings) -> int | None:
    value = settings.value(LAST_CONVERSATION, -1)
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        settings.remove(LAST_CONVERSATION)
        return None
    return number if 0 <= number < 2**63 else None  # SQLite's ids are 64-bit
