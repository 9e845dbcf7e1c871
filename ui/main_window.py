"""The Tandem window: the chats on the left, the chat in the middle, the side panel on the right.

This module assembles the parts and wires them; the parts do the work (ui/chat/ for the chat,
ui/worker.py for the engine thread, app/chat/ for the history).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QMetaObject, QSettings, Qt, QThread
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QApplication, QHBoxLayout, QMainWindow, QMessageBox, QSplitter, QVBoxLayout, QWidget

from app import data_files
from app.chat.history import HistoryError, HistoryStore, default_path
from app.chat.markdown import MarkdownRenderer
from app.chat.settings import ChatSettings
from app.data_files import NotAnswering
from app.draft_choice import AUTO_DRAFT, DraftChoice, DraftKind
from app.models.names import is_demo_folder
from app.models.resolve import model_label, precision_words
from app.runner import LoadedModel, auto_draft
from ui import theme, window_state
from ui.banner import BannerStack
from ui.chat.chat_view import ChatView
from ui.chat.composer import Composer
from ui.chat.controller import ChatController
from ui.chat.conversation_list import ConversationList
from ui.chat.export_dialog import export_chat
from ui.chat.settings_drawer import SettingsDrawer
from ui.columns import PANEL, ChatRail, Columns
from ui.header import Header
from ui.panel.draft_panel import DraftPanel
from ui.pairing.align import DraftAligner
from ui.pairing.controller import PairController
from ui.pairing.downloads import DownloadStrip
from ui.pairing.drop import mime_texts
from ui.recovery_offer import RecoveryOffer
from ui.pairing.remote_dialog import ask_remote
from ui.pairing.slot_menu import ask_token, build_slot_menu
from ui.server_switch import ServerSwitch
from ui.panel.race_mode import RaceMode
from ui.side_panel import SidePanelHost
from ui.load_progress import LoadSteps
from ui.status_bar import StatusBar, ready_words
from ui.worker import EngineWorker, PairRequest

COPIED_MS = 2500  # how long the status bar says what was copied
QUIT_WAIT_MS = 30_000  # the current round (or a load in progress) finishes within this
DEFAULT_SIZE = (1400, 860)  # fits a 1440 x 900 screen; Qt shrinks it to smaller screens
DEFAULT_SPLIT = (240, 720, 440)  # conversations, chat, draft activity


def open_history(path: Path | None) -> tuple[HistoryStore, str | None]:
    """The history, and what the user must be told about it. A locked or newer file is left
    alone: this session then keeps its chats in memory, and says so."""
    try:
        store = HistoryStore.open(_checked(path or default_path()))
    except HistoryError as exc:
        try:
            store = HistoryStore.open(Path(":memory:"))
        except HistoryError:  # an SQLite without in-memory databases: a throwaway file
            store = HistoryStore.open(Path(tempfile.mkdtemp(prefix="tandem-")) / "history.sqlite3")
        return store, f"{exc} Until then, this session's chats are kept in memory only and are gone when Tandem closes."
    return store, store.recovery_message


def _checked(path: Path) -> Path:
    """`path`, or HistoryError where it is no file SQLite can open: a named pipe there made SQLite
    report a "disk I/O error", and a stalled network folder would hang the window before it shows.
    What is there is left untouched (it may be the user's)."""
    problem = data_files.check(path)
    if problem is None:
        return path
    if isinstance(problem, NotAnswering):
        raise HistoryError(f"The chat history {problem}; it was left as it is.")
    raise HistoryError(f"The chat history at {path} {str(problem).removeprefix(f'{path} ')}, so Tandem cannot "
                       "open it; move it away or start Tandem with --history naming another file.")


class MainWindow(QMainWindow):

    def __init__(self, model: str | None = "demo", backend: str = "", draft: DraftChoice | None = AUTO_DRAFT,
                 history_path: str | Path | None = None, settings: QSettings | None = None,
                 max_tokens: int | None = None, chat_defaults: ChatSettings | None = None):
        super().__init__()
        self.setWindowTitle("Tandem")
        self.theme = theme.install(QApplication.instance())
        self.app_settings = settings if settings is not None else window_state.open_settings()
        self._closed = False
        self._load = LoadSteps("the model", "its draft")  # the load in progress: its one line
        self._pair_in_use: PairRequest | None = None  # as loaded (paired): which slot a new request changes
        defaults = chat_defaults or ChatSettings()
        if max_tokens is not None:
            defaults = ChatSettings.from_dict({"max_tokens": max_tokens}, base=defaults)
        self.store, history_message = open_history(Path(history_path) if history_path else None)

        self._build()
        # a row of the history read with a part left out (bad JSON, a wrong type): said once, from here on
        self.store.unreadable.listen(lambda text: self.banners.add(text, "warning", "history-rows"))
        self.settings_drawer.defaults = defaults
        self.pairing = PairController(self.download_strip, backend,
                                      ask_token=lambda repo, why: ask_token(self, repo, why), parent=self,
                                      ask_remote=lambda address: ask_remote(self, address))
        if self.pairing.memory.notice:  # pairs.json's entries skipped, or the file set aside, as it was read
            self.banners.add(self.pairing.memory.notice, "warning", "pairs")
        self._start_worker()
        self.race = RaceMode(self)
        self.controller = ChatController(self.store, self.worker, self.chat_view, defaults, self)
        self.aligner = DraftAligner(self.align_strip, self.pairing, self.worker,
                                    temperature=lambda: self.controller.settings.temperature, parent=self)
        self.worker.hold_for_timing = self.aligner.hold_for_timing  # the yardstick is timed as answers run
        self._build_actions()
        self._wire()
        self._restore()
        if history_message:
            self.banners.add(history_message, "warning", "history")
        if settings_notice := window_state.notice(self.app_settings):  # Tandem.conf not a file, or not answering
            self.banners.add(settings_notice, "warning", "settings")
        self.recovery = RecoveryOffer(self)  # answers a full disk kept out of the history when Tandem last quit
        self.recovery.offer_next()
        self.chat_view.set_greeting_hint("Loading the model…")
        self.setAcceptDrops(True)  # two models dropped anywhere pair up; the slots take one each
        self.pairing.start(model, draft)

    # Building

    def _build(self) -> None:
        self.header = Header()
        self.settings_drawer = SettingsDrawer()
        self.settings_drawer.hide()
        self.banners = BannerStack()
        self.download_strip = DownloadStrip()
        self.align_strip = DraftAligner.build_strip()
        self.chat_view = ChatView(MarkdownRenderer(self.theme.theme.markdown_style()))
        self.composer = Composer()
        self.composer.setMaximumWidth(self.chat_view.column_width() - 16)  # the messages sit 8 px inside the column
        composer_row = QHBoxLayout()
        composer_row.setContentsMargins(20, 6, 20, 16)
        composer_row.addWidget(self.composer)
        chat_column = QWidget()
        chat_column.setObjectName("chatColumn")
        column = QVBoxLayout(chat_column)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        for widget in (self.header, self.download_strip, self.align_strip, self.settings_drawer, self.banners):
            column.addWidget(widget)
        column.addWidget(self.chat_view, 1)
        column.addLayout(composer_row)

        self.conversation_list = ConversationList()
        self.side_panel_host = SidePanelHost()
        self.draft_panel = DraftPanel(dark=self.theme.theme.dark, settings=self.app_settings)
        self.side_panel_host.content.addWidget(self.draft_panel)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setHandleWidth(2)
        for widget in (self.conversation_list, chat_column, self.side_panel_host):
            self.splitter.addWidget(widget)
        self.splitter.setStretchFactor(1, 1)
        central = QWidget()
        self._central_row = QHBoxLayout(central)  # the chat rail goes before the splitter (_build_actions)
        self._central_row.setContentsMargins(0, 0, 0, 0)
        self._central_row.setSpacing(0)
        self._central_row.addWidget(self.splitter, 1)
        self.setCentralWidget(central)
        self.status = StatusBar()
        self.setStatusBar(self.status)

    def _start_worker(self) -> None:
        self.thread = QThread(self)
        self.thread.setObjectName("tandem-worker")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.pairing.request_pair.connect(self.worker.load_pair)
        self.pairing.request_trial.connect(self.worker.trial)
        self.thread.start()

    def _build_actions(self) -> None:
        def action(menu, text, slot, shortcut=None, checkable=False, tip=""):
            item = QAction(text, self)
            if shortcut is not None:
                item.setShortcut(QKeySequence(shortcut))
            item.setCheckable(checkable)
            item.setToolTip(tip or text)
            if slot is not None:  # None: the columns' toggles, which Columns connects
                (item.toggled if checkable else item.triggered).connect(slot)
            menu.addAction(item)
            return item

        bar = self.menuBar()
        file_menu, chat_menu, view_menu = bar.addMenu("&File"), bar.addMenu("&Chat"), bar.addMenu("&View")
        self.server_switch = ServerSwitch(self.worker, self.draft_panel, self.status, self.banners, self.app_settings,
                                          bar.addMenu("&Server"), lambda: self.controller.pending is not None)
        self.new_action = action(file_menu, "New chat", self.new_chat, QKeySequence.StandardKey.New)
        action(file_menu, "Rename chat", self.rename_current, Qt.Key.Key_F2)
        action(file_menu, "Delete chat…", lambda: self.delete_conversation(self._current_id()))
        self.export_action = action(file_menu, "Export chat as Markdown…", self.export_chat, "Ctrl+Shift+E",
                                    tip="Save the open chat as a Markdown file: every message, and each "
                                        "answer's version and figures")
        file_menu.addSeparator()
        action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)
        self.stop_action = action(chat_menu, "Stop", self.escape, Qt.Key.Key_Escape,
                                  tip="Stop the answer after the current round")
        self.regenerate_action = action(chat_menu, "Regenerate last answer", self.controller.regenerate, "Ctrl+R")
        self.edit_action = action(chat_menu, "Edit last message", self.edit_last, "Ctrl+E")
        action(chat_menu, "Copy last answer", self.copy_last_answer, "Ctrl+Shift+C")
        self.settings_action = action(view_menu, "Chat settings", self.settings_drawer.setVisible, "Ctrl+,", True,
                                      "System prompt and generation settings of this chat")
        self.side_panel_action = action(view_menu, "Draft activity", None, "Ctrl+Shift+D", True,
                                        "Show or hide the side panel: draft tokens, live graphs")
        self.list_action = action(view_menu, "Chat list", None, "Ctrl+Shift+L", True)
        self.chat_rail = ChatRail(self.list_action, self.new_action)
        self._central_row.insertWidget(0, self.chat_rail)
        self.columns = Columns(self.splitter, self.chat_rail, self.list_action, self.side_panel_action)
        view_menu.addSeparator()
        theme_menu = view_menu.addMenu("Theme")
        self.theme_actions = QActionGroup(self)  # one of them checked: the menu marks the current choice
        for choice, words in (("system", "As the system"), ("light", "Light"), ("dark", "Dark")):
            item = theme_menu.addAction(words)
            item.setCheckable(True)
            item.setData(choice)
            self.theme_actions.addAction(item)
            item.triggered.connect(lambda _checked=False, choice=choice: self.set_theme(choice))
        self.header.settings_button.setDefaultAction(self.settings_action)
        self.header.side_panel_button.setDefaultAction(self.side_panel_action)

    def _wire(self) -> None:
        worker, controller = self.worker, self.controller
        worker.progress.connect(self._on_progress)
        worker.loaded.connect(self._on_loaded)
        worker.caches_kept.connect(self.status.show_kept)
        worker.load_failed.connect(self._on_load_failed)
        worker.smaller_offered.connect(self._on_smaller_offered)
        worker.unloaded.connect(self._on_unloaded)
        controller.busy_changed.connect(self._on_busy)
        controller.conversations_changed.connect(self.refresh_conversations)
        controller.conversation_opened.connect(self._on_conversation_opened)
        controller.answer_finished.connect(self.status.show_stats)
        controller.error.connect(lambda message: self.banners.add(message, "error", "answer"))
        self.composer.send_requested.connect(self._on_send)
        self.chat_view.starter_chosen.connect(self.send_starter)  # a prompt the empty chat offered
        self.composer.stop_requested.connect(controller.stop)
        controller.stopping.connect(self._on_stopping)
        self.chat_view.copied.connect(self._on_copied)
        controller.saved.connect(lambda message: self.status.showMessage(message, 8000))
        self.chat_view.edit_requested.connect(self.edit_message)
        self.conversation_list.conversation_selected.connect(self._open)
        self.conversation_list.new_requested.connect(self.new_chat)
        self.conversation_list.rename_requested.connect(controller.rename)
        self.conversation_list.delete_requested.connect(self.delete_conversation)
        self.conversation_list.search_changed.connect(lambda _text: self.refresh_conversations())
        self.settings_drawer.settings_changed.connect(controller.update_settings)
        self.settings_drawer.system_prompt_changed.connect(controller.update_system_prompt)
        self.theme.changed.connect(self._on_theme)
        panel = self.draft_panel
        worker.baseline.connect(panel.set_baseline)
        controller.trace_shown.connect(self._on_trace_shown)
        controller.trace_rounds.connect(panel.rounds_added)
        # any end (finished, stopped, failed): the rounds still buffered for the panel are shown
        controller.busy_changed.connect(lambda busy: None if busy else panel.finish_answer())
        panel.tint_toggled.connect(lambda on: self.chat_view.set_tint(self.theme.theme.dark if on else None))
        panel.tint_toggled.connect(lambda on: self.app_settings.setValue(window_state.TINT, on))  # kept for next time
        panel.race_requested.connect(self.start_race)
        controller.race_opened.connect(self.race.reopen)  # a kept race's link, under its question
        self._wire_pairing()

    def _wire_pairing(self) -> None:
        worker, pairing = self.worker, self.pairing
        for slot in (self.header.target_slot, self.header.draft_slot):
            slot.dropped.connect(pairing.drop)
            slot.clicked.connect(self.show_slot_menu)
        worker.paired.connect(pairing.on_paired)
        worker.paired.connect(self._on_paired)
        worker.trial_done.connect(pairing.on_trial_done)
        worker.pair_notice.connect(self._on_pair_notice)
        pairing.trial_shown.connect(self.header.show_trial)
        pairing.request_pair.connect(self._on_pair_requested)  # emitted on this thread: runs here
        pairing.error.connect(lambda message: self.banners.add(message, "error", "pairing"))
        pairing.info.connect(lambda message: self.banners.add(message, "info", "pairing"))
        self.controller.busy_changed.connect(self._trial_gives_way)
        worker.paired.connect(self.aligner.on_paired)  # after pairing.on_paired: its target's aligned draft card
        self.controller.busy_changed.connect(self.aligner.on_chat_busy)
        self.aligner.pair_unloaded.connect(self._on_unloaded_for_align)

    def _trial_gives_way(self, busy: bool) -> None:
        """A real request wants the engine: background work on it (the pair trial, re-timing the
        target alone) stops after its round; once the chat is idle a trial left unfinished goes on."""
        self.worker.set_engine_wanted(busy)
        if not busy:
            QMetaObject.invokeMethod(self.worker, "resume_background", Qt.ConnectionType.QueuedConnection)

    # The worker's signals go to methods of this window, so Qt runs them on the GUI thread (a
    # lambda would run on the worker's thread and touch widgets from there).

    def _on_pair_notice(self, message: str) -> None:
        self.banners.add(message, "warning", "pair")

    def _on_unloaded(self) -> None:
        self.controller.model = None
        self.pairing.on_unloaded()

    def _on_unloaded_for_align(self) -> None:
        """Align draft let go of the pair to have the memory: it loads again when the job ends."""
        self._on_unloaded()
        self.header.target_slot.set_model("No model loaded", "unloaded while the draft aligns; it loads again after")
        self.status.show_load_failed()
        self.composer.set_ready(False)
        self.draft_panel.set_available(False)
        self.chat_view.set_greeting_hint("The pair is unloaded while the draft aligns; it loads again after.")

    def show_slot_menu(self, role: str) -> None:
        slot = self.header.target_slot if role == "target" else self.header.draft_slot
        self.slot_menu = build_slot_menu(role, self.pairing, self, self.aligner)
        self.slot_menu.popup(slot.mapToGlobal(slot.rect().bottomLeft()))

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self.columns.fit(event.size().width())  # a narrow window folds the chat list (ui/columns.py)

    # Two models dropped anywhere on the window: the larger is the target (PairController.drop)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if mime_texts(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        texts = mime_texts(event.mimeData())
        if texts:
            event.acceptProposedAction()
            self.pairing.drop("window", texts)

    def set_theme(self, choice: str, save: bool = True) -> None:
        """View → Theme: the system's, light or dark, kept for the next start."""
        self.theme.set_choice(choice)
        for item in self.theme_actions.actions():
            item.setChecked(item.data() == self.theme.choice)
        if save:
            self.app_settings.setValue(window_state.THEME, self.theme.choice)

    def _on_theme(self, t) -> None:
        self.chat_view.set_renderer(MarkdownRenderer(t.markdown_style()))
        self.draft_panel.set_dark(t.dark)
        if self.chat_view.tint is not None:
            self.chat_view.set_tint(t.dark)

    def _on_trace_shown(self, trace, source: str = "") -> None:
        pending = self.controller.pending
        if pending is not None and trace is pending.trace:
            self.draft_panel.begin(trace)  # live: rounds arrive through trace_rounds
        else:
            self.draft_panel.show_trace(trace, source)  # `source`: an older answer, clicked

    # Race mode (ui/panel/race_mode.py)

    def start_race(self, at_chat_temperature: bool = False) -> None:
        self.race.start(at_chat_temperature)

    @property
    def race_dialog(self):
        return self.race.dialog

    def _restore(self) -> None:
        settings = self.app_settings
        if not window_state.restore_layout(settings, self, self.splitter):
            self.resize(*DEFAULT_SIZE)
            self.splitter.setSizes(list(DEFAULT_SPLIT))
        self.side_panel_action.setChecked(window_state.flag(settings, window_state.SIDE_PANEL, True))
        self.settings_action.setChecked(window_state.flag(settings, window_state.SETTINGS_DRAWER, False))
        self.list_action.setChecked(True)
        self.columns.restored()  # from here on a narrow window folds a column (ui/columns.py)
        self.set_theme(str(settings.value(window_state.THEME, "system")), save=False)
        self.draft_panel.tint_box.setChecked(window_state.flag(settings, window_state.TINT, False))
        self.controller.open(window_state.last_conversation(settings))
        self.refresh_conversations()

    # Chats

    def _current_id(self) -> int | None:
        return self.controller.current.id if self.controller.current else None

    def refresh_conversations(self) -> None:
        conversations = self.store.list_conversations(self.conversation_list.search.text())
        self.conversation_list.set_conversations(conversations, self._current_id())
        current = next((c for c in conversations if c.id == self._current_id()), None)
        self.setWindowTitle(f"{current.title} · Tandem" if current else "Tandem")

    def _open(self, conv_id: int) -> None:
        self.settings_drawer.flush_prompt()  # an edit in progress belongs to the chat being left
        self.composer.cancel_edit()
        self.controller.open(conv_id)

    def new_chat(self) -> None:
        self._open(None)
        self.refresh_conversations()
        self.composer.edit.setFocus()

    def _on_conversation_opened(self, conversation) -> None:
        c = self.controller
        self.settings_drawer.set_values(c.settings, c.system_prompt)
        self.setWindowTitle(f"{conversation.title} · Tandem" if conversation else "Tandem")
        self.conversation_list.select(conversation.id if conversation else None)
        self.status.show_record(self._last_answer_stats(conversation))

    def _last_answer_stats(self, conversation) -> dict | None:
        """The figures of the opened chat's last answer, for the status bar (None: no answer yet)."""
        if conversation is None:
            return None
        try:
            messages = self.store.messages(conversation.id)
        except HistoryError:
            return None
        answers = [m for m in messages if m.role == "assistant" and m.stats]
        return answers[-1].stats if answers else None

    def export_chat(self) -> Path | None:
        """File → Export chat as Markdown… (ui/chat/export_dialog.py)."""
        return export_chat(self)

    def rename_current(self) -> None:
        if (conv_id := self._current_id()) is not None:
            self.conversation_list.start_rename(conv_id)

    def delete_conversation(self, conv_id: int | None, ask: bool = True) -> None:
        if conv_id is None:
            return
        if ask and not self.confirm_delete(self.store.get_conversation(conv_id).title):
            return
        self.controller.delete(conv_id)

    def confirm_delete(self, title: str) -> bool:
        # Qt has no standard "Delete" button: a button of our own, in the destructive role
        # (Enter still means Cancel, so a chat is never deleted by a stray key).
        box = QMessageBox(QMessageBox.Icon.Warning, "Delete chat",
                          f"Delete “{title}” and all its messages? This cannot be undone.",
                          QMessageBox.StandardButton.Cancel, self)
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        return box.clickedButton() is delete

    # Turns

    def _on_send(self, text: str) -> None:
        self.settings_drawer.flush_prompt()
        controller = self.controller
        if controller.model is None:  # the pair is loading: sent once it is in (_on_loaded)
            self.composer.set_queued(text)
            self.status.showMessage("Your message is sent as soon as the model has loaded.", COPIED_MS)
            return
        taken = controller.edit(text) if self.composer.editing else controller.send(text)
        if taken:
            self.composer.accept_sent()

    def send_starter(self, text: str) -> bool:
        """A starter the empty chat offered (ui/chat/starters.py): a copy task, sent in a chat set to
        STARTER_TEMPERATURE, which the chat says once; the settings drawer shows it and changes it."""
        from dataclasses import replace

        from ui.chat.starters import STARTER_NOTE, STARTER_TEMPERATURE

        controller = self.controller
        if controller.settings.temperature != STARTER_TEMPERATURE:
            controller.update_settings(replace(controller.settings, temperature=STARTER_TEMPERATURE))
            self.settings_drawer.set_values(controller.settings, controller.system_prompt)
        sent = self.send(text)
        pending = controller.pending
        self.chat_view.add_notice(STARTER_NOTE, before=pending.widget if pending is not None else None)
        return sent

    def send(self, text: str) -> bool:
        """Send `text` as if typed and Enter pressed (menus, tests)."""
        self.composer.set_text(text)
        before = self.controller.busy
        self.composer.submit()
        return self.controller.busy and not before

    def edit_last(self) -> None:
        self.edit_message(None)

    def edit_message(self, widget) -> None:
        """Edit a message of yours (`widget`'s; None: the last) in the composer: sent, it is a new
        version of that message, and the one it replaces stays a click away (ui/chat/controller.py)."""
        if not self.controller.busy and (text := self.controller.begin_edit(getattr(widget, "message_id", None))):
            self.composer.begin_edit(text)

    def escape(self) -> None:
        """Esc: stop the answer being written; otherwise leave editing."""
        if self.controller.busy:
            self.controller.stop()
        else:
            self.composer.cancel_edit()

    def copy_last_answer(self) -> None:
        answers = [m for m in self.chat_view.messages() if m.role == "assistant"]
        if answers:
            answers[-1].copy_message()  # says "Copied" on its button and, through chat_view.copied, here
        else:
            self.status.showMessage("There is no answer to copy in this chat yet.", COPIED_MS)

    def _on_copied(self, what: str) -> None:
        self.status.showMessage(f"Copied {what} to the clipboard.", COPIED_MS)

    def _on_stopping(self) -> None:
        """Said at once: the engine ends the answer within a round or a draft step."""
        self.composer.stop_button.setText("Stopping…")
        self.composer.stop_button.setEnabled(False)
        self.status.showMessage("Stopping…")

    def _on_busy(self, busy: bool) -> None:
        if self.status.currentMessage() == "Stopping…":  # the stop has happened (or a new answer began)
            self.status.showMessage("Stopped." if not busy else "", COPIED_MS)
        if busy:  # the figures shown are the previous answer's until this one ends
            self.status.show_record(None)
        self.composer.stop_button.setText("Stop")
        self.composer.stop_button.setEnabled(True)
        self.composer.set_busy(busy)
        self.draft_panel.set_available(not busy and self.controller.model is not None)
        self.regenerate_action.setEnabled(not busy)
        self.edit_action.setEnabled(not busy)

    # The engine

    def _on_pair_requested(self, request: PairRequest) -> None:
        """Say at once what is loading, in the names the user knows, before the worker's first step."""
        target, draft = request.named()
        if draft.kind is DraftKind.AUTO:
            draft = auto_draft(request.target, request.backend or None, request.precision)
        in_use = self._pair_in_use
        # the same target with another draft: only the Draft slot is being changed
        draft_only = (in_use is not None and self.controller.model is not None and in_use.target == request.target
                      and in_use.precision == request.precision and request.backend in ("", in_use.backend))
        self._load = LoadSteps(model_label(target), draft.label, draft_only)
        self._on_progress(f"Loading draft {draft.label} ..." if draft_only else f"Checking {model_label(target)} ...")

    def _on_paired(self, request: PairRequest, _info) -> None:
        self._pair_in_use = request

    def _on_progress(self, message: str) -> None:
        self.composer.set_loading(True)
        shown = self._load.step(message)
        self.status.show_loading(shown.line)
        self.header.show_loading(shown.slot, shown.words)
        self.chat_view.set_greeting_hint(shown.line)

    def _on_loaded(self, info: LoadedModel) -> None:
        self.controller.model = info
        self.header.show_loaded(info)
        self.status.show_loaded(info)
        self.settings_drawer.set_pair_draft(info.draft_words()[0], info.draft.kind)
        self.settings_drawer.set_thinking_switch(info.reasoning)
        self.settings_drawer.set_trees_note(info.trees_note)
        self.composer.set_ready(True)
        self.composer.set_loading(False)
        self.chat_view.set_demo(is_demo_folder(Path(info.folder)))
        self.draft_panel.race_unavailable = (
            f"{info.dtype} sets its speculation when it starts: there is no target alone to race it against"
            if info.remote and not info.remote_switch else "")
        self.draft_panel.set_available(not self.controller.busy)
        self.chat_view.set_greeting_hint(
            f"{ready_words(info)}\nAsk anything: Enter sends, Shift+Enter starts a new line.")
        if (queued := self.composer.queued) is not None:  # written while the pair loaded
            self.composer.set_queued(None)
            self._on_send(queued)

    def _on_smaller_offered(self, request: PairRequest) -> None:
        """The refusal's banner offers to load the same pair at the precision that fits (4-bit)."""
        banner = self.banners.get("pairing")
        if banner is None:
            return
        bits = precision_words(request.precision)
        banner.add_action(f"Load in {bits}", f"Load the same pair with the target's weights in {bits} "
                          "(int4 weight-only, groups of 32): smaller and faster, answers from the 4-bit model",
                          lambda: self.pairing.request_pair.emit(request))

    def _on_load_failed(self, message: str) -> None:
        model = self.controller.model
        self.composer.set_loading(False)
        if self.composer.queued is not None and model is None and not self.pairing.remembered:
            self.composer.set_queued(None)  # kept in the box, unsent: nothing can answer it
            self.status.showMessage("Your message was not sent: no model is loaded.", COPIED_MS)
        if model is None and self.pairing.remembered_failed(message):
            return  # the last session's pair is gone or broken: the demo loads, and a banner says why
        self.banners.add(f"Could not load the model. {message}", "error", "pairing")
        if model is not None:  # the pair in use was never touched: say so, and carry on with it
            self.header.show_loaded(model)
            if self.pairing.trial_text:
                self.header.show_trial(self.pairing.trial_text)
            self.status.show_loaded(model)
            self.status.showMessage(f"Still using {model.describe()}", 8000)
            self.chat_view.set_greeting_hint(f"Still using {model.name}, "
                                             f"draft: {model.draft_words()[0]}.")
            return
        self.header.show_load_failed()
        self.status.show_load_failed()
        self.composer.set_ready(False)
        self.chat_view.set_greeting_hint("No model is loaded.")

    # Quitting

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if not self._closed:
            self._closed = True
            # The answer stops now and keeps what the window showed (the Quit menu, the close box,
            # Ctrl+C and SIGTERM all come here); the window goes at once, the engine ends its round
            # (or prompt chunk, or draft step) behind it.
            self.controller.quitting()
            self.hide()
            QCoreApplication.processEvents()
            self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Stop after the current round, let the thread end, store what was shown, close the history."""
        self.controller.quitting()  # first: nothing below may let the answer run on
        self.worker.interrupt_trial()  # nor a pair trial, nor the wait for a load
        self.settings_drawer.flush_prompt()
        window_state.save(self.app_settings, self, self.splitter, side_panel=self.columns.wanted(PANEL),
                          drawer=self.settings_action.isChecked(), conversation_id=self._current_id())
        if self.pairing.job is not None:  # a partial download is kept and resumes next time
            self.pairing.job.cancel()
            self.pairing.job.wait(5)
        self.aligner.shutdown()  # a job cut short removes what it wrote (or the next one does)
        self.worker.stop()
        self.thread.quit()
        self.thread.wait(QUIT_WAIT_MS)
        self.server_switch.stop()  # the API's requests in flight end within a round
        self.worker.close()  # the engine's own thread: every other client's request ends too
        # The worker's last reports (the Finished of a stopped answer) are queued for this thread:
        # deliver them now, so the answer is stored as the worker ended it.
        QCoreApplication.sendPostedEvents(None, QEvent.Type.MetaCall)
        self.controller.finish_on_quit()
        for signal in (self.worker.text, self.worker.notice, self.worker.finished, self.worker.failed,
                       self.worker.loaded, self.worker.load_failed, self.worker.progress, self.worker.paired,
                       self.worker.trial_done, self.worker.caches_kept):
            try:
                signal.disconnect()  # a worker that outlived the wait must not write to a closed history
            except (RuntimeError, TypeError):
                pass
        self.store.close()
