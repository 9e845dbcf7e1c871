"""The window's switch for the local OpenAI-compatible server (app/server/), and its traffic.

The server is one more client of the same runner service the window uses: its requests take
turns with the window's messages. While one is answered, the side panel shows its rounds as it
shows the window's own (when no answer of the window is being written); the status bar says where
the server listens and how many requests it has answered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSettings
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QLabel, QMenu

from app.chat.trace import TurnTrace
from ui.tips import wrap_tip

if TYPE_CHECKING:
    from app.server.host import ApiServer

PORT_KEY = "server/port"
log = logging.getLogger(__name__)


class ServerSwitch(QObject):
    def __init__(self, worker, panel, status_bar, banners, settings: QSettings, menu: QMenu, answering):
        """`answering()`: the window is writing an answer of its own (the panel is showing it)."""
        super().__init__(menu)
        self.worker, self.panel, self.banners, self.settings = worker, panel, banners, settings
        self._answering = answering
        self.server: ApiServer | None = None
        self.served = 0
        self.received = 0  # API requests so far, numbered apart from the window's own answers
        self.shown: int | None = None  # the request whose rounds the panel shows
        self._trace: TurnTrace | None = None  # its trace (the panel may have gone on to the window's own)
        self.action = QAction("Serve the model to other apps (OpenAI API)", menu)
        self.action.setCheckable(True)
        self.action.setToolTip(wrap_tip("Editors and agents (Continue, Zed, aider, scripts) use the loaded pair "
                                        "through an OpenAI-compatible API on this computer, sped up the same way"))
        self.action.toggled.connect(self.set_serving)
        menu.addAction(self.action)
        self.copy_action = menu.addAction("Copy the API's address", self.copy_address)
        self.copy_action.setEnabled(False)
        self.label = QLabel("")
        self.label.hide()
        status_bar.addPermanentWidget(self.label)
        worker.traffic_started.connect(self._on_started)
        worker.traffic_rounds.connect(self._on_rounds)
        worker.traffic_finished.connect(self._on_finished)

    @property
    def port(self) -> int:
        # app.server (FastAPI, uvicorn, pydantic: 0.4 s) is imported when the server is used, not
        # while the window starts: then it took the GIL from the model's load on the engine thread
        from app.server.host import DEFAULT_PORT

        try:
            return int(self.settings.value(PORT_KEY, DEFAULT_PORT))
        except (TypeError, ValueError):
            return DEFAULT_PORT

    def set_serving(self, on: bool) -> None:
        if on and self.server is None:
            from app.server.host import DEFAULT_HOST, ApiServer, ServerError

            try:
                self.server = ApiServer(self.worker.service, DEFAULT_HOST, self.port)
                self.server.start()
            except ServerError as exc:
                self.server = None
                self.banners.add(f"The API could not start: {exc}", "error", "server")
                self.action.setChecked(False)
                return
            self.banners.add(f"Serving the loaded model on {self.server.url} (OpenAI API, this computer only). "
                             "Point an editor or agent at that address; its requests take turns with yours.",
                             "info", "server")
        elif not on and self.server is not None:
            self.server.stop()
            self.server = None
            self.banners.remove("server")  # "Serving the loaded model on ..." is no longer so
        self.copy_action.setEnabled(self.server is not None)
        self._show_label()

    def stop(self) -> None:
        """When quitting: requests in flight end within a round."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def copy_address(self) -> None:
        if self.server is not None:
            QGuiApplication.clipboard().setText(self.server.url)

    def _show_label(self) -> None:
        if self.server is None:
            self.label.hide()
            return
        from app.server.openai_api import model_id

        served = f" · {self.served} served" if self.served else ""
        self.label.setText(f"API on :{self.server.port}{served}")
        name = model_id(self.worker.service) or "(none loaded yet)"
        self.label.setToolTip(wrap_tip(f"OpenAI-compatible API at {self.server.url}, model '{name}'. "
                                       "Server → Copy the API's address puts it on the clipboard."))
        self.label.show()

    # traffic, on the GUI thread

    def _on_started(self, number: int, client: str, conditions: str) -> None:
        self.received += 1  # the service numbers every request, the window's too: the API's count is its own
        if self._answering():
            return  # the panel shows the window's own answer; the server's waits its turn there
        # like for like, as the window's answers (app/chat/baseline.py): timings at the request's own
        # sampling, in the latest region they were taken in (its prompt is not read yet)
        timings = self.panel.timings
        baseline = timings.for_answer(conditions, None)
        why = "" if baseline else timings.missing(conditions, None)
        self.shown, self._trace = number, TurnTrace(baseline=baseline, unmeasured=why)
        self.panel.begin(self._trace, source=f"API request {self.received} ({client})")

    def _showing(self, number: int) -> bool:
        return number == self.shown and self.panel.trace is self._trace

    def _on_rounds(self, number: int, rounds: list) -> None:
        if self._showing(number):
            self._trace.add(rounds)
            self.panel.rounds_added(rounds)

    def _on_finished(self, number: int, finished) -> None:
        if finished is not None:
            self.served += 1
            self._show_label()
        if self._showing(number):
            self.panel.finish_answer()
        if number == self.shown:
            self.shown = self._trace = None
