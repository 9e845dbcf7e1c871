"""Race mode's wiring: the open chat's last question answered by the target alone, then
speculatively, into a RaceDialog (race_dialog.py); the result kept with the chat, and opened
again from the link under the question it raced (`reopen`)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from ui.panel.race_dialog import RaceDialog


class RaceMode(QObject):
    request = Signal(object)  # ChatRequest: the worker races it

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.dialog: RaceDialog | None = None  # the race running, or the last one run
        self.kept: RaceDialog | None = None  # a race kept with a chat, opened again
        worker = window.worker
        worker.race_done.connect(self._done)
        worker.race_failed.connect(self._failed)
        worker.race_text.connect(self._text)
        worker.race_side_done.connect(self._side_done)
        self.request.connect(worker.race)

    def start(self, at_chat_temperature: bool = False) -> None:
        """At temperature 0 (the exact comparison: both sides must write the same text), or at the
        chat's own temperature where asked (a button in the dialog offers it)."""
        window, controller = self.window, self.window.controller
        if self.dialog is not None and self.dialog.isVisible():
            self.dialog.close()
        request = controller.race_request(None if at_chat_temperature else 0.0)
        if request is None:
            window.banners.add("Race mode needs a loaded model, an idle engine and a chat with a question "
                               "in it: send a message first.", "warning", "race")
            return
        controller.set_racing(True)
        self.dialog = RaceDialog(window, temperature=request.params.temperature)
        self.dialog.finished.connect(self._closed)
        chat = controller.settings.temperature
        if not at_chat_temperature and chat > 0:  # the chat's own temperature, one click away
            self.dialog.offer_rerun(chat, lambda: self.start(at_chat_temperature=True))
        self.dialog.show()
        self.request.emit(request)

    def _running(self) -> bool:
        return self.dialog is not None and self.dialog.running

    def _closed(self) -> None:
        """Close cancels a race still running; the worker then reports it stopped."""
        if self.window.controller.racing and self._running():
            self.window.worker.stop()

    def _text(self, side: int, delta: str) -> None:
        if self._running():
            self.dialog.append_text(side, delta)

    def _side_done(self, side: int, finished) -> None:
        if self._running():
            self.dialog.side_done(side, finished)

    def reopen(self, record: dict) -> None:
        """A race kept with the chat, as it ended; a race running meanwhile is left alone."""
        if self.kept is not None:
            self.kept.close()
        self.kept = RaceDialog.kept(self.window, record)
        self.kept.show()

    def _done(self, result) -> None:
        self.window.controller.set_racing(False)
        record = result.to_dict()
        if self.dialog is not None:  # what the words over the answers say when it is opened again
            record["temperature"] = self.dialog.temperature
        self.window.controller.save_race(record)  # kept with the chat, under the question
        if self.dialog is not None:
            self.dialog.show_result(result)

    def _failed(self, message: str) -> None:
        self.window.controller.set_racing(False)
        if self.dialog is not None:
            self.dialog.show_error(message)
