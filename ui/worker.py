"""The worker: hosts the Qt-free runner on its own QThread and turns its events into signals.

All model work (MLX included) happens on this one thread for the life of the loaded models.
Text is coalesced so the GUI repaints at most ~30 times a second whatever the token rate.
Fitting a conversation into the context happens here too, because counting tokens needs the
tokenizer, which belongs to the runner.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from PySide6.QtCore import QObject, Signal, Slot

from app.chat.context import ContextOverflowError, fit_messages
from app.engine.events import Finished, Notice, Round
from app.runner import DRAFT_AUTO, ChatRequest, Runner

REPAINT_INTERVAL_S = 1 / 30
log = logging.getLogger(__name__)


class EngineWorker(QObject):
    progress = Signal(str)  # loading steps, for the status line
    loaded = Signal(object)  # app.runner.LoadedModel
    load_failed = Signal(str)
    notice = Signal(str)  # something the user should know about this answer (context fitting, plain decoding)
    text = Signal(str)  # coalesced text deltas of the answer being written
    rounds = Signal(list)  # coalesced Round events, for the side panel
    finished = Signal(object)  # app.engine.events.Finished
    failed = Signal(str)  # a message for the user; nothing was generated after it

    def __init__(self, runner: Runner | None = None):
        super().__init__()
        self.runner = runner or Runner()

    def stop(self) -> None:
        """Called from the GUI thread: the generator stops after its current round."""
        self.runner.cancel()

    @Slot(str, str, str)
    def load(self, spec: str, backend: str, draft: str = DRAFT_AUTO) -> None:
        try:
            info = self.runner.load(spec, backend or None, draft=draft or DRAFT_AUTO, progress=self.progress.emit)
        except Exception as exc:  # any failure is reported; the previous pair stays loaded
            log.warning("loading %s failed: %s", spec, exc)
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
            request = self._fit(request)
            for event in self.runner.chat(request):
                if isinstance(event, Round):
                    pending_rounds.append(event)
                    if event.text:
                        pending_text.append(event.text)
                    if time.perf_counter() - last_emit >= REPAINT_INTERVAL_S:
                        flush()
                elif isinstance(event, Notice):
                    self.notice.emit(event.message)
                elif isinstance(event, Finished):
                    flush()
                    self.finished.emit(event)
        except ContextOverflowError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:
            log.exception("generation failed")
            flush()
            self.failed.emit(f"The answer failed: {exc}")

    def _fit(self, request: ChatRequest) -> ChatRequest:
        """Drop the oldest turns (never the system prompt) when the chat outgrows the context."""
        loaded, tokenizer = self.runner.loaded, self.runner.tokenizer
        if loaded is None or tokenizer is None:
            return request  # runner.chat says that no model is loaded
        # Room kept for the answer: what was asked for, but never more than half the context, so
        # a large "max new tokens" does not refuse every message; the answer then ends at the
        # context's end instead.
        room = min(request.max_tokens, loaded.context_length // 2)
        messages, dropped = fit_messages(
            list(request.messages), lambda chunk: len(tokenizer.render_chat(chunk)), loaded.context_length - room
        )
        if not dropped:
            return request
        noun = "message was" if dropped == 1 else "messages were"
        self.notice.emit(f"{dropped} earlier {noun} left out to fit the model's context.")
        return replace(request, messages=tuple(messages))
