"""The rounds list: one row per target pass, each drafted token a chip.

A model/view list with a painting delegate, not a widget per chip: an answer of thousands of
rounds scrolls as smoothly as one of ten. Rows are laid out once per width and font and cached;
a row's height is its wrapped chips', so a new width or font lays the rows out again, and a row
never paints outside its own height.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QEvent, QModelIndex, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QAbstractItemView, QListView, QStyledItemDelegate, QToolTip

from app.chat.trace import REJECTED, Chip, RoundTrace
from ui.panel.colors import LABELS, THINKING_ROW, chip_colors, visible

TRACE_ROLE = Qt.ItemDataRole.UserRole
GUTTER_CHARS = 7  # "⋔ 1234" and a gap
PAD_X, PAD_Y, GAP, ROW_PAD = 4, 2, 3, 4
TREE_MARK = "\u22d4 "  # ⋔ (a fork): the round verified a tree of drafts
MAX_CHIP_CHARS = 18  # a long token is elided; its tooltip has it whole
FOLLOW_SLACK_PX = 4  # this near the bottom still counts as at it


class RoundListModel(QAbstractListModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._rounds: list[RoundTrace] = []

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802 (Qt's name)
        return 0 if parent.isValid() else len(self._rounds)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r = self._rounds[index.row()]
        if role == TRACE_ROLE:
            return r
        if role == Qt.ItemDataRole.DisplayRole:  # what screen readers and tests read
            return f"round {r.index}: " + " ".join(f"{c.kind}:{visible(c.text)}" for c in r.chips)
        return None

    def append(self, rounds: list[RoundTrace]) -> None:
        rounds = _shown(rounds)
        if rounds:
            first = len(self._rounds)
            self.beginInsertRows(QModelIndex(), first, first + len(rounds) - 1)
            self._rounds.extend(rounds)
            self.endInsertRows()

    def set_rounds(self, rounds: list[RoundTrace]) -> None:
        self.beginResetModel()
        self._rounds = _shown(rounds)
        self.endResetModel()

    def rounds(self) -> list[RoundTrace]:
        return self._rounds


def _shown(rounds: list[RoundTrace]) -> list[RoundTrace]:
    """The rounds that have a token to show: a round whose only token was the end of the answer
    (never shown, nor counted) would be an empty numbered row. The figures still count its pass."""
    return [r for r in rounds if r.chips]


class ChipDelegate(QStyledItemDelegate):
    def __init__(self, view: QListView, dark: bool = False):
        super().__init__(view)
        self._view = view
        # (id(round), width) -> (the round, chip rects, row height). The entry holds the round
        # itself: Python reuses an id once its object is freed, so an entry keyed by id alone
        # could hand a new answer's row an old answer's chips; while the entry holds the round,
        # its id cannot be reused, and a hit is checked to be the same object.
        self._layouts: dict[tuple[int, int], tuple[RoundTrace, list[tuple[QRect, Chip]], int]] = {}
        self.set_dark(dark)

    def set_dark(self, dark: bool) -> None:
        self.dark = dark
        self.colors = chip_colors(dark)
        self._layouts.clear()

    def _font(self) -> QFont:
        font = QFont(self._view.font())
        font.setStyleHint(QFont.StyleHint.Monospace)
        font.setFamily("monospace")
        return font

    def layout(self, r: RoundTrace, width: int) -> tuple[list[tuple[QRect, Chip]], int]:
        """Chip rectangles relative to the row's top-left, wrapped at `width`, and the row height."""
        key = (id(r), width)
        cached = self._layouts.get(key)
        if cached is not None and cached[0] is r:
            return cached[1], cached[2]
        metrics = QFontMetrics(self._font())
        gutter = metrics.averageCharWidth() * GUTTER_CHARS
        line_h = metrics.height() + 2 * PAD_Y
        x, y, rects = gutter, ROW_PAD, []
        for chip in r.chips:
            w = metrics.horizontalAdvance(_label(chip)) + 2 * PAD_X
            if x + w > width - ROW_PAD and x > gutter:
                x, y = gutter, y + line_h + GAP
            rects.append((QRect(x, y, w, line_h), chip))
            x += w + GAP
        height = y + line_h + ROW_PAD
        if len(self._layouts) > 20000:  # widths change on resize: forget old layouts
            self._layouts.clear()
        self._layouts[key] = (r, rects, height)
        return rects, height

    def forget(self) -> None:
        """Another answer is shown: its rows need none of the layouts kept so far."""
        self._layouts.clear()

    def sizeHint(self, option, index) -> QSize:  # noqa: N802
        width = self._view.viewport().width()
        return QSize(width, self.layout(index.data(TRACE_ROLE), width)[1])

    def paint(self, painter: QPainter, option, index) -> None:
        r: RoundTrace = index.data(TRACE_ROLE)
        rect = option.rect
        rects, _ = self.layout(r, self._view.viewport().width())
        painter.save()
        # within its own row: a row laid out for another width or font (until the view lays it
        # out again) is cut at its edge instead of drawing its wrapped chips over the next row
        painter.setClipRect(rect)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        if r.thinking:  # written inside the thinking block: its own colour, as in the chat it is folded apart
            painter.fillRect(rect.adjusted(0, 1, 0, -1), QColor(THINKING_ROW[self.dark]))
        font = self._font()
        painter.setFont(font)
        muted = option.palette.color(option.palette.ColorRole.PlaceholderText)
        painter.setPen(muted)
        gutter = QRect(rect.left(), rect.top() + ROW_PAD, QFontMetrics(font).averageCharWidth() * (GUTTER_CHARS - 1),
                       QFontMetrics(font).height() + 2 * PAD_Y)
        # a round that verified a tree of drafts is marked beside its number (its tooltip lists the branches)
        label = f"{TREE_MARK}{r.index}" if r.branches else str(r.index)
        painter.drawText(gutter, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, label)
        for chip_rect, chip in rects:
            box = chip_rect.translated(rect.topLeft())
            colors = self.colors[chip.kind]
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(colors.background))
            painter.drawRoundedRect(box, 4, 4)
            chip_font = QFont(font)
            chip_font.setStrikeOut(chip.kind == REJECTED)
            painter.setFont(chip_font)
            painter.setPen(QPen(QColor(colors.text)))
            painter.drawText(box, Qt.AlignmentFlag.AlignCenter, _label(chip))
        painter.restore()

    def chip_at(self, index: QModelIndex, pos) -> Chip | None:
        """The chip under a viewport position in the row at `index`."""
        r: RoundTrace = index.data(TRACE_ROLE)
        top_left = self._view.visualRect(index).topLeft()
        for chip_rect, chip in self.layout(r, self._view.viewport().width())[0]:
            if chip_rect.translated(top_left).contains(pos):
                return chip
        return None

    def helpEvent(self, event, view, option, index) -> bool:  # noqa: N802
        if not index.isValid():
            return False
        chip = self.chip_at(index, event.pos())
        r: RoundTrace = index.data(TRACE_ROLE)
        if chip is None:
            QToolTip.showText(event.globalPos(), round_tip(r), view)
        else:
            QToolTip.showText(event.globalPos(), chip_tip(chip), view)
        return True


