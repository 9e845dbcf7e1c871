"""The conversation in the middle of the window: a greeting when it is empty, otherwise the
messages in one scrolling column of readable width, following the newest text while the user
is at the bottom (and staying put when they scrolled up to read)."""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QStackedWidget, QVBoxLayout,
                               QWidget)

from app.chat.markdown import MarkdownRenderer
from ui.chat.message_widget import MessageWidget
from ui.chat.starters import DEMO_NOTE, EXPLAINER, STARTERS

COLUMN_CHARS = 96  # the widest the text column grows, in average characters: lines stay readable
STICK_SLACK_PX = 24  # "at the bottom" allows this much


class ChatView(QStackedWidget):
    regenerate_requested = Signal()
    edit_requested = Signal(object)  # MessageWidget of yours to edit and send again
    version_requested = Signal(object, int)  # MessageWidget, the number of its version to show
    copied = Signal(str)  # what was copied, in words
    starter_chosen = Signal(str)  # a prompt the empty chat offered (ui/chat/starters.py)
    answer_clicked = Signal(object)  # MessageWidget of an answer: the side panel shows its rounds

    def __init__(self, renderer: MarkdownRenderer, parent: QWidget | None = None):
        super().__init__(parent)
        self._renderer = renderer
        self.tint: bool | None = None  # answers tinted by origin (True/False: for a dark/light theme)
        self._busy = False
        self._stick = True
        self._held: int | None = None  # a scroll position to go back to once the chat is that tall (keeping_place)
        font = self.font()
        font.setPointSizeF(font.pointSizeF() * 1.08)  # the chat reads a little larger than the chrome
        self.setFont(font)
        self.addWidget(self._build_greeting())
        self.addWidget(self._build_chat())

    def _build_greeting(self) -> QWidget:
        page = QWidget()
        page.setObjectName("greeting")
        self.greeting_title = QLabel("Say hello to Tandem")
        self.greeting_title.setObjectName("greetingTitle")
        title_font = self.greeting_title.font()
        title_font.setPointSizeF(title_font.pointSizeF() * 1.6)
        self.greeting_title.setFont(title_font)
        self.greeting_hint = QLabel("Loading the model…")
        self.greeting_hint.setObjectName("greetingHint")
        self.greeting_hint.setWordWrap(True)
        self.explainer = QLabel(EXPLAINER)
        self.explainer.setObjectName("mutedLabel")
        self.explainer.setWordWrap(True)
        self.demo_note = QLabel(DEMO_NOTE)
        self.demo_note.setObjectName("mutedLabel")
        self.demo_note.setWordWrap(True)
        self.demo_note.hide()  # shown while the demo is the model (set_demo)
        for label in (self.greeting_title, self.greeting_hint, self.explainer, self.demo_note):
            label.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.starter_buttons = []
        starters = QHBoxLayout()
        starters.addStretch(1)
        for title, prompt in STARTERS:
            button = QPushButton(title)
            button.setObjectName("starterButton")
            button.setToolTip(prompt)
            button.clicked.connect(lambda _checked=False, prompt=prompt: self.starter_chosen.emit(prompt))
            starters.addWidget(button)
            self.starter_buttons.append(button)
        starters.addStretch(1)
        text = QWidget()
        text.setMaximumWidth(self.fontMetrics().averageCharWidth() * 80)
        column = QVBoxLayout(text)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.greeting_title)
        column.addSpacing(6)
        column.addWidget(self.greeting_hint)
        column.addSpacing(14)
        column.addWidget(self.explainer)
        column.addSpacing(10)
        column.addLayout(starters)
        column.addSpacing(10)
        column.addWidget(self.demo_note)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(text, 4)
        row.addStretch(1)
        layout = QVBoxLayout(page)
        layout.addStretch(2)
        layout.addLayout(row)
        layout.addStretch(3)
        # In a short window (the chat settings open at 900 x 600) the greeting scrolls instead of
        # asking for its whole height, which made the window taller and squeezed the settings.
        scroll = QScrollArea()
        scroll.setObjectName("greetingScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(page)
        return scroll

    def set_demo(self, demo: bool) -> None:
        """The note that the demo's model is tiny and where a real speedup is, while it is loaded."""
        self.demo_note.setVisible(demo)

    def _build_chat(self) -> QWidget:
        self.scroll = QScrollArea()
        self.scroll.setObjectName("chatScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        page = QWidget()
        page.setObjectName("chatPage")
        column = QWidget()
        column.setMaximumWidth(self.column_width())
        self._items = QVBoxLayout(column)
        self._items.setContentsMargins(8, 16, 8, 16)
        self._items.setSpacing(10)
        self._items.addStretch(1)
        row = QHBoxLayout(page)
        row.setContentsMargins(12, 0, 12, 0)
        row.addStretch(0)
        row.addWidget(column, 1)
        row.addStretch(0)
        self.scroll.setWidget(page)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._follow)
        bar.valueChanged.connect(lambda value: setattr(self, "_stick", value >= bar.maximum() - STICK_SLACK_PX))
        return self.scroll

    def column_width(self) -> int:
        """The widest the message column grows (the composer below matches it)."""
        return self.fontMetrics().averageCharWidth() * COLUMN_CHARS

    # Content

    def clear(self) -> None:
        for widget in self._item_widgets():
            # Qt deletes it later, while it still has its parent: giving it to Python first
            # (setParent(None)) let Python delete it under Qt's pending events and corrupted memory.
            self._items.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self.setCurrentIndex(0)

    def set_greeting_hint(self, text: str) -> None:
        self.greeting_hint.setText(text)

    def add_message(self, role: str, text: str = "", status: str = "complete", stats: dict | None = None,
                    error: str = "", spans: list | None = None) -> MessageWidget:
        widget = MessageWidget(role, self._renderer)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.edit_requested.connect(lambda w=widget: self.edit_requested.emit(w))
        widget.version_requested.connect(lambda number, w=widget: self.version_requested.emit(w, number))
        widget.copied.connect(self.copied)
        if role == "assistant":
            widget.clicked.connect(lambda w=widget: self.answer_clicked.emit(w))
            widget.role_label.setToolTip("Click the answer to see its rounds in the side panel")
        widget.set_spans(spans or [])
        widget.set_tint(self.tint)
        widget.finish(text, status, stats, error)
        self._append(widget)
        self.refresh_actions()
        return widget

    def add_notice(self, text: str, error: bool = False, before: QWidget | None = None, link: str = "") -> QLabel:
        """A line between messages (context fitting, a model that failed to load), at the end or
        just above `before`; `link`: words after it that the caller acts on (label.linkActivated)."""
        label = QLabel()
        label.setObjectName("errorLabel" if error else "noticeLabel")
        label.setWordWrap(True)
        if link:
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setText(f'{html.escape(text, quote=False)} <a href="open">{html.escape(link)}</a>')
            label.setProperty("plainText", f"{text} {link}")  # what plain_text() reads
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                          | Qt.TextInteractionFlag.LinksAccessibleByMouse
                                          | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)
        else:
            label.setTextFormat(Qt.TextFormat.PlainText)
            label.setText(text)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        label.setContentsMargins(14, 0, 14, 0)
        self._append(label, before)
        return label

    def _append(self, widget: QWidget, before: QWidget | None = None) -> None:
        self._stick, self._held = True, None  # something new: show it
        index = self._items.indexOf(before) if before is not None else -1
        self._items.insertWidget(index if index >= 0 else self._items.count() - 1, widget)  # before the stretch
        self.setCurrentIndex(1)

    def messages(self) -> list[MessageWidget]:
        return [w for w in self._item_widgets() if isinstance(w, MessageWidget)]

    def last_message(self) -> MessageWidget | None:
        messages = self.messages()
        return messages[-1] if messages else None

    def plain_text(self) -> str:
        """Everything the chat shows, as text (tests and accessibility)."""
        parts = []
        for widget in self._item_widgets():
            if isinstance(widget, MessageWidget):
                parts += [widget.role_label.text(), widget.status_tag.text() if widget.status_tag.isVisibleTo(self)
                          else "", widget.body.toPlainText(), widget.error_label.text()]
            elif isinstance(widget, QLabel):
                parts.append(widget.property("plainText") or widget.text())
        return "\n".join(part for part in parts if part)

    def _item_widgets(self) -> list[QWidget]:
        items = (self._items.itemAt(i).widget() for i in range(self._items.count()))
        return [widget for widget in items if widget is not None]

    # Actions: only the last answer can be regenerated; any message of yours can be edited (the
    # version it replaces stays a branch); neither while an answer is being written.

    def set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.refresh_actions()

    def refresh_actions(self) -> None:
        messages = self.messages()
        last = messages[-1] if messages else None
        for message in messages:
            message.set_actions(regenerate=not self._busy and message is last and message.role == "assistant",
                                edit=not self._busy and message.role == "user", browse=not self._busy)

    def set_tint(self, dark: bool | None) -> None:
        """Tint every answer by origin (draft accepted / target's own), or render them as usual."""
        self.tint = dark
        for message in self.messages():
            message.set_tint(dark)

    def set_renderer(self, renderer: MarkdownRenderer) -> None:
        self._renderer = renderer
        for message in self.messages():
            message.set_renderer(renderer)

    @contextmanager
    def keeping_place(self) -> Iterator[None]:
        """The chat filled again from a message the user is at (another version of a question of
        theirs): what is above it is unchanged, so the scroll stays where it was instead of
        following the new end."""
        bar = self.scroll.verticalScrollBar()
        value = bar.value()
        yield
        # the new messages are laid out later: their heights reach the scroll bar's range then (_follow)
        self._stick, self._held = False, value
        bar.setValue(value)

    def _follow(self, _minimum: int, maximum: int) -> None:
        if self._held is not None:
            self.scroll.verticalScrollBar().setValue(self._held)
            if maximum >= self._held:
                self._held = None  # back where it was
            return
        if self._stick:
            self.scroll.verticalScrollBar().setValue(maximum)
