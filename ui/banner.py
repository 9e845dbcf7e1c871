"""Banners across the top of the chat: messages the user must see but need not answer now
(a history moved aside, a history kept in memory only). Never modal, so nothing waits on them.

They never pile up: a banner has a topic (what it is about: "load", "pairing", "history"...), and a
new message on a topic replaces the older one, which is out of date; at most MAX_SHOWN are shown,
the oldest going first. Each has its own Dismiss button."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

MAX_SHOWN = 3  # more would push the chat itself off a small window


class Banner(QFrame):
    def __init__(self, text: str, kind: str = "warning", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("banner")
        self.setProperty("kind", kind)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QToolButton()
        self.close_button.setText("Dismiss")
        self.close_button.setToolTip("Hide this message")
        self.close_button.setObjectName("messageAction")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 8, 10, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.close_button)
        self.actions: list[QToolButton] = []

    def add_action(self, text: str, tip: str, callback, keep_open: bool = False) -> QToolButton:
        """A button before Dismiss that does what the message offers; the banner goes once it is
        used, unless `keep_open` (Open a file: the message still stands)."""
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setObjectName("messageAction")
        button.clicked.connect(callback)
        if not keep_open:
            button.clicked.connect(self.close_button.click)
        self.layout().insertWidget(self.layout().count() - 1, button)
        self.actions.append(button)
        return button


class BannerStack(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)
        self._shown: dict[str, Banner] = {}  # topic -> its banner, oldest first
        self.added = 0  # messages shown so far, replaced ones included (what a test waits on)

    def add(self, text: str, kind: str = "warning", topic: str | None = None) -> Banner:
        """Show `text`; it replaces the banner of the same `topic` (by default: the same text)."""
        topic = topic or f"{kind}:{text}"
        if topic in self._shown:
            self._remove(topic)
        while len(self._shown) >= MAX_SHOWN:
            self._remove(next(iter(self._shown)))
        banner = Banner(text, kind)
        banner.close_button.clicked.connect(lambda: self._remove(topic, banner))
        self._layout.addWidget(banner)
        self._shown[topic] = banner
        self.added += 1
        return banner

    def _remove(self, topic: str, banner: Banner | None = None) -> None:
        if banner is not None and self._shown.get(topic) is not banner:
            return  # already replaced
        banner = self._shown.pop(topic)
        self._layout.removeWidget(banner)
        banner.hide()
        banner.deleteLater()

    def remove(self, topic: str) -> None:
        """Take down the banner of `topic`, if one is shown (what it said is no longer so)."""
        if topic in self._shown:
            self._remove(topic)

    def get(self, topic: str) -> Banner | None:
        return self._shown.get(topic)

    def banners(self) -> list[Banner]:
        return list(self._shown.values())

    def texts(self) -> list[str]:
        return [banner.label.text() for banner in self._shown.values()]
