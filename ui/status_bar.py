"""The status bar: the loaded pair, where it runs, memory in use, the last answer's speed."""

from __future__ import annotations

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine.events import GenerationStats
from app.draft_choice import DraftKind
from app.runner import LoadedModel
from ui.tips import wrap_tip

MEMORY_REFRESH_MS = 2000
# Qt draws a message from 6 px in to 2 px before the first permanent field (QStatusBar's
# messageRect) and lays the fields 6 px apart; a few pixels more so a last letter is never cut
MESSAGE_MARGINS_PX, FIELD_SPACING_PX, SLACK_PX = 6 + 2 + 12, 6, 4
LIBRARIES = {"torch": "PyTorch", "mlx": "MLX"}


def where_words(backend: str, device: str) -> str:
    """"on the CPU with PyTorch": where the pair runs, in a user's words (the tooltip keeps the
    backend's own names)."""
    library = LIBRARIES.get(backend, backend)
    if backend == "remote":  # device: the server's origin
        return f"on the server {device}"
    if backend == "mlx":
        return f"on the Mac's GPU with {library}"
    if device.startswith("cuda"):
        return f"on the NVIDIA GPU with {library}"
    if device == "mps":
        return f"on the Mac's GPU with {library}"
    return f"on the CPU with {library}" if device == "cpu" else f"on {device} with {library}"


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
        self.kept = QLabel("")  # other chats whose caches are kept, so going back to one starts fast
        self.kept.setToolTip(wrap_tip("Going back to one of these chats reads only its new message: their caches "
                                      "are kept within this memory budget, the least recently used going first"))
        self.kept.hide()
        self.memory.setToolTip("Memory this process uses (resident set), models included")
        self.last_answer.setToolTip(wrap_tip("The last answer of this chat: decode speed and how many draft tokens "
                                             "the target accepted"))
        for label in (self.pair, self.device):
            label.setMinimumWidth(label.fontMetrics().averageCharWidth() * 6)  # clipped, never widening the window
        # all permanent: a message (loading steps, "Copied …") hides normal widgets, or is drawn under them
        self._permanent = (self.loading, self.pair, self.device, self.last_answer, self.kept, self.memory)
        for widget in self._permanent:
            self.addPermanentWidget(widget)
        # A message is drawn only left of the permanent fields, and was cut by them ("Saved the
        # answer to the history; thi"): while one is shown, fields step aside for it, the least
        # needed first. The memory figure and the loading bar stay.
        self._yielding = (self.device, self.kept, self.last_answer, self.pair)
        self.messageChanged.connect(self._fit_message)
        self.loaded: LoadedModel | None = None
        self._process = psutil.Process()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh_memory)
        self._timer.start(MEMORY_REFRESH_MS)
        self.refresh_memory()

    def show_loading(self, message: str) -> None:
        """A loading step. The pair in use (if any) stays named: it answers until the new one is in."""
        self.loading.show()
        self.showMessage(message)
        if self.loaded is None:
            self.pair.setText("Loading …")
            self.pair.setToolTip(wrap_tip(message))
            self._fit_message()

    def show_loaded(self, info: LoadedModel) -> None:
        self.loaded = info
        self.show_kept("")  # a new pair keeps nothing of the old one
        self.loading.hide()
        self.showMessage(f"Loaded in {info.load_s:.1f}s", 5000)
        draft, detail = info.draft_words()
        self.pair.setText(f"{info.name} · draft: {draft}")
        self.pair.setToolTip(wrap_tip(f"Target: {info.folder}\nDraft: {draft} ({detail})"))
        note = f" ({info.device_note})" if info.device_note else ""
        self.device.setText(f"{where_words(info.backend, info.device)}{note} · {info.dtype.split(' (')[0]}")
        self.device.setToolTip(f"backend {info.backend}, device {info.device}, weights {info.dtype}")
        self._fit_message()

    def show_load_failed(self) -> None:
        self.loaded = None
        self.loading.hide()
        self.clearMessage()
        self.pair.setText("No model loaded")
        self.pair.setToolTip("")
        self.device.setText("")
        self._fit_message()

    def show_stats(self, stats: GenerationStats) -> None:
        self.show_record({"tokens_per_s": stats.tokens_per_s, "drafted": stats.drafted,
                          "acceptance": stats.acceptance_rate})

    def show_record(self, stats: dict | None) -> None:
        """An answer's figures as stored with it (ui/chat/controller.stats_record), or none: a chat
        without an answer shows no figures, never another chat's."""
        stats = stats or {}
        speed = stats.get("tokens_per_s")
        text = ""
        if isinstance(speed, (int, float)):
            text = f"{speed:.1f} tok/s"
            acceptance = stats.get("acceptance")
            if stats.get("drafted") and isinstance(acceptance, (int, float)):
                text += f" · {acceptance:.0%} accepted"
        self.last_answer.setText(text)
        self._fit_message()

    def show_kept(self, words: str) -> None:
        self.kept.setText(words)
        self._fit_message()

    def _fit_message(self, *_args) -> None:
        """Each field with something to say is shown, unless the message needs its room."""
        message = self.currentMessage()
        need = self.fontMetrics().horizontalAdvance(message) + SLACK_PX if message else 0
        fields = [label for label in self._yielding if label.text()]
        staying = [w for w in (self.loading, self.memory) if w.isVisibleTo(self)]
        while message and fields and need > self._message_room(staying + fields):
            fields.pop(0)  # the least needed gives way first
        for label in self._yielding:
            label.setVisible(label in fields)
        cut = bool(message) and need > self._message_room(staying + fields)
        self.setToolTip(wrap_tip(message) if cut else "")  # still cut: whole in the tooltip

    def _message_room(self, shown: list[QWidget]) -> int:
        """The width a message has left of these permanent fields (at the widths they ask for)."""
        return self.width() - MESSAGE_MARGINS_PX - sum(w.sizeHint().width() + FIELD_SPACING_PX for w in shown)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_message()

    def refresh_memory(self) -> None:
        try:
            rss = self._process.memory_info().rss
        except psutil.Error:
            return
        self.memory.setText(f"{rss / 2**30:.2f} GB" if rss >= 2**30 else f"{rss / 2**20:.0f} MB")


def ready_words(info: LoadedModel) -> str:
    """The greeting once a pair is in: what answers, where, and what drafts for it."""
    drafting = {DraftKind.NONE: "decodes alone, without a draft",
                DraftKind.LOOKUP: "drafts by copying from the chat (prompt lookup)"}.get(
        info.draft.kind, f"drafts with {info.draft_words()[0]}")
    if info.remote:
        drafting = f"speculates as the server was started ({info.remote_shows})"
    return f"{info.name} is ready {where_words(info.backend, info.device)} and {drafting}."
