"""The header above the chat: the two model slots of the pair and the toggles for the drawers.

Each slot shows what is loaded and is a drop target: a model folder, a .gguf file or a Hugging
Face link dropped on it pairs that model in (ui/pairing/controller.py decides what happens).
A click opens its menu: files, the hub, the catalog, recent pairs.

The header sits over the chat column only, so it is narrow even in a wide window. Space goes to
what names the pair: the slots take the width their text asks for, the toggles go to their short
labels first, a detail line falls back to shorter words (the pair trial keeps its range), and
only then is text cut with "…"; each slot's tooltip has all of it.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from app.runner import LoadedModel


class ElidedLabel(QLabel):
    """One line that ends in "…" when the header is narrow, instead of widening the window. It
    never narrows below `min_chars` characters: enough to tell models apart ("smollm2-135m-…",
    not "smoll…"); the slot's tooltip has the whole name. Given `short` words too, it shows those
    where the whole text does not fit, before it cuts anything."""

    def __init__(self, text: str = "", min_chars: int = 8):
        super().__init__(text)
        self.min_chars = min_chars
        self.short = ""

    def set_text(self, text: str, short: str = "") -> None:
        self.short = short
        self.setText(text)

    def elide_mode(self) -> Qt.TextElideMode:
        return Qt.TextElideMode.ElideRight  # a model's name says the most at its start

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        # the same whatever the text, so the window's minimum size does not change with the model
        width = self.fontMetrics().horizontalAdvance("x" * self.min_chars + "…")
        margins = self.contentsMargins()
        return QSize(width + margins.left() + margins.right() + 1, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """What fits the label's width: the whole text, else the short words, else one of them cut."""
        width = self.contentsRect().width()
        metrics = self.fontMetrics()
        for text in (self.text(), self.short):
            if text and metrics.horizontalAdvance(text) <= width:
                return text
        return metrics.elidedText(self.short or self.text(), self.elide_mode(), width)

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                         self.shown_text())


MODEST_CHARS = 30  # the most room a load's changing step asks for (the rest is elided; the status line has it whole)


class CompactToolButton(QToolButton):
    """A tool button that shows a shorter label when the header is too narrow for its action's
    text (the tooltip keeps the whole one), so a small window keeps room for the model names."""

    def __init__(self, short: str):
        super().__init__()
        self.short = short
        self.compact = False  # the header wants the room for the model slots: the short label
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def _width_for(self, text: str) -> int:
        current = self.text() or ""
        metrics = self.fontMetrics()
        return super().sizeHint().width() - metrics.horizontalAdvance(current) + metrics.horizontalAdvance(text)

    def _full(self) -> str:
        action = self.defaultAction()
        return action.text() if action is not None else self.text()

    def full_width(self) -> int:
        return self._width_for(self._full())

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self._width_for(self.short) if self.compact else self.full_width(), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self._width_for(self.short), super().minimumSizeHint().height())

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self.updateGeometry()
            self._apply_text()

    def _apply_text(self) -> None:
        text = self.short if self.compact or self.width() < self.full_width() else self._full()
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
        self._shown = ("—", "", "")
        self._modest = False  # see set_model
        self.wanted: int | None = None  # the width the header gives it (Header._fit); None: its text's
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
        layout.setContentsMargins(8, 5, 8, 6)
        layout.setSpacing(0)
        layout.addWidget(self.caption)
        layout.addWidget(self.name)
        layout.addWidget(self.detail)

    def set_model(self, title: str, detail: str = "", short_detail: str = "", modest: bool = False) -> None:
        """`short_detail`: fewer words for the detail line, shown where the whole line does not fit.
        `modest`: the detail changes often (a load's steps) and asks for no more room than a short
        line's, so the header does not share its width out anew, and relabel its buttons, each step."""
        self._shown = (title, detail, short_detail)
        self._modest = modest
        self.name.setText(title)
        self.detail.set_text(detail, short_detail)
        self.detail.setVisible(bool(detail))
        hint = f"Drop a model folder, .gguf file or Hugging Face link here, or click to choose the {self.role}."
        self.setToolTip("\n".join(part for part in (title, detail, hint) if part))
        self.updateGeometry()  # the header shares its width out again (Header._fit)

    def widths(self) -> tuple[int, int]:
        """(short, whole): the width that shows the name whole and the detail in its fewer words,
        and the width that shows everything whole."""
        margins = self.layout().contentsMargins()
        extra = margins.left() + margins.right() + 1
        metrics = self.detail.fontMetrics()
        detail = self.detail.text() if self.detail.isVisibleTo(self) else ""
        short_detail = self.detail.short or detail if detail else ""
        first = max(self.caption.sizeHint().width(), self.name.sizeHint().width())
        short, whole = metrics.horizontalAdvance(short_detail), metrics.horizontalAdvance(detail)
        if self._modest:
            short = whole = min(whole, metrics.averageCharWidth() * MODEST_CHARS)
        return max(first, short) + extra, max(first, whole) + extra

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        if self.wanted is not None:
            hint.setWidth(max(self.wanted, self.minimumSizeHint().width()))
        return hint

    def set_wanted(self, width: int) -> None:
        if width != self.wanted:
            self.wanted = width
            self.updateGeometry()

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
        self.detail.set_text(verdict or "release to check and load it")
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


