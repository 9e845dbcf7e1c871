"""One chat turn at a time, between the history store, the worker and the chat view.

Every answer is in the history from the moment it is asked for: `begin_answer` (or the
regenerate / edit equivalents) stores the user's message and an empty answer marked
'interrupted' in one transaction, and `finish_answer` writes the text, status, settings and
stats when the worker reports the end. So a crash or a kill never loses the question, and
keeps the answer marked as unfinished.

An answer keeps streaming into its own chat while the user opens another one; the view only
shows it when its chat is open.

Regenerate adds a version of the last answer and keeps the earlier ones (‹ 1/2 › under the
answer); the version on screen is the one the model reads next. Edit does the same for any
message of yours: the new text is a new version of it, and the version it replaces stays, with
the answers that followed it, one click away (‹ 1/2 › under the message), as in ChatGPT.

An answer the history cannot store (locked by another program, disk full, read-only folder) stays
on screen and in memory, the window says so, and the write is tried again every few seconds and
at quit until it is stored.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass, replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat.baseline import Baseline, Timings, conditions_of
from app.chat.history import BUSY_TIMEOUT_S, Conversation, HistoryError, HistoryStore, HistoryWriteError, Message
from app.chat.recovery import write_recovery
from app.chat.settings import ChatSettings
from app.chat.trace import Reported, TurnTrace, WhoseAnswer
from app.engine.events import Finished, GenerationStats
from app.runner import CancelToken, ChatRequest, LoadedModel
from ui.chat.chat_view import ChatView
from ui.chat.message_widget import MessageWidget
from ui.header import draft_text, target_text
from ui.panel.race_dialog import race_notice
from ui.worker import EngineWorker


@dataclass
class _Pending:
    """The answer being written."""

    conv_id: int
    answer_id: int
    record: dict  # the settings it is made with, stored with it
    trace: TurnTrace  # its rounds, for the side panel and the history
    text: str = ""
    thinking: str = ""  # a reasoning model's thinking before the answer
    widget: MessageWidget | None = None  # None while its chat is not on screen
    discarded: bool = False  # its chat was deleted: nothing to store
    version: int | None = None  # which version of the answer this is (None: the one on screen)


@dataclass(frozen=True)
class _Unsaved:
    """A finished answer the history could not store yet: what `finish_answer` is retried with."""

    conv_id: int
    answer_id: int
    version: int | None
    text: str
    status: str
    record: dict
    stats: dict
    trace: dict | None
    thinking: str = ""


QUOTED_CHARS = 40  # of the question, where the side panel names an older answer
RETRY_INTERVAL_MS = 3000  # an unsaved answer is tried again this often
RETRY_WAIT_S = 0.05  # and waits at most this long for a lock each time: the window stays responsive
log = logging.getLogger(__name__)


class ChatController(QObject):
    request_generate = Signal(object)  # ChatRequest, to the worker's thread
    busy_changed = Signal(bool)
    conversations_changed = Signal()  # titles or order changed: the list reloads
    conversation_opened = Signal(object)  # Conversation, or None for a new chat not yet stored
    answer_finished = Signal(object)  # GenerationStats
    error = Signal(str)  # the history could not be written
    saved = Signal(str)  # answers the history refused earlier are stored now (a line for the status bar)
    # TurnTrace (or None) of the answer the side panel should show, and whose it is when not the
    # chat's latest ("the answer to “…”", for one clicked further up)
    trace_shown = Signal(object, str)
    trace_rounds = Signal(list)  # RoundTrace just added to the trace shown (the live answer's)
    race_opened = Signal(dict)  # a race kept with the chat, to open again (its link under the question)
    # messages, SamplingParams: time the target alone at this context and these settings
    request_baseline = Signal(object, object)
    stopping = Signal()  # Stop was pressed: the answer ends within a round

    def __init__(self, store: HistoryStore, worker: EngineWorker, view: ChatView, defaults: ChatSettings,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.store, self.worker, self.view = store, worker, view
        self.defaults = defaults
        self.current: Conversation | None = None
        self.settings = defaults  # of the open chat (or of the new chat until its first message)
        self.system_prompt = ""
        self.model: LoadedModel | None = None
        self.pending: _Pending | None = None
        self._cancel: CancelToken | None = None  # the running answer's Stop
        self.timings = Timings()  # the target alone's timings, by settings and context
        self.racing = False
        self.editing: int | None = None  # the message of yours the composer's text replaces (None: the last)
        self._panel_trace: TurnTrace | None = None  # what the side panel shows (trace_shown)
        self.race_question: tuple[int, int] | None = None  # (chat, message id) of the question raced
        self.unsaved: dict[tuple[int, int | None], _Unsaved] = {}  # (answer id, version): not stored yet
        self._retry = QTimer(self)
        self._retry.setInterval(RETRY_INTERVAL_MS)
        self._retry.timeout.connect(self.save_unsaved)
        self.closing = False  # the window is quitting: an answer cut now is 'interrupted', not 'stopped'
        self.request_generate.connect(worker.generate)
        worker.text.connect(self._on_text)
        worker.thinking.connect(self._on_thinking)
        worker.rounds.connect(self._on_rounds)
        worker.baseline.connect(self._on_baseline)
        worker.answer_baseline.connect(self._on_answer_baseline)
        worker.paired.connect(self._on_paired)
        self.request_baseline.connect(worker.measure_baseline)
        worker.notice.connect(self._on_notice)
        worker.prefill_progress.connect(self._on_prefill)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.answering.connect(self._on_answering)
        view.regenerate_requested.connect(self.regenerate)
        view.version_requested.connect(self.show_version)
        view.answer_clicked.connect(self.show_answer)

    @property
    def busy(self) -> bool:
        return self.pending is not None or self.racing

    def set_racing(self, racing: bool) -> None:
        """Race mode has the engine: no answer can start meanwhile."""
        self.racing = racing
        self._set_busy(self.busy)

    def race_request(self, temperature: float | None = 0.0) -> ChatRequest | None:
        """The open chat up to its last question, with its settings, for race mode: at temperature
        0 unless asked (the exact comparison: both sides must write the same text; above 0 they
        are two samples, and their lengths alone make the ratio noise), None for the chat's own."""
        if self.busy or self.model is None or self.current is None:
            return None
        history = self._history(self.current.id)
        while history and history[-1]["role"] != "user":
            history.pop()
        if not history:
            return None
        questions = [m for m in self.store.messages(self.current.id) if m.role == "user"]
        self.race_question = (self.current.id, questions[-1].id) if questions else None
        request = self._request(history)
        if temperature is None:
            return request
        return replace(request, params=replace(request.params, temperature=temperature))

    def save_race(self, record: dict) -> None:
        """A finished race, kept with the question it raced and shown under it (now and whenever
        the chat is opened again)."""
        if self.race_question is None:
            return
        conv_id, question_id = self.race_question
        if self.model is not None:
            record = record | {"target": target_text(self.model)[0], "draft": draft_text(self.model)[0]}
        if self._write(self.store.save_race, question_id, record) and self.current is not None \
                and self.current.id == conv_id and not self.busy:
            self._show()

    def _history(self, conv_id: int, leave_out: int | None = None) -> list[dict]:
        """The chat as the model reads it: the system prompt, then every message but `leave_out`
        and failed (empty) answers."""
        history = [m.as_chat() for m in map(self._as_shown, self.store.messages(conv_id))
                   if m.id != leave_out and (m.role == "user" or m.content)]
        if self.system_prompt.strip():
            history.insert(0, {"role": "system", "content": self.system_prompt})
        return history

    def _request(self, history: list[dict]) -> ChatRequest:
        s = self.settings
        return ChatRequest(tuple(history), max_tokens=s.max_tokens, params=s.sampling(),
                           draft_tokens=s.draft_tokens, trees=s.trees, drafter=s.drafter, thinking=s.thinking,
                           conversation=f"chat {self.current.id}" if self.current is not None else "")

    # Opening chats

    def open(self, conv_id: int | None) -> None:
        conversation = None
        if conv_id is not None:
            try:
                conversation = self.store.get_conversation(conv_id)
            except HistoryError:
                conversation = None  # deleted meanwhile: a new chat instead
        self.current = conversation
        self.editing = None  # a message of the chat left
        if conversation is None:
            self.settings, self.system_prompt = self.defaults, ""
        else:
            self.settings = ChatSettings.from_dict(conversation.settings, base=self.defaults)
            self.system_prompt = conversation.system_prompt
        self._show()
        self.conversation_opened.emit(conversation)
        self._time_at_settings()

    def new_chat(self) -> None:
        self.open(None)

    def _show(self) -> None:
        if self.pending is not None:
            self.pending.widget = None  # the view is about to delete it
        self.view.clear()
        if self.current is None:
            self._panel(None)
            return
        shown = None
        messages = [self._as_shown(m) for m in self.store.messages(self.current.id)]
        for at, message in enumerate(messages):
            widget = self._add_widget(message)
            if message.role == "user" and (race := (message.stats or {}).get("race")):
                # a race of this question, under it, and a link that opens it again
                notice = self.view.add_notice(race_notice(race), link="Show the race")
                notice.linkActivated.connect(lambda _link, race=race: self.race_opened.emit(race))
            if message.role == "assistant":
                shown = _trace_of(messages, at)
            if self.pending is not None and message.id == self.pending.answer_id:
                self._attach(widget)
                shown = self.pending.trace
        self.view.refresh_actions()
        self._panel(shown)

    def _panel(self, trace: TurnTrace | None, source: str = "") -> None:
        self._panel_trace = trace
        self.trace_shown.emit(trace, source)

    def show_answer(self, widget: MessageWidget) -> None:
        """An answer clicked in the chat: the side panel shows its rounds as the history keeps
        them with it (the answer being written: live, as it goes on)."""
        if self.current is None or widget.role != "assistant" or getattr(widget, "message_id", None) is None:
            return
        if self.pending is not None and widget is self.pending.widget:
            self._panel(self.pending.trace)
            return
        messages = [self._as_shown(m) for m in self.store.messages(self.current.id)]
        at = next((i for i, m in enumerate(messages) if m.id == widget.message_id), None)
        if at is not None:
            self._panel(_trace_of(messages, at), _whose(messages, at))

    def _add_widget(self, message: Message) -> MessageWidget:
        error = (message.stats or {}).get("error", "") if message.status == "error" else ""
        trace = TurnTrace.from_dict(message.trace) if message.role == "assistant" else None
        stats = message.stats if message.role == "assistant" else None  # a question's holds its race
        widget = self.view.add_message(message.role, message.content, message.status, stats, error,
                                       spans=trace.spans() if trace else None)
        widget.message_id = message.id
        if message.role == "user":
            widget.set_versions(message.branch, message.branches)
        else:
            widget.set_versions(message.version, message.versions)
        if message.thinking:
            widget.set_thinking(message.thinking, done=True)
        return widget

    def _as_shown(self, message: Message) -> Message:
        """The message as the user saw it: an answer not stored yet is read from memory."""
        unsaved = self.unsaved.get((message.id, message.version)) or self.unsaved.get((message.id, None))
        if unsaved is None:
            return message
        return replace(message, content=unsaved.text, status=unsaved.status, settings=unsaved.record,
                       stats=unsaved.stats, trace=unsaved.trace, thinking=unsaved.thinking)

    # Versions of an answer

    def show_version(self, widget: MessageWidget, number: int) -> None:
        """‹ / ›: show another version of an answer, or of a message of yours with the answers that
        followed it; the chat reads that one from now on."""
        if self.busy or getattr(widget, "message_id", None) is None:
            return
        if widget.role == "user":
            self._show_branch(widget.message_id, number)
            return
        try:
            message = self._as_shown(self.store.show_version(widget.message_id, number))
        except HistoryError as exc:
            self.error.emit(str(exc))
            return
        messages = [self._as_shown(m) for m in self.store.messages(self.current.id)] if self.current else []
        at = next((i for i, m in enumerate(messages) if m.id == message.id), None)
        trace = _trace_of(messages, at) if at is not None else TurnTrace.from_dict(message.trace)
        error = (message.stats or {}).get("error", "") if message.status == "error" else ""
        widget.set_spans(trace.spans() if trace else [])
        widget.set_thinking(message.thinking, done=True)  # each version has its own (or none)
        widget.finish(message.content, message.status, message.stats, error)
        widget.set_versions(message.version, message.versions)
        self._panel(trace, _whose(messages, at) if at is not None else "")

    def _show_branch(self, message_id: int, number: int) -> None:
        try:
            self.store.show_branch(message_id, number)
        except HistoryError as exc:
            self.error.emit(str(exc))
            return
        with self.view.keeping_place():  # the messages above it stay as they were
            self._show()

    def _attach(self, widget: MessageWidget) -> None:
        """Show the pending answer in `widget`, with what was written so far."""
        self.pending.widget = widget
        widget.set_stats(None)
        widget.set_status("complete")
        widget.set_thinking(self.pending.thinking, done=False)
        widget.set_text(self.pending.text)
        widget.set_streaming()

    # Chat details

    def update_settings(self, settings: ChatSettings) -> None:
        self.settings = settings
        if self.current is not None:
            self._write(self.store.set_settings, self.current.id, settings.to_dict())
        self._time_at_settings()

    def update_system_prompt(self, text: str) -> None:
        self.system_prompt = text
        if self.current is not None:
            self._write(self.store.set_system_prompt, self.current.id, text)

    def rename(self, conv_id: int, title: str) -> None:
        if title:
            self._write(self.store.rename, conv_id, title)
        self.conversations_changed.emit()  # also puts the old name back when the new one was refused

    def delete(self, conv_id: int) -> None:
        if self.pending is not None and self.pending.conv_id == conv_id:
            self.pending.discarded = True
            self.worker.stop()
        self.unsaved = {key: u for key, u in self.unsaved.items() if u.conv_id != conv_id}
        self._write(self.store.delete_conversation, conv_id)
        if self.current is not None and self.current.id == conv_id:
            self.new_chat()
        self.conversations_changed.emit()

    def last_user_text(self) -> str:
        if self.current is None:
            return ""
        users = [m for m in self.store.messages(self.current.id) if m.role == "user"]
        return users[-1].content if users else ""

    def begin_edit(self, message_id: int | None = None) -> str:
        """Edit a message of yours on screen (None: the last): `edit` replaces it; its text, or ""
        where there is none to edit."""
        users = [m for m in self.store.messages(self.current.id) if m.role == "user"] if self.current else []
        if message_id is None:
            message = users[-1] if users else None
        else:
            message = next((m for m in users if m.id == message_id), None)
        self.editing = message.id if message is not None else None
        return message.content if message is not None else ""

    # Turns

    def send(self, text: str) -> bool:
        """Ask for an answer to `text` in the open chat (a new chat is stored now)."""
        if self.busy or self.model is None:
            return False
        try:
            if self.current is None:
                self.current = self.store.create_conversation(
                    system_prompt=self.system_prompt, settings=self.settings.to_dict())
                self.conversation_opened.emit(self.current)
            answer_id = self.store.begin_answer(self.current.id, text)
        except HistoryError as exc:
            self.error.emit(str(exc))
            return False
        self.conversations_changed.emit()  # the first message names the chat and moves it up
        question = self.view.add_message("user", text)
        question.message_id = next((m.id for m in reversed(self.store.messages(self.current.id)) if m.role == "user"),
                                   None)  # its Edit edits it
        widget = self.view.add_message("assistant")
        widget.message_id = answer_id
        self._start(answer_id, 1)
        self._attach(widget)
        return True

    def regenerate(self) -> bool:
        """Write the last answer again, as a new version; the earlier ones are kept."""
        if self.busy or self.model is None or self.current is None:
            return False
        messages = self.store.messages(self.current.id)
        if not messages or messages[-1].role != "assistant":
            return False
        try:
            answer = self.store.add_answer_version(self.current.id)
        except HistoryError as exc:
            self.error.emit(str(exc))
            return False
        self._start(answer.id, answer.version)
        widget = self.view.last_message()
        widget.set_versions(answer.version, answer.versions)
        self._attach(widget)
        return True

    def edit(self, text: str) -> bool:
        """Send `text` in place of the message of yours being edited (`begin_edit`; else the last)
        and ask again; the version it replaces stays, with what followed it, a branch away."""
        if self.busy or self.model is None or self.current is None:
            return False
        try:
            if self.editing is None:
                _, answer = self.store.edit_last_user(self.current.id, text, "", "interrupted")
            else:
                _, answer = self.store.edit_user(self.editing, text, "", "interrupted")
        except HistoryError as exc:
            self.error.emit(str(exc))
            return False
        self.editing = None
        self.conversations_changed.emit()
        self._start(answer.id, answer.version)
        self._show()
        return True

    def stop(self) -> None:
        """Stop the answer being written: its own token, set now, so a Stop pressed the instant
        after Send still reaches it; the engine checks it between rounds and draft steps."""
        if self.busy:
            if self._cancel is not None:
                self._cancel.cancel()
            self.worker.stop()  # race mode's requests are the worker's own
            self.stopping.emit()

    def _start(self, answer_id: int, version: int | None = None) -> None:
        conv_id = self.current.id
        history = self._history(conv_id, leave_out=answer_id)
        settings = self.settings
        # The pair that writes it is recorded when the worker starts it (`answering`): a pair
        # loading now, when the message is sent, answers instead of the one loaded now.
        record = settings.to_dict() | {"system_prompt": self.system_prompt}
        # its baseline comes with the worker's answer_baseline, before its first round
        question = history[-1]["content"] if history and history[-1]["role"] == "user" else ""
        self.pending = _Pending(conv_id, answer_id, record, TurnTrace(whose=WhoseAnswer(question)), version=version)
        self._panel(self.pending.trace)
        self._set_busy(True)
        request = self._request(history)
        self._cancel = request.cancel
        self.request_generate.emit(request)

    # The worker's reports

    def _on_answering(self, info: LoadedModel | None) -> None:
        if self.pending is not None and info is not None:
            self.pending.record |= {"target": target_text(info)[0], "draft": draft_text(info)[0],
                                    "backend": info.backend, "device": info.device}
            trace = self.pending.trace
            trace.whose = replace(trace.whose, target=self.pending.record["target"], draft=self.pending.record["draft"])

    def quitting(self) -> None:
        """The window is quitting: the answer stops now, and what it stores is what was shown,
        so reports still on their way (the rest of a round, a last round) are left out."""
        self.closing = True
        if self._cancel is not None:
            self._cancel.cancel()

    def _on_thinking(self, delta: str) -> None:
        if self.closing:
            return
        if self.pending is not None:
            self.pending.thinking += delta
            if self.pending.widget is not None:
                self.pending.widget.stream_thinking(delta)

    def _on_text(self, delta: str) -> None:
        if self.closing:  # never shown: the window is going
            return
        if self.pending is not None:
            self.pending.text += delta
            if self.pending.widget is not None:
                if self.pending.widget.status_tag.text().startswith("Reading your message"):
                    self.pending.widget.status_tag.setText("Writing…")  # the prompt is read
                self.pending.widget.stream(delta)

    def _on_rounds(self, rounds: list) -> None:
        if self.closing:
            return
        if self.pending is not None:
            self.pending.trace.add(rounds)
            # only while the panel shows it: not while its chat is closed, nor while the user
            # looks at an older answer's rounds (they would be added to that answer's rows)
            if self._panel_trace is self.pending.trace:
                self.trace_rounds.emit(rounds)

    def _on_baseline(self, timings: Timings) -> None:
        self.timings = timings

    def _on_answer_baseline(self, baseline: Baseline | None, why: str) -> None:
        """The timings the answer being written is measured against (like for like:
        app/chat/baseline.py), or why there are none; the panel shows them from its next round."""
        if self.pending is not None:
            self.pending.trace.baseline, self.pending.trace.unmeasured = baseline, why

    def _on_paired(self, _request, _info) -> None:
        """A pair loaded: the worker times it greedily; time it at this chat's settings too."""
        if not self.settings.sampling().greedy:
            self.request_baseline.emit((), self.settings.sampling())

    def _time_at_settings(self) -> None:
        """Settings the target alone was never timed at: time it now (in the background, giving way
        to a message), so the next answer has a like-for-like speedup."""
        params = self.settings.sampling()
        if self.model is not None and not self.busy and not self.timings.has(conditions_of(params)):
            messages = [m.as_chat() for m in self.store.messages(self.current.id) if m.content] if self.current else []
            self.request_baseline.emit(tuple(messages) or (), params)

    def _on_prefill(self, done: int, total: int) -> None:
        """A long message being read before the first token: its tag says how far (a 7,600-token
        prompt once showed nothing for over a minute)."""
        if self.pending is not None and self.pending.widget is not None and not self.closing:
            self.pending.widget.status_tag.setText(f"Reading your message: part {done + 1} of {total}…")

    def _on_notice(self, message: str) -> None:
        if self.pending is not None and self.pending.widget is not None:
            self.view.add_notice(message, before=self.pending.widget)

    def _on_finished(self, event: Finished) -> None:
        if self.closing:  # quitting: exactly what was shown, marked interrupted (finish_on_quit)
            return
        status = "complete"
        if event.stats.finish_reason == "cancelled":
            status = "stopped"
        pending = self.pending
        remote = self.model is not None and bool(self.model.remote)
        if pending is not None and remote and not any(r.chips for r in pending.trace.rounds):
            stats = event.stats  # a server that sends no rounds: its own counts (app/remote/target.py)
            pending.trace.reported = Reported(stats.tokens, stats.drafted, stats.accepted,
                                              stats.accepted_by_position,
                                              stats.drafted_by_position[0] if stats.drafted_by_position else 0)
        if self._finish(event.text, status, stats_record(event.stats)):
            self.answer_finished.emit(event.stats)
            if not pending.discarded:
                # Time the target alone again at the context this chat has reached, between answers
                # (it gives way to the next message): the baseline is sampled in the answers' own
                # conditions, so a machine that slows down slows both sides of the ratio.
                messages = [m.as_chat() for m in self.store.messages(pending.conv_id) if m.content]
                settings = ChatSettings.from_dict(pending.record, self.defaults)  # the answer's own
                self.request_baseline.emit(tuple(messages), settings.sampling())

    def _on_failed(self, message: str) -> None:
        if self.pending is not None:
            self._finish(self.pending.text, "error", {"error": message}, error=message)

    def _finish(self, text: str, status: str, stats: dict, error: str = "") -> bool:
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        try:
            trace = pending.trace.to_dict() if pending.trace.rounds else None
            if not pending.discarded:
                self._store_answer(_Unsaved(pending.conv_id, pending.answer_id, pending.version, text, status,
                                            pending.record, stats, trace, pending.thinking))
            if pending.widget is not None:
                pending.widget.set_spans(pending.trace.spans())
                pending.widget.finish(text, status, stats, error)
        finally:
            self._set_busy(False)  # whatever failed above, the next message can be sent
        return True

    def _store_answer(self, answer: _Unsaved) -> None:
        """Store a finished answer; one the history refuses now is kept and tried again."""
        try:
            self._save(answer)
        except HistoryWriteError as exc:
            self.unsaved[(answer.answer_id, answer.version)] = answer
            self._retry.start()
            self.error.emit(f"{exc} The answer stays in the window, and Tandem saves it as soon as it can "
                            "(it tries every few seconds, and when you quit).")
        except HistoryError as exc:  # its chat is gone: there is nothing to store it in
            self.error.emit(str(exc))

    def _save(self, answer: _Unsaved) -> None:
        self.store.finish_answer(answer.answer_id, answer.text, answer.status, answer.record, answer.stats,
                                 answer.trace, version=answer.version, thinking=answer.thinking)

    def save_unsaved(self, wait_s: float = RETRY_WAIT_S) -> bool:
        """Try again to store the answers the history refused; True when none is left."""
        for key, answer in list(self.unsaved.items()):
            try:
                with self.store.waiting_at_most(wait_s):
                    self._save(answer)
            except HistoryWriteError:
                continue  # still locked, full or read-only: the next try
            except HistoryError:
                log.warning("answer %s could not be saved: it is no longer in the history", answer.answer_id)
            del self.unsaved[key]
            self.saved.emit("The answer kept in the window is now saved in the chat history.")
        if not self.unsaved:
            self._retry.stop()
        return not self.unsaved

    def finish_on_quit(self) -> None:
        """Quitting with an answer under way: it is stored as the window showed it when Quit came,
        marked interrupted (the engine's count of what it wrote after that is no figure of it).
        Then a last try for answers not saved yet."""
        if self.pending is not None:
            self._finish(self.pending.text, "interrupted", {})
        if self.unsaved and not self.save_unsaved(wait_s=BUSY_TIMEOUT_S):
            self._keep_aside()

    def _keep_aside(self) -> None:
        """Quitting while the history still refuses some answers: they go to a JSON file (readable
        by the user only) beside it, else in the cache or the temporary folder (app/chat/recovery.py),
        and stderr says where, so nothing is lost."""
        answers = [asdict(answer) for answer in self.unsaved.values()]
        path, refused = write_recovery(answers, self.store.path)
        if path is not None:
            message = f"Tandem: {len(answers)} answer(s) the chat history refused were saved to {path}"
            log.error("%s", message)
            print(message, file=sys.stderr)
            return
        message = (f"Tandem: {len(answers)} answer(s) could not be saved anywhere ({'; '.join(refused)}); "
                   f"their text follows: {json.dumps([a['text'] for a in answers], ensure_ascii=False)}")
        log.error("%s", message)
        print(message, file=sys.stderr)

    def _set_busy(self, busy: bool) -> None:
        self.view.set_busy(busy)
        self.busy_changed.emit(busy)

    def _write(self, method, *args) -> bool:
        try:
            method(*args)
        except HistoryError as exc:
            self.error.emit(str(exc))
            return False
        return True


