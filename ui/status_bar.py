"""The status bar: the loaded pair, where it runs, memory in use, the last answer's speed."""

from __future__ import annotations

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.engine.events import GenerationStats
from app.draft_choice import DraftKind
from app.models.resolve import display_name
from app.runner import LoadedModel
from ui.tips import wrap_tip

MEMORY_REFRESH_MS = 2000
LIBRARIES = {"torch": "PyTorch", "mlx": "MLX"}


def where_words(backend: str, device: str) -> str:
    """"on the CPU with PyTorch": where the pair runs, in a user's words (the tooltip keeps the
    backend's own names)."""
    library = LIBRARIES.get(backend, backend)
    if backend == "mlx":
        return f"on the Mac's GPU with {library}"
    if device.startswith("cuda"):
        return f"on the NVIDIA GPU with {library}"
    if device == "mps":
        return f"on the Mac's GPU with {library}"
    return f"on the CPU with {library}" if device == "cpu" else f"on {device} with {library}"


def loading_words(message: str, target: str, draft: str) -> str:
    """A loading step in a user's words. The runner names folders ("Loading hf on torch ..."); the
    window knows what the user asked for (`target`, `draft`: labels), so its steps name those.
    Its other steps (downloading the demo, converting a GGUF, making room) already speak plainly."""
    if message.startswith("Loading draft "):
        return f"Loading the draft, {draft} …"
    if message.startswith("Loading "):
        return f"Loading {target} …"
    return message.replace(" ...", " …")


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
        for widget in (self.loading, self.pair, self.device, self.last_answer, self.kept, self.memory):
            self.addPermanentWidget(widget)
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

    def show_loaded(self, info: LoadedModel) -> None:
        self.loaded = info
        self.show_kept("")  # a new pair keeps nothing of the old one
        self.loading.hide()
        self.showMessage(f"Loaded in {info.load_s:.1f}s", 5000)
        draft, detail = info.draft_words()
        self.pair.setText(f"{display_name(info.folder)} · draft: {draft}")
        self.pair.setToolTip(wrap_tip(f"Target: {info.folder}\nDraft: {draft} ({detail})"))
        note = f" ({info.device_note})" if info.device_note else ""
        self.device.setText(f"{where_words(info.backend, info.device)}{note} · {info.dtype.split(' (')[0]}")
        self.device.setToolTip(f"backend {info.backend}, device {info.device}, weights {info.dtype}")

    def show_load_failed(self) -> None:
        self.loaded = None
        self.loading.hide()
        self.clearMessage()
        self.pair.setText("No model loaded")
        self.pair.setToolTip("")
        self.device.setText("")

    def show_stats(self, stats: GenerationStats) -> None:
        self.show_record({"tokens_per_s": stats.tokens_per_s, "drafted": stats.drafted,
                          "acceptance": stats.acceptance_rate})

    def show_record(self, stats: dict | None) -> None:
        """An answer's figures as stored with it (ui/chat/controller.stats_record), or none: a chat
        without an answer shows no figures, never another chat's."""
        stats = stats or {}
        speed = stats.get("tokens_per_s")
        if not isinstance(speed, (int, float)):
            self.last_answer.setText("")
            return
        text = f"{speed:.1f} tok/s"
        acceptance = stats.get("acceptance")
        if stats.get("drafted") and isinstance(acceptance, (int, float)):
            text += f" · {acceptance:.0%} accepted"
        self.last_answer.setText(text)

    def show_kept(self, words: str) -> None:
        self.kept.setText(words)
        self.kept.setVisible(bool(words))

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
    return f"{display_name(info.folder)} is ready {where_words(info.backend, info.device)} and {drafting}."
