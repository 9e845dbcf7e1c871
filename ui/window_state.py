"""What the window remembers between runs (QSettings): size and position, splitter positions,
which panels are open, and the chat that was open."""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMainWindow, QSplitter

GEOMETRY, SPLITTER = "window/geometry", "window/splitter"
SIDE_PANEL, SETTINGS_DRAWER = "window/side_panel", "window/settings_drawer"
LAST_CONVERSATION = "chat/last_conversation"


def save(settings: QSettings, window: QMainWindow, splitter: QSplitter, *, side_panel: bool,
         drawer: bool, conversation_id: int | None) -> None:
    settings.setValue(GEOMETRY, window.saveGeometry())
    settings.setValue(SPLITTER, splitter.saveState())
    settings.setValue(SIDE_PANEL, side_panel)
    settings.setValue(SETTINGS_DRAWER, drawer)
    settings.setValue(LAST_CONVERSATION, conversation_id if conversation_id is not None else -1)
    settings.sync()


def restore_layout(settings: QSettings, window: QMainWindow, splitter: QSplitter) -> bool:
    """Geometry and splitter; False when there was nothing to restore (the first start)."""
    geometry, state = settings.value(GEOMETRY), settings.value(SPLITTER)
    if geometry is not None:
        window.restoreGeometry(geometry)
    if state is not None:
        splitter.restoreState(state)
    return geometry is not None


def flag(settings: QSettings, key: str, default: bool) -> bool:
    value = settings.value(key, default)
    return value in (True, "true", "1", 1) if not isinstance(value, bool) else value


def last_conversation(settings: QSettings) -> int | None:
    try:
        value = int(settings.value(LAST_CONVERSATION, -1))
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None
