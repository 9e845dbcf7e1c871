"""The header above the chat: the two model slots of the pair and the toggles for the drawers.

The slots show what is loaded now; issue 7 makes them drop targets for pairing models.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.runner import DRAFT_LOOKUP, DRAFT_NONE, LoadedModel


class ElidedLabel(QLabel):
    """One line that ends in "…" when the header is narrow, instead of widening the window."""

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self.fontMetrics().averageCharWidth() * 8, super().minimumSizeHint().height())

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), text)


class ModelSlot(QFrame):
    """One side of the pair: a small caption ("Target", "Draft"), the model's name and a detail line."""

    def __init__(self, caption: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("modelSlot")
        self.caption = QLabel(caption.upper())
        self.caption.setObjectName("slotTitle")
        self.name = ElidedLabel("—")
        self.name.setObjectName("slotName")
        self.detail = ElidedLabel("")
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
        self.name.setText(title)
        self.detail.setText(detail)
        self.detail.setVisible(bool(detail))
        self.setToolTip(f"{title}\n{detail}" if detail else title)


def target_text(info: LoadedModel) -> tuple[str, str]:
    from app.models.resolve import display_name

    return display_name(info.folder), f"{info.model_type} · {info.dtype} · {info.backend}/{info.device}"


def draft_text(info: LoadedModel) -> tuple[str, str]:
    if info.draft == DRAFT_LOOKUP:
        return "prompt lookup", "n-grams from the chat, no model"
    if info.draft == DRAFT_NONE:
        return "none", "the target decodes alone"
    if info.draft.startswith("self-draft "):  # e.g. "self-draft int4 (g32, float32 head)"
        return "self-draft", f"the target's weights at {info.draft.removeprefix('self-draft ')}"
    return info.draft, "draft model"


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
        self.settings_button = QToolButton()
        self.side_panel_button = QToolButton()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(8)
        layout.addWidget(self.target_slot)
        layout.addWidget(plus)
        layout.addWidget(self.draft_slot)
        layout.addStretch(1)
        layout.addWidget(self.settings_button)
        layout.addWidget(self.side_panel_button)

    def show_loaded(self, info: LoadedModel) -> None:
        self.target_slot.set_model(*target_text(info))
        self.draft_slot.set_model(*draft_text(info))

    def show_loading(self, what: str) -> None:
        self.target_slot.set_model("Loading…", what)

    def show_load_failed(self) -> None:
        self.target_slot.set_model("No model loaded", "see the message in the chat")
