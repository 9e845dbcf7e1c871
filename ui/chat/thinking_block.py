"""A reasoning model's thinking, folded above its answer: one line ("Thinking…" while it streams,
"Thought for N words" after) that opens to the whole text."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QToolButton, QVBoxLayout


class ThinkingBlock(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        self._text = ""
        self._done = False
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolTip("What the model thought before answering: click to open or fold it")
        self.toggle.toggled.connect(self._unfold)
        self.body = QLabel()
        self.body.setObjectName("thinkingText")
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.body.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.body)
        self.hide()

    @property
    def text(self) -> str:
        return self._text

    def set_text(self, text: str, done: bool) -> None:
        self._text, self._done = text, done
        self._update()

    def stream(self, delta: str) -> None:
        self._text += delta
        self._update()

    def _update(self) -> None:
        shown = self._text.strip()
        self.setVisible(bool(shown))
        words = len(shown.split())
        noun = "word" if words == 1 else "words"
        self.toggle.setText(f"Thought for {words:,} {noun}" if self._done else f"Thinking… ({words:,} {noun})")
        if self.body.isVisible():
            self.body.setText(shown)

    def _unfold(self, open_: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        self.body.setVisible(open_)
        if open_:
            self.body.setText(self._text.strip())
