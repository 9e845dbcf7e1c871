"""The header above the chat: the two model slots of the pair and the toggles for the drawers.

Each slot shows what is loaded and is a drop target: a model folder, a .gguf file or a Hugging
Face link dropped on it pairs that model in (ui/pairing/controller.py decides what happens).
A click opens its menu: files, the hub, the catalog, recent pairs.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.runner import LoadedModel


class ElidedLabel(QLabel):
    """One line that ends in "…" when the header is narrow, instead of widening the window. It
    never narrows below `min_chars` characters: enough to tell models apart ("smollm2-135m-…",
    not "smoll…"); the slot's tooltip has the whole name."""

    def __init__(self, text: str = "", min_chars: int = 8):
        super().__init__(text)
        self.min_chars = min_chars

    def elide_mode(self) -> Qt.TextElideMode:
        return Qt.TextElideMode.ElideRight  # a model's name says the most at its start

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        # the same whatever the text, so the window's minimum size does not change with the model
        width = self.fontMetrics().horizontalAdvance("x" * self.min_chars + "…")
        margins = self.contentsMargins()
        return QSize(width + margins.left() + margins.right() + 1, super().minimumSizeHint().height())

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), self.elide_mode(), rect.width())
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), text)


class CompactToolButton(QToolButton):
    """A tool button that shows a shorter label when the header is too narrow for its action's
    text (the tooltip keeps the whole one), so a small window keeps room for the model names."""

    def __init__(self, short: str):
        super().__init__()
        self.short = short
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def _width_for(self, text: str) -> int:
        current = self.text() or ""
        metrics = self.fontMetrics()
        return super().sizeHint().width() - metrics.horizontalAdvance(current) + metrics.horizontalAdvance(text)

    def _full(self) -> str:
        action = self.defaultAction()
        return action.text() if action is not None else self.text()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self._width_for(self._full()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self._width_for(self.short), super().minimumSizeHint().height())

    def _apply_text(self) -> None:
        text = self.short if self.width() < self.sizeHint().width() else self._full()
        if text != self.text():
            self.setText(text)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._apply_text()

    def actionEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().actionEvent(event)  # a changed default action puts its full text back
        self._apply_text()


class ModelSlot(QFrame):
    """One side of the pair: a small caption ("Target", "Draft"), the model's name and a detail
    line. While something is dragged over it, it says whether that looks like a model."""

    dropped = Signal(str, list)  # role, the texts dropped (paths, URLs, repo ids)
    clicked = Signal(str)  # role: the window shows the slot's menu

    def __init__(self, caption: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("modelSlot")
        self.role = caption.lower()
        self.setAcceptDrops(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self._shown = ("—", "")
        self.caption_text = caption.upper()
        self.caption = QLabel(caption.upper())
        self.caption.setObjectName("slotTitle")
        self.name = ElidedLabel("—", min_chars=12)
        self.name.setObjectName("slotName")
        self.detail = ElidedLabel("", min_chars=8)
        self.detail.setObjectName("slotDetail")
        small = self.caption.font()
        small.setPointSizeF(small.pointSizeF() * 0.8)
        small.setLetterSpacing(small.SpacingType.PercentageSpacing, 108)
        self.caption.setFont(small)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 5, 12, 6)
        layout.setSpacing(0)
        layout.addWidget(self.caption)
        layout.addWidget(self.name)
        layout.addWidget(self.detail)

    def set_model(self, title: str, detail: str = "") -> None:
        self._shown = (title, detail)
        self.name.setText(title)
        self.detail.setText(detail)
        self.detail.setVisible(bool(detail))
        hint = f"Drop a model folder, .gguf file or Hugging Face link here, or click to choose the {self.role}."
        self.setToolTip("\n".join(part for part in (title, detail, hint) if part))

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit(self.role)
        super().mousePressEvent(event)

    # Drag and drop: the drop is always taken, so a wrong file gets its message instead of a
    # silent "no entry" cursor; the slot's colour says beforehand what will happen.

    def _set_drop_state(self, state: str) -> None:
        self.setProperty("dropState", state)
        self.style().unpolish(self)
        self.style().polish(self)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        from app.models.sources import drag_verdict
        from ui.pairing.drop import mime_texts

        texts = mime_texts(event.mimeData())
        if not texts:
            event.ignore()
            return
        verdict = drag_verdict(texts[0], self.role)
        self._set_drop_state("reject" if verdict else "accept")
        self.caption.setText(f"DROP TO USE AS {self.caption_text}")
        self.name.setText(_short(texts[0]))
        self.detail.setText(verdict or "release to check and load it")
        self.detail.setVisible(True)
        event.acceptProposedAction()

    def dragLeaveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._end_drag()
        super().dragLeaveEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        from ui.pairing.drop import mime_texts

        texts = mime_texts(event.mimeData())
        self._end_drag()
        event.acceptProposedAction()
        if texts:
            self.dropped.emit(self.role, texts)

    def _end_drag(self) -> None:
        self._set_drop_state("")
        self.caption.setText(self.caption_text)
        self.set_model(*self._shown)


def _short(text: str) -> str:
    """A dropped path or link, shortened to what names it: the repo id, or the model's folder
    as the slot will name it once loaded."""
    from pathlib import Path

    from app.models.resolve import display_name

    text = text.rstrip("/\\")
    if "huggingface.co/" in text or "hf.co/" in text:
        return "/".join(text.split(".co/", 1)[1].split("/")[:2])
    return display_name(Path(text)) if text else text


def target_text(info: LoadedModel) -> tuple[str, str]:
    from app.models.resolve import display_name
    from ui.status_bar import where_words

    # "float32 · on the CPU with PyTorch": the words the status bar uses
    return display_name(info.folder), f"{info.dtype.split(' (')[0]} · {where_words(info.backend, info.device)}"


def draft_text(info: LoadedModel) -> tuple[str, str]:
    """("the same model in 4-bit", "the target's own weights at int4 (g32, float32 head)"): the
    words the status bar and the greeting use too (app/draft_choice.py)."""
    return info.draft_words()


class Header(QFrame):
    """Target and Draft slots on the left; the chat settings and side panel toggles on the right."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("header")
        self.target_slot = ModelSlot("Target")
        self.draft_slot = ModelSlot("Draft")
        self.target_slot.set_model("Loading…")
        self.draft_slot.set_model("—")
        plus = QLabel("+")
        plus.setObjectName("slotTitle")
        # The window gives these their actions (setDefaultAction), shared with the View menu.
        self.settings_button = CompactToolButton("Settings")
        self.side_panel_button = CompactToolButton("Activity")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(8)
        # the slots share the header's width (the draft's detail line holds the trial's result)
        layout.addWidget(self.target_slot, 2)
        layout.addWidget(plus)
        layout.addWidget(self.draft_slot, 3)
        layout.addWidget(self.settings_button)
        layout.addWidget(self.side_panel_button)

    def show_loaded(self, info: LoadedModel) -> None:
        self.target_slot.set_model(*target_text(info))
        self.draft_slot.set_model(*draft_text(info))

    def show_trial(self, text: str) -> None:
        """The pair trial's result (or progress) under the draft's name."""
        self.draft_slot.set_model(self.draft_slot._shown[0], text)

    def show_loading(self, what: str) -> None:
        self.target_slot.set_model("Loading…", what)

    def show_load_failed(self) -> None:
        self.target_slot.set_model("No model loaded", "see the message in the chat")
