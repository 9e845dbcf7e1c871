"""A minimal Tandem window: one conversation with the loaded model, streamed without freezing.
(The full chat window, side panel and pairing build on this.)"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QThread, Signal
from PySide6.QtGui import QFont, QKeyEvent, QTextCursor
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QMainWindow, QPlainTextEdit, QPushButton,
                               QTextBrowser, QVBoxLayout, QWidget)

from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from app.runner import ChatRequest, LoadedModel
from ui.worker import EngineWorker

GREETING = "Say hello to Tandem. Type a message and press Enter."


class MainWindow(QMainWindow):
    request_load = Signal(str, str)
    request_generate = Signal(object)

    def __init__(self, model: str = "demo", backend: str = "", max_tokens: int = 256):
        super().__init__()
        self.setWindowTitle("Tandem")
        self.resize(900, 640)
        self.max_tokens = max_tokens
        self.messages: list[dict] = []
        self._answer = ""
        self._busy = False

        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(True)
        self.transcript.setPlaceholderText(GREETING)
        self.composer = QPlainTextEdit()
        self.composer.setPlaceholderText("Message Tandem  (Enter to send, Shift+Enter for a new line)")
        self.composer.setFixedHeight(80)
        self.composer.installEventFilter(self)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setEnabled(False)
        self.model_label = QLabel("Loading the model ...")

        row = QHBoxLayout()
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addLayout(buttons)
        column = QVBoxLayout()
        column.addWidget(self.transcript, 1)
        column.addLayout(row)
        central = QWidget()
        central.setLayout(column)
        self.setCentralWidget(central)
        self.statusBar().addPermanentWidget(self.model_label)
        base = self.font()
        self.transcript.setFont(QFont(base.family(), base.pointSize() + 1))

        self.thread = QThread(self)
        self.thread.setObjectName("tandem-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.request_load.connect(self.worker.load)
        self.request_generate.connect(self.worker.generate)
        self.worker.progress.connect(self.statusBar().showMessage)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.load_failed.connect(self._on_load_failed)
        self.worker.text.connect(self._on_text)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.thread.start()
        self.send_button.setEnabled(False)
        self.request_load.emit(model, backend)

    # --- composer -------------------------------------------------------------------------
    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.composer and event.type() == QEvent.Type.KeyPress:
            key = QKeyEvent(event)
            if key.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                key.modifiers() & Qt.KeyboardModifier.ShiftModifier
            ):
                self.send()
                return True
            if key.key() == Qt.Key.Key_Escape:
                self.stop()
                return True
        return super().eventFilter(obj, event)

    def send(self) -> None:
        text = self.composer.toPlainText().strip()
        if not text or self._busy or not self.send_button.isEnabled():
            return
        self.composer.clear()
        self.messages.append({"role": "user", "content": text})
        self._append_block("You", text)
        self._append_block("Tandem", "")
        self._answer = ""
        self._set_busy(True)
        request = ChatRequest(tuple(self.messages), max_tokens=self.max_tokens,
                              params=SamplingParams())
        self.request_generate.emit(request)

    def stop(self) -> None:
        if self._busy:
            self.worker.stop()

    # --- worker signals -------------------------------------------------------------------
    def _on_loaded(self, info: LoadedModel) -> None:
        self.model_label.setText(f"{info.describe()}  ·  loaded in {info.load_s:.1f}s")
        self.statusBar().showMessage("Ready", 3000)
        self.send_button.setEnabled(True)

    def _on_load_failed(self, message: str) -> None:
        self.model_label.setText("No model loaded")
        self.transcript.append(f"<p style='color:#c0392b'><b>Could not load the model.</b> "
                               f"{_escape(message)}</p>")

    def _on_text(self, delta: str) -> None:
        self._answer += delta
        cursor = self.transcript.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(delta)
        self.transcript.setTextCursor(cursor)
        self.transcript.ensureCursorVisible()

    def _on_finished(self, event: Finished) -> None:
        self.messages.append({"role": "assistant", "content": event.text})
        stats = event.stats
        self.statusBar().showMessage(f"{stats.tokens} tokens · {stats.tokens_per_s:.1f} tok/s · "
                                     f"{stats.tokens_per_round:.2f} tokens per target pass")
        self._set_busy(False)

    def _on_failed(self, message: str) -> None:
        self.transcript.append(f"<p style='color:#c0392b'>{_escape(message)}</p>")
        self._set_busy(False)

    # --- helpers --------------------------------------------------------------------------
    def _append_block(self, who: str, text: str) -> None:
        self.transcript.append(f"<p><b>{who}</b></p>")
        if text:
            self.transcript.append(_escape(text))
        else:
            self.transcript.append("")

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(not busy)

    def shutdown(self) -> None:
        """Quitting mid-answer: stop after the current round, then let the thread finish."""
        self.worker.stop()
        self.thread.quit()
        self.thread.wait(30_000)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.shutdown()
        super().closeEvent(event)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>")
