"""Banners across the top of the chat: messages the user must see but need not answer now
(a history moved aside, a history kept in memory only). Never modal, so nothing waits on them."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget


class Banner(QFrame):
    def __init__(self, text: str, kind: str = "warning", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setProperty("kind", kind)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("Dismiss")
        close.setObjectName("messageAction")
        close.clicked.connect(self.deleteLater)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 8, 10, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(close)


class BannerStack(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)

    def add(self, text: str, kind: str = "warning") -> Banner:
        banner = Banner(text, kind)
        self._layout.addWidget(banner)
        return banner

    def texts(self) -> list[str]:
        return [banner.label.text() for banner in self.findChildren(Banner)]