def _label(chip: Chip) -> str:
    text = visible(chip.text)
    return text if len(text) <= MAX_CHIP_CHARS else text[: MAX_CHIP_CHARS - 1] + "…"


def chip_tip(chip: Chip) -> str:
    lines = [f"{visible(chip.text)!s}  ({LABELS[chip.kind]})", f"token id {chip.token}"]
    if chip.p is not None:
        lines.append(f"draft p = {chip.p:.3f}")
    if chip.q is not None:
        lines.append(f"target q = {chip.q:.3f}")
    return "\n".join(lines)


# Each Proposal's source (app/engine/drafters.py and the drafters beside it) in a user's words
DRAFTED_BY = {"lookup": "prompt lookup", "model": "the draft model", "mtp": "the model's built-in MTP layer",
              "head": "the aligned draft head",
              "assistant": "the Gemma 4 assistant", "eagle3": "the EAGLE-3 head",
              "dflash": "the DFlash drafter"}


def round_tip(r: RoundTrace) -> str:
    thinking = " (thinking: the model's reasoning before its answer)" if r.thinking else ""
    return _round_tip(r) + thinking


def _round_tip(r: RoundTrace) -> str:
    if r.index == 0:
        return "Round 0: the prompt's pass (prefill) wrote the first token"
    source = DRAFTED_BY.get(r.source, r.source or "the drafter")
    if not r.drafted:
        return f"Round {r.index}: the target alone (nothing drafted)"
    line = (f"Round {r.index}: k = {r.k} drafted by {source}, {r.count('accepted')} accepted; "
            f"draft {r.draft_s * 1000:.0f} ms, verify {r.verify_s * 1000:.0f} ms")
    if not r.branches:
        return line
    tried = "\n".join(f"  {'first guess' if i == 0 else f'branch {i + 1}'}: {visible(b)!s}"
                      for i, b in enumerate(r.branches))
    return f"{line}\nA tree of {len(r.branches)} branches verified in one pass (the chips: the path taken):\n{tried}"


class RoundsView(QListView):
    """Follows the newest round while the user is at the bottom; stays put once they scroll up,
    like a terminal.

    Whether it follows is decided when the user scrolls, not when rounds arrive: past the first
    batch of rows (Batched layout) Qt lays rows out on a timer, so the scroll range grew after
    the append had scrolled to the bottom, the view sat above the new bottom, and the next append
    read that as the user having scrolled up: it stopped following for the rest of the answer.
    Now every growth of the range is followed while `following` holds."""

    def __init__(self, parent=None, dark: bool = False):
        super().__init__(parent)
        self.setObjectName("roundsView")
        self.model_ = RoundListModel(self)
        self.setModel(self.model_)
        self.delegate = ChipDelegate(self, dark)
        self.setItemDelegate(self.delegate)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setResizeMode(QListView.ResizeMode.Adjust)  # rows re-wrap when the panel is resized
        self.setLayoutMode(QListView.LayoutMode.Batched)
        self.setBatchSize(200)
        self.setMouseTracking(True)
        self.following = True  # at the newest round: new ones scroll into view
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)

    def _scrolled(self, value: int) -> None:
        """The user scrolled (or the view did, to follow): following while at the bottom."""
        self.following = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _range_changed(self, _low: int, high: int) -> None:
        if self.following:
            self.verticalScrollBar().setValue(high)

    def append(self, rounds: list[RoundTrace]) -> None:
        self.model_.append(rounds)
        if self.following:
            self.scrollToBottom()

    def set_rounds(self, rounds: list[RoundTrace]) -> None:
        self.delegate.forget()
        self.model_.set_rounds(rounds)
        self.following = True  # another answer: from its newest round
        self.scrollToBottom()

    # Rows wrap at the width and are measured in the font: either changing lays them out again.

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            # Qt lays a top-to-bottom list out again when its height changes (after 100 ms); rows
            # that wrap need it when the width does, or they keep the old width's heights
            self._lay_out_again()

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # the system's or the theme's font, after the rows
            self.delegate.forget()
            self._lay_out_again()

    def _lay_out_again(self) -> None:
        self.scheduleDelayedItemsLayout()
        if self.following:  # still at the newest round once the rows have their new heights
            QTimer.singleShot(0, self, self.scrollToBottom)
