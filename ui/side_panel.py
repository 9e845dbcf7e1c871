"""The right-hand panel's frame; its content is ui.panel.draft_panel.DraftPanel."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget


class SidePanelHost(QFrame):
    """A header ("Draft activity") over an empty vertical layout, `content`, for the panel's widgets."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sidePanel")
        # No fixed minimum width: the content's own minimum (the panel wraps and scrolls down to
        # it) is the host's, so the content is never cut off at the right edge; a fixed one set
        # here once overrode the content's and clipped it.
        self.title = QLabel("Draft activity")
        self.title.setObjectName("sidePanelTitle")
        self.title.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 12, 12, 12)
        outer.setSpacing(8)
        outer.addWidget(self.title)
        self.content = QVBoxLayout()
        self.content.setSpacing(8)
        # The content takes the height; with nothing in it yet, the stretch keeps the title on top.
        outer.addLayout(self.content, 100)
        outer.addStretch(1)