def _trace_of(messages: list[Message], at: int) -> TurnTrace | None:
    """The rounds of the answer messages[at] as the history keeps them, and whose answer it is:
    the question before it, and the pair its settings record (for the panel's exports)."""
    trace = TurnTrace.from_dict(messages[at].trace)
    if trace is not None:
        settings = messages[at].settings or {}
        question = next((m.content for m in reversed(messages[:at]) if m.role == "user"), "")
        target, draft = (settings.get(name) for name in ("target", "draft"))
        trace.whose = WhoseAnswer(question, target if isinstance(target, str) else "",
                                  draft if isinstance(draft, str) else "")
    return trace


def _whose(messages: list[Message], at: int) -> str:
    """Which answer the side panel shows, in the user's words, when it is not the chat's latest
    (the version too, where it has several): "version 1 of the answer to “Name a fruit”"."""
    if any(m.role == "assistant" for m in messages[at + 1:]):
        question = next((m.content for m in reversed(messages[:at]) if m.role == "user"), "")
        question = " ".join(question.split())
        quoted = question if len(question) <= QUOTED_CHARS else question[: QUOTED_CHARS - 1] + "…"
        version = f"version {messages[at].version} of " if messages[at].versions > 1 else ""
        return f"{version}the answer to “{quoted}”"
    if messages[at].versions > 1:
        return f"version {messages[at].version} of {messages[at].versions} of the latest answer"
    return ""


def stats_record(stats: GenerationStats) -> dict:
    """What the history keeps about an answer, and what the chat shows under it."""
    return {
        "tokens": stats.tokens, "prompt_tokens": stats.prompt_tokens, "rounds": stats.rounds,
        "decode_tokens": stats.decode_tokens, "drafted": stats.drafted, "accepted": stats.accepted,
        "acceptance": round(stats.acceptance_rate, 4), "tokens_per_s": round(stats.tokens_per_s, 2),
        "tokens_per_round": round(stats.tokens_per_round, 3), "prefill_s": round(stats.prefill_s, 4),
        "decode_s": round(stats.decode_s, 4), "finish_reason": stats.finish_reason,
        "reused_tokens": stats.reused_tokens,
    }
