"""The chats on the left: a search box, "New chat", and the list (newest activity first).
Double-click or F2 renames in place; the context menu renames and deletes. The list only shows
and asks; the window changes the history. A search that matches nothing says so."""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QFrame, QLabel, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QPushButton, QStyledItemDelegate, QVBoxLayout, QWidget)

from app.chat.history import Conversation

SEARCH_DELAY_MS = 200  # search once typing pauses, not on every key
ID_ROLE = Qt.ItemDataRole.UserRole


class RenameDelegate(QStyledItemDelegate):
    """The rename editor as tall as a line edit wants to be: Qt fits it into the item's text
    rectangle, which the item's padding leaves only a few pixels high."""

    def updateEditorGeometry(self, editor, option, index) -> None:  # noqa: N802 (Qt's name)
        rect, height = option.rect, max(option.rect.height(), editor.sizeHint().height())
        editor.setGeometry(QRect(rect.left(), rect.center().y() - height // 2 + 1, rect.width(), height))


class ConversationList(QFrame):
    conversation_selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("conversationList")
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 18)
        self._filling = False
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(self._search_timer.start)
        self.list = QListWidget()
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                  | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemChanged.connect(self._item_renamed)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles elide
        self.list.setItemDelegate(RenameDelegate(self.list))
        self.empty_label = QLabel()
        self.empty_label.setObjectName("noticeLabel")
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.empty_label.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.list, 1)

    def set_conversations(self, conversations: list[Conversation], current_id: int | None) -> None:
        """Refill without announcing a selection: the window already knows which chat is open."""
        self._filling = True
        try:
            self.list.clear()
            for conversation in conversations:
                item = QListWidgetItem(conversation.title)
                item.setData(ID_ROLE, conversation.id)
                item.setToolTip(conversation.title)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                self.list.addItem(item)
                if conversation.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self._filling = False
        needle = " ".join(self.search.text().split())
        self.empty_label.setText(f"No matches for “{needle}” in titles or messages." if needle else "")
        self.empty_label.setVisible(bool(needle) and not conversations)

    def select(self, conv_id: int | None) -> None:
        """Mark the open chat without announcing it (the window opened it)."""
        self._filling = True
        try:
            item = self._item(conv_id) if conv_id is not None else None
            if item is None:
                self.list.clearSelection()
                self.list.setCurrentItem(None)
            else:
                self.list.setCurrentItem(item)
        finally:
            self._filling = False

    def ids(self) -> list[int]:
        return [self.list.item(i).data(ID_ROLE) for i in range(self.list.count())]

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def start_rename(self, conv_id: int) -> None:
        item = self._item(conv_id)
        if item is not None:
            self.list.editItem(item)

    def _item(self, conv_id: int) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == conv_id:
                return self.list.item(i)
        return None

    def _current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None and not self._filling:
            self.conversation_selected.emit(current.data(ID_ROLE))

    def _item_renamed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        # An empty name is passed on too: the window refuses it and shows the old one again.
        self.rename_requested.emit(item.data(ID_ROLE), " ".join(item.text().split()))

    def _context_menu(self, position) -> None:
        item = self.list.itemAt(position)
        if item is None:
            return
        conv_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Delete…", lambda: self.delete_requested.emit(conv_id))
        menu.exec(self.list.viewport().mapToGlobal(position))
