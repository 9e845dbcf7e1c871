"""What the window remembers between runs (QSettings): size and position, splitter positions,
which panels are open, and the chat that was open.

Every value read back is checked: the file is plain text a person (or a crash) can damage, and
a value of the wrong type (`geometry=hello`) once aborted every start. A bad value is removed
and the default used, never fatal."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

from app.paths import settings_file

GEOMETRY, SPLITTER = "window/geometry", "window/splitter"
SIDE_PANEL, SETTINGS_DRAWER = "window/side_panel", "window/settings_drawer"
THEME = "view/theme"  # "system", "light" or "dark" (ui/theme.py)
LAST_CONVERSATION = "chat/last_conversation"


def open_settings() -> QSettings:
    """Tandem.conf under TANDEM_HOME when it is set (tests, portable installs), else where
    QSettings keeps an app's settings on this platform."""
    path = settings_file()
    if path is None:
        return QSettings()
    return QSettings(str(path), QSettings.Format.IniFormat)


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
