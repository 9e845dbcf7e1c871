"""The worker: hosts the Qt-free runner on its own QThread and turns its events into signals.

All model work (MLX included) happens on this one thread for the life of the loaded models.
Text is coalesced so the GUI repaints at most ~30 times a second whatever the token rate.
"""

from __future__ import annotations

import time
import traceback

from PySide6.QtCore import QObject, Signal, Slot

from app.engine.events import Finished, Round
from app.runner import ChatRequest, Runner

REPAINT_INTERVAL_S = 1 / 30


class EngineWorker(QObject):
    progress = Signal(str)
    loaded = Signal(object)  # app.runner.LoadedModel
    load_failed = Signal(str)
    text = Signal(str)  # coalesced text deltas of the answer being written
    rounds = Signal(list)  # coalesced Round events, for the side panel
    finished = Signal(object)  # app.engine.events.Finished
    failed = Signal(str)

    def __init__(self, runner: Runner | None = None):
        super().__init__()
        self.runner = runner or Runner()

    def stop(self) -> None:
        """Called from the GUI thread: the generator stops after its current round."""
        self.runner.cancel()

    @Slot(str, str)
    def load(self, spec: str, backend: str) -> None:
        try:
            info = self.runner.load(spec, backend or None, progress=self.progress.emit)
        except Exception as exc:  # any failure is reported; the previous model stays loaded
            self.load_failed.emit(str(exc))
            return
        self.loaded.emit(info)

    @Slot(object)
    def generate(self, request: ChatRequest) -> None:
        pending_text: list[str] = []
        pending_rounds: list[Round] = []
        last_emit = time.perf_counter()

        def flush() -> None:
            nonlocal last_emit
            if pending_text:
                self.text.emit("".join(pending_text))
                pending_text.clear()
            if pending_rounds:
                self.rounds.emit(list(pending_rounds))
                pending_rounds.clear()
            last_emit = time.perf_counter()

        try:
            for event in self.runner.chat(request):
                if isinstance(event, Round):
                    pending_rounds.append(event)
                    if event.text:
                        pending_text.append(event.text)
                    if time.perf_counter() - last_emit >= REPAINT_INTERVAL_S:
                        flush()
                elif isinstance(event, Finished):
                    flush()
                    self.finished.emit(event)
        except Exception as exc:
            flush()
            self.failed.emit(f"{exc}\n\n{traceback.format_exc(limit=3)}")