def share(space: int, needs: list[int]) -> list[int]:
    """`space` shared among `needs`: each gets its need where all fit, else the smaller needs are
    met whole and the larger ones get equal shares of the rest (none is cut while another has more
    than it needs)."""
    shares = [0] * len(needs)
    left = max(0, space)
    for count, i in enumerate(sorted(range(len(needs)), key=lambda i: needs[i])):
        shares[i] = min(needs[i], left // (len(needs) - count))
        left -= shares[i]
    return shares


def target_text(info: LoadedModel) -> tuple[str, str]:
    from ui.status_bar import where_words

    # "float32 · on the CPU with PyTorch": the words the status bar uses
    return info.name, f"{_precision(info)} · {where_words(info.backend, info.device)}"


def _precision(info: LoadedModel) -> str:
    return info.dtype.split(" (")[0]


def target_short_detail(info: LoadedModel) -> str:
    """"float32 · PyTorch on CPU": the target's detail line where the status bar's words do not fit."""
    from ui.status_bar import LIBRARIES

    device = info.device
    if info.remote:
        return f"{info.dtype} · remote"
    place = "GPU" if info.backend == "mlx" or device.startswith("cuda") or device == "mps" else device.upper()
    return f"{_precision(info)} · {LIBRARIES.get(info.backend, info.backend)} on {place}"


# The pair trial's words (app/models/pair_memory.py, TrialResult.summary, and the pairing
# controller's progress lines) and fewer words for a narrow header: the verdict and the range stay,
# "as the target alone here" goes (the tooltip keeps the whole line).
SHORTER_TRIAL_WORDS = ((" as the target alone here", ""), (" than the target alone here", ""),
                       (" faster here", " faster"), ("trying the pair on a few prompts…", "trying the pair…"),
                       ("the trial did not finish: it runs again next time this pair loads",
                        "trial unfinished: runs again next load"))


def short_trial(text: str) -> str:
    """"accepts 8%, about as fast (0.71-1.20x)" for "accepts 8%, about as fast as the target alone
    here (0.71-1.20x)"; a text with none of the long words stays as it is."""
    for long, short in SHORTER_TRIAL_WORDS:
        text = text.replace(long, short)
    return text


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
        self.plus = plus = QLabel("+")
        plus.setObjectName("slotTitle")
        # The window gives these their actions (setDefaultAction), shared with the View menu.
        self.settings_button = CompactToolButton("Settings")
        self.side_panel_button = CompactToolButton("Activity")
        self._layout = layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(6)  # each pixel between the parts is one the names do not get
        # No stretch on the slots: each gets the width its text asks for while there is room (a
        # fixed share cut the target's name and the trial's range at 1,400 px with room to spare
        # beside them); where there is not, both give way toward their least widths.
        layout.addWidget(self.target_slot)
        layout.addWidget(plus)
        layout.addWidget(self.draft_slot)
        layout.addStretch(1)
        layout.addWidget(self.settings_button)
        layout.addWidget(self.side_panel_button)

    # Sharing the width out: see the module's docstring.

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit(event.size().width())

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:  # a slot's text changed: share out again
            self._fit(self.width())
        return super().event(event)

    def _fit(self, width: int) -> None:
        """Each slot's width from its text: first the toggles go short; then the slots' detail
        lines take their fewer words; what is left is shared so that neither slot is cut while the
        other has room to spare."""
        layout, slots = self._layout, (self.target_slot, self.draft_slot)
        buttons = (self.settings_button, self.side_panel_button)
        margins = layout.contentsMargins()
        fixed = (margins.left() + margins.right() + layout.spacing() * (layout.count() - 1)
                 + self.plus.sizeHint().width())
        short, whole = zip(*(slot.widths() for slot in slots), strict=True)
        compact = width - fixed - sum(b.full_width() for b in buttons) < sum(whole)
        for button in buttons:
            button.set_compact(compact)
        space = width - fixed - sum(b.sizeHint().width() for b in buttons)
        if space < sum(short):
            shares = share(space, list(short))
        else:
            extra = share(space - sum(short), [w - s for s, w in zip(short, whole, strict=True)])
            shares = [s + e for s, e in zip(short, extra, strict=True)]
        for slot, width_ in zip(slots, shares, strict=True):
            slot.set_wanted(width_)

    def show_loaded(self, info: LoadedModel) -> None:
        self.target_slot.set_model(*target_text(info), target_short_detail(info))
        self.draft_slot.set_model(*draft_text(info))

    def show_trial(self, text: str) -> None:
        """The pair trial's result (or progress) under the draft's name, in fewer words where the
        whole line does not fit; the tooltip says what the trial measured, since an answer's own
        speedup (the side panel's) may differ from it by far: the demo's pair read "0.97x: slower"
        on the trial's general prompts beside a card of 2.14x on a copying task (issue 46)."""
        from app.pair_trial import TRIAL_PROMPTS, TRIAL_TOKENS

        self.draft_slot.set_model(self.draft_slot._shown[0], text, short_trial(text))
        scope = (f"The pair trial: {len(TRIAL_PROMPTS)} general prompts (code, a list, an explanation), "
                 f"{TRIAL_TOKENS} tokens each at temperature 0, the target alone against the pair. Each "
                 "answer's own speedup is in the side panel: where an answer repeats its prompt (copying, "
                 "editing) it can be far higher.")
        self.draft_slot.setToolTip(f"{self.draft_slot.toolTip()}\n{scope}")

    def show_loading(self, slot: str, what: str) -> None:
        """A load's step, in the slot being changed ("target" or "draft"); the other keeps its pair."""
        (self.draft_slot if slot == "draft" else self.target_slot).set_model("Loading…", what, modest=True)

    def show_load_failed(self) -> None:
        self.target_slot.set_model("No model loaded", "see the message in the chat")
