"""The status bar: the loaded pair, backend and device, memory in use, the last answer's speed."""

from __future__ import annotations

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine.events import GenerationStats
from app.runner import LoadedModel
from ui.header import draft_text

MEMORY_REFRESH_MS = 2000


class StatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.loading = QProgressBar()  # indeterminate: loading reports steps, not fractions
        self.loading.setRange(0, 0)
        self.loading.setMaximumWidth(self.fontMetrics().averageCharWidth() * 16)
        self.loading.setTextVisible(False)
        self.loading.hide()
        self.pair = QLabel("No model loaded")
        self.device = QLabel("")
        self.last_answer = QLabel("")
        self.memory = QLabel("")
        self.memory.setToolTip("Memory this process uses (resident set), models included")
        self.last_answer.setToolTip("The last answer: decode speed and how many draft tokens the target accepted")
        for label in (self.pair, self.device):
            label.setMinimumWidth(label.fontMetrics().averageCharWidth() * 6)  # clipped, never widening the window
        self.addWidget(self.loading)
        for label in (self.pair, self.device, self.last_answer, self.memory):
            self.addPermanentWidget(label)
        self._process = psutil.Process()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh_memory)
        self._timer.start(MEMORY_REFRESH_MS)
        self.refresh_memory()

    def show_loading(self, message: str) -> None:
        self.loading.show()
        self.showMessage(message)

    def show_loaded(self, info: LoadedModel) -> None:
        from app.models.resolve import display_name

        self.loading.hide()
        self.showMessage(f"Loaded in {info.load_s:.1f}s", 5000)
        self.pair.setText(f"{display_name(info.folder)} + {draft_text(info)[0]}")
        self.device.setText(f"{info.backend} · {info.device} · {info.dtype}")

    def show_load_failed(self) -> None:
        self.loading.hide()
        self.clearMessage()
        self.pair.setText("No model loaded")
        self.device.setText("")

    def show_stats(self, stats: GenerationStats) -> None:
        text = f"{stats.tokens_per_s:.1f} tok/s"
        if stats.drafted:
            text += f" · {stats.acceptance_rate:.0%} accepted"
        self.last_answer.setText(text)

    def refresh_memory(self) -> None:
        try:
            rss = self._process.memory_info().rss
        except psutil.Error:
            return
        self.memory.setText(f"{rss / 2**30:.2f} GB" if rss >= 2**30 else f"{rss / 2**20:.0f} MB")
