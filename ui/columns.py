"""The window's three columns (the chat list, the chat, the side panel) and how they fold in a
narrow window, as chat apps do.

At 900 px the three shared out squeezed the chat list to about 100 px ("Search c…", titles cut
to a word) and left the header too little for the model slots. Below COMPACT_BELOW the list and
the side panel take turns: opening one folds the other, and when the window narrows with both
open the list folds. A folded list leaves a rail at the window's left edge: a button that opens it
again, and New chat. Widening the window opens again what narrowing folded; what
the user closed stays closed. A column's width goes to the chat when it folds and comes back
from it when it opens.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, Qt, QTimer
from PySide6.QtGui import QAction, QPainter, QPalette, QPen
from PySide6.QtWidgets import QFrame, QSplitter, QToolButton, QVBoxLayout, QWidget

COMPACT_BELOW = 1100  # px: narrower, the list, the chat and the panel do not all fit at useful widths
LIST, CHAT, PANEL = 0, 1, 2  # the splitter's columns
DEFAULT_WIDTHS = {LIST: 240, PANEL: 440}  # what a column opens at when it has no width of its own yet


class RailButton(QToolButton):
    """A square button that draws its glyph in the theme's text colour: "list" (three lines, the
    chat list) or "new" (a plus). Drawn, not a font's character: no font lacks it."""

    SIDE = 30

    def __init__(self, glyph: str, tip: str):
        super().__init__()
        self.glyph = glyph
        self.setToolTip(tip)
        self.setAccessibleName(tip)
        self.setFixedSize(self.SIDE, self.SIDE)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().paintEvent(event)  # the frame and hover, as the stylesheet draws them
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(self.palette().color(QPalette.ColorRole.ButtonText), 1.6)
        pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        painter.setPen(pen)
        middle, half = self.SIDE / 2, 6.5
        if self.glyph == "list":
            for dy in (-4.5, 0.0, 4.5):
                painter.drawLine(QPointF(middle - half, middle + dy), QPointF(middle + half, middle + dy))
        else:
            painter.drawLine(QPointF(middle - half, middle), QPointF(middle + half, middle))
            painter.drawLine(QPointF(middle, middle - half), QPointF(middle, middle + half))
        painter.end()


class ChatRail(QFrame):
    """The strip a folded chat list leaves at the window's left edge: the list's toggle, and New chat."""

    def __init__(self, list_action: QAction, new_action: QAction, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chatRail")
        self.chats_button = RailButton("list", f"Show the chat list ({_keys(list_action)})")
        self.chats_button.clicked.connect(lambda: list_action.setChecked(True))
        self.new_button = RailButton("new", f"New chat ({_keys(new_action)})")
        self.new_button.clicked.connect(new_action.trigger)
        self.setStyleSheet("QToolButton { padding: 0; }")  # the theme's colours; the glyph fills the button
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 10, 6, 8)
        layout.setSpacing(6)
        for button in (self.chats_button, self.new_button):
            layout.addWidget(button)
        layout.addStretch(1)


def _keys(action: QAction) -> str:
    return action.shortcut().toString(action.shortcut().SequenceFormat.NativeText)


class Columns:
    """Folds and opens the list and the panel; the View menu's actions (and the header's and the
    rail's buttons, which trigger them) come here, so the rule holds however a column is toggled."""

    def __init__(self, splitter: QSplitter, rail: ChatRail, list_action: QAction, panel_action: QAction):
        self.splitter, self.rail = splitter, rail
        self.actions = {LIST: list_action, PANEL: panel_action}
        self.compact = False
        self.folded: set[int] = set()  # columns narrowing folded, to open again when the window widens
        self._widths: dict[int, int] = {}  # a folded column's width, to open it at
        self._wide_sizes: list[int] | None = None  # the splitter's sizes at the last width above COMPACT_BELOW
        self._restoring = True  # until the window's first layout: the saved sizes stand as they are
        splitter.splitterMoved.connect(lambda _pos, _index: self._remember_wide())
        list_action.toggled.connect(lambda on: self._toggled(LIST, on))
        panel_action.toggled.connect(lambda on: self._toggled(PANEL, on))

    def restored(self) -> None:
        """The window's saved state is in (each action checked as saved, the splitter's sizes)."""
        for column, action in self.actions.items():
            self.splitter.widget(column).setVisible(action.isChecked())
        self.rail.setVisible(not self.actions[LIST].isChecked())
        self._restoring = False

    def wanted(self, column: int) -> bool:
        """Open as the user left it: a column narrowing folded counts as open (what is saved at quit)."""
        return self.actions[column].isChecked() or column in self.folded

    def fit(self, width: int) -> None:
        """The window is `width` px wide now."""
        compact = width < COMPACT_BELOW
        if compact == self.compact:
            if not compact:  # once the splitter has its new width: what widening goes back to
                QTimer.singleShot(0, self.splitter, self._remember_wide)
            return
        self.compact = compact
        if compact:
            if self.actions[LIST].isChecked() and self.actions[PANEL].isChecked():
                self._fold(LIST)
            return
        folded, self.folded = self.folded, set()
        for column in sorted(folded):
            self.actions[column].setChecked(True)
        if self._wide_sizes is not None and folded:  # the wide layout as it was, scaled to this width
            self.splitter.setSizes(self._wide_sizes)

    def _remember_wide(self) -> None:
        if not self.compact and all(self.splitter.sizes()[c] > 0 for c in self.actions if self.actions[c].isChecked()):
            self._wide_sizes = self.splitter.sizes()

    def _fold(self, column: int) -> None:
        self.actions[column].setChecked(False)  # through _toggled: the column goes, its width to the chat
        self.folded.add(column)

    def _toggled(self, column: int, on: bool) -> None:
        self.folded.discard(column)  # the user's choice (or _fold's, which marks it after)
        if on and self.compact:
            other = PANEL if column == LIST else LIST
            if self.actions[other].isChecked():
                self._fold(other)
        self._show(column, on)
        if column == LIST:
            self.rail.setVisible(not on)

    def _show(self, column: int, on: bool) -> None:
        widget = self.splitter.widget(column)
        if self._restoring or widget.isHidden() != on:  # before the first layout, or already so
            widget.setVisible(on)
            return
        sizes = self.splitter.sizes()
        if on:
            # the list as wide as it opens by default at least: the width it was folded at was a squeezed one
            wanted = max(self._widths.get(column, 0), DEFAULT_WIDTHS[column] if column == LIST else 0) or \
                DEFAULT_WIDTHS[column]
            widget.show()
            sizes[column] = wanted
            sizes[CHAT] = max(0, sizes[CHAT] - wanted)  # the splitter keeps each column's least width
        else:
            if sizes[column] > 0:
                self._widths[column] = sizes[column]
            sizes[CHAT] += sizes[column]
            sizes[column] = 0
            widget.hide()
            if self.compact:
                self._chat_first(sizes)
        self.splitter.setSizes(sizes)

    def _chat_first(self, sizes: list[int]) -> None:
        """In a narrow window the chat gets the width it asks for (the header's two model slots
        whole) before the column still open beside it keeps more than its least."""
        short = self.splitter.widget(CHAT).sizeHint().width() - sizes[CHAT]
        for column in (LIST, PANEL):
            spare = sizes[column] - self.splitter.widget(column).minimumSizeHint().width()
            if short > 0 and sizes[column] > 0 and spare > 0:
                given = min(short, spare)
                sizes[column] -= given
                sizes[CHAT] += given
                short -= given
