"""Where the user writes: Enter sends, Shift+Enter starts a new line. While an answer is being
written the text box stays editable for the next message; only sending waits."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

MIN_LINES, MAX_LINES = 2, 10


class ComposerEdit(QPlainTextEdit):
    submitted = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self._fit_height)
        self._fit_height()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    def _fit_height(self) -> None:
        # Grows with the text from MIN_LINES to MAX_LINES, then scrolls; measured in lines of the
        # current font, so it scales with the system's text size.
        lines = max(MIN_LINES, min(MAX_LINES, self.document().lineCount() or 1))
        margins = self.contentsMargins()
        height = lines * self.fontMetrics().lineSpacing() + 2 * self.document().documentMargin()
        self.setFixedHeight(int(height + margins.top() + margins.bottom()))


class Composer(QFrame):
    send_requested = Signal(str)  # the text, stripped; the composer clears itself once it is taken
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("composer")
        self._busy = False
        self._ready = False
        self._loading = False  # a pair is loading: a message is taken and sent once it is in
        self.queued: str | None = None  # the message waiting for the model
        self.editing = False  # the text replaces the last message of yours when sent
        self.edit = ComposerEdit()
        self.edit.setPlaceholderText("Message Tandem  (Enter to send, Shift+Enter for a new line)")
        self.edit.submitted.connect(self.submit)
        self.editing_label = QLabel("Editing your message: Enter sends a new version, Esc cancels.")
        self.editing_label.setObjectName("editingLabel")
        self.editing_label.hide()
        self.queued_label = QLabel("Waiting for the model to load: your message is sent as soon as it is ready.")
        self.queued_label.setObjectName("editingLabel")
        self.queued_label.setWordWrap(True)
        self.queued_label.hide()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primaryButton")
        self.send_button.setToolTip("Send (Enter)")
        self.send_button.clicked.connect(self.submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the answer after the current round (Esc); what was written is kept")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        row = QHBoxLayout()
        row.setSpacing(8)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        layout.setSpacing(4)
        layout.addWidget(self.editing_label)
        layout.addWidget(self.queued_label)
        layout.addLayout(row)
        self._refresh()

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)

    def submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or not self.takes_message():
            return
        self.send_requested.emit(text)

    def accept_sent(self) -> None:
        """The window took the text: clear it and leave edit mode."""
        self.edit.clear()
        self.set_editing(False)

    def can_send(self) -> bool:
        """Whether a message is sent now: a pair is loaded and nothing is being written."""
        return self._ready and not self._busy and self.queued is None

    def takes_message(self) -> bool:
        """Whether Send takes a message: sent now, or queued while a pair loads."""
        return (self._ready or self._loading) and not self._busy and self.queued is None

    def set_ready(self, ready: bool) -> None:
        self._ready = ready
        self._refresh()

    def set_loading(self, loading: bool) -> None:
        self._loading = loading
        self._refresh()

    def set_queued(self, text: str | None) -> None:
        """A message taken while the pair loads (its text stays in the box, read-only, until it
        is sent), or None: nothing waits any more."""
        self.queued = text
        self.edit.setReadOnly(text is not None)
        self.queued_label.setVisible(text is not None)
        self._refresh()

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self._refresh()

    def begin_edit(self, text: str) -> None:
        self.set_text(text)
        self.set_editing(True)
        self.edit.setFocus()
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def set_editing(self, editing: bool) -> None:
        self.editing = editing
        self.editing_label.setVisible(editing)
        self._refresh()

    def cancel_edit(self) -> None:
        if self.editing:
            self.edit.clear()
            self.set_editing(False)

    def _refresh(self) -> None:
        self.send_button.setVisible(not self._busy)
        self.stop_button.setVisible(self._busy)
        self.send_button.setEnabled(self.takes_message())
        waiting = self._loading  # a message sent now waits for the pair loading (the first or another)
        self.send_button.setText("Queued" if self.queued is not None else "Send when loaded" if waiting
                                 else "Resend" if self.editing else "Send")
