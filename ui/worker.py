"""The worker: the window's client of the runner service (app/service.py), turning its events
into Qt signals.

The service's own thread does all model work (MLX included) for the life of the loaded pair, for
every client alike (the local server too). This worker lives on a QThread of its own and waits
there for the window's requests; background work (the pair trial, re-timing the target alone)
is handed to the service and reports through signals when done, so a message is never stuck
behind it. Text is coalesced so the GUI repaints at most ~30 times a second whatever the token
rate. The runner fits a conversation into the context itself (its events say when turns were
left out).
"""

from __future__ import annotations

import queue

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.chat.baseline import Timings, conditions_of
from app.chat.context import ContextOverflowError
from app.chat.trace import RoundTrace
from app.engine.events import Finished, Notice, PrefillProgress
from app.engine.sampling import SamplingParams
from app.models.pairing import PairingError
from app.pair_trial import TrialProgress, run_trial
from app.remote.endpoint import RemoteSpec, is_remote
from app.draft_choice import AUTO_DRAFT, NO_DRAFT, DraftChoice
from app.runner import BASELINE_TOKENS, ChatRequest, Runner, auto_draft
from app.chat.thinking import THINKING
from app.service import END, RequestHandle, RunnerService, Started, Text, Traced

REPAINT_INTERVAL_S = 1 / 30
log = logging.getLogger(__name__)
QUIT_POLL_S = 0.1  # how often a load's wait checks whether the window is quitting (and passes on its steps)


@dataclass(frozen=True)
class RaceResult:
    alone: Finished
    speculative: Finished
    greedy: bool  # at temperature 0 the two texts must be identical

    @property
    def ratio(self) -> float:
        a, s = self.alone.stats.tokens_per_s, self.speculative.stats.tokens_per_s
        return s / a if a > 0 else 0.0

    @property
    def identical(self) -> bool:
        return self.alone.text == self.speculative.text

    def to_dict(self) -> dict:
        """What the history keeps of a race (ui.panel.race_dialog reads it: the line under the
        question, and the dialog opened again from it, both answers' texts included)."""
        def side(finished: Finished) -> dict:
            s = finished.stats
            return {"tokens": s.tokens, "tokens_per_s": round(s.tokens_per_s, 3), "decode_s": round(s.decode_s, 4),
                    "drafted": s.drafted, "acceptance": round(s.acceptance_rate, 4),
                    "tokens_per_round": round(s.tokens_per_round, 3), "text": finished.text}

        return {"ratio": round(self.ratio, 4), "greedy": self.greedy, "identical": self.identical,
                "alone": side(self.alone), "speculative": side(self.speculative)}


@dataclass(frozen=True)
class PairRequest:
    """A pair to load. `target`/`draft` are what the runner loads (a path or "demo", a DraftChoice);
    the names are how the user named them (a hub id rather than its cache folder), for recents."""

    target: str
    draft: DraftChoice = AUTO_DRAFT
    backend: str = ""
    target_name: str = ""
    draft_name: DraftChoice | None = None
    # A new target dropped beside the current draft model: when their tokenizers differ, load the
    # target with prompt lookup (and say so) instead of refusing the target the user asked for.
    keep_draft: bool = False
    precision: str = "auto"  # the target's ("int4" when the user took a refusal's offer to load it in 4-bit)
    context: int | None = None  # the most tokens a chat may hold (None: the model's own, or what memory holds)
    # a server's address as the target (app/remote/): which of its models, the CA file of a
    # self-signed one, and a key typed for this load only (else the kept one is used)
    remote_model: str = ""
    ca_file: str = ""
    remote_key: str | None = field(default=None, repr=False, compare=False)

    def named(self) -> tuple[str, DraftChoice]:
        return self.target_name or self.target, self.draft_name or self.draft


class EngineWorker(QObject):
    progress = Signal(str)  # loading steps, for the status line
    loaded = Signal(object)  # app.runner.LoadedModel
    load_failed = Signal(str)
    smaller_offered = Signal(object)  # after a load_failed: the same PairRequest at a precision that fits
    unloaded = Signal()  # no pair is loaded any more (before a load_failed)
    notice = Signal(str)  # something the user should know about this answer (context fitting, plain decoding)
    text = Signal(str)  # coalesced text deltas of the answer being written
    thinking = Signal(str)  # coalesced deltas of a reasoning model's thinking, before the answer
    rounds = Signal(list)  # coalesced app.chat.trace.RoundTrace, for the side panel
    finished = Signal(object)  # app.engine.events.Finished
    failed = Signal(str)  # a message for the user; nothing was generated after it
    baseline = Signal(object)  # app.chat.baseline.Timings: the target alone's timings so far
    # the timings the answer starting now is measured against (app.chat.baseline.Baseline), or None
    # and why there are none (no timing at its settings or in its context region)
    answer_baseline = Signal(object, str)
    prefill_progress = Signal(int, int)  # parts of a long prompt read, of all its parts (app/engine/prefill.py)
    answering = Signal(object)  # app.runner.LoadedModel: the pair that writes the answer starting now
    race_done = Signal(object)  # RaceResult
    caches_kept = Signal(str)  # other chats' caches set aside, in words ("" for none)
    race_text = Signal(int, str)  # side (0: the target alone, 1: speculative), coalesced text deltas
    race_side_done = Signal(int, object)  # side, its app.engine.events.Finished
    race_failed = Signal(str)
    paired = Signal(object, object)  # the PairRequest as loaded (its draft may have fallen back), LoadedModel
    pair_notice = Signal(str)  # about the pair, not an answer: shown as a banner
    trial_done = Signal(object, object)  # PairRequest, app.models.pair_memory.TrialResult or None (interrupted)
    # other clients' requests (the local server), so the side panel shows their rounds too:
    traffic_started = Signal(int, str, str)  # the request's number, its client, its sampling (conditions_of)
    traffic_rounds = Signal(int, list)  # number, coalesced RoundTrace
    traffic_finished = Signal(int, object)  # number, its Finished (None when it failed)

    CLIENT = "window"  # the service's name for this client (its turns, its requests)

    def __init__(self, runner: Runner | None = None, service: RunnerService | None = None):
        super().__init__()
        self.service = service or RunnerService(runner)
        # Set (from the GUI thread) while a real request waits or runs: background work on the
        # engine (the pair trial, re-timing the target alone) gives way at once and resumes later.
        # (The service also makes it give way to any other client's request.)
        self._engine_wanted = threading.Event()
        self._quitting = threading.Event()  # the window is going: a load is not waited for
        self.engine_stopped = True  # False when quitting left the engine's thread in a pass (a load)
        self._trial: tuple[PairRequest, TrialProgress] | None = None  # a trial still to finish
        self._trial_running = False  # a part of it is with the service now
        self._handle: RequestHandle | None = None  # the window's request being answered
        self._racing: ChatRequest | None = None  # a race's request: Stop also reaches it between its sides
        self.timings = Timings()  # of the pair loaded now
        # Called on the service's thread around each timing of the target alone, True then False:
        # work beside the pair that answers pause for (an alignment job) pauses for it too.
        self.hold_for_timing: Callable[[bool], None] = lambda timing: None
        self._traffic: dict[int, tuple[list[RoundTrace], float]] = {}  # other clients' answers: rounds unsent
        self.service.watchers.append(self._watch)

    def _watch(self, handle: RequestHandle, event) -> None:
        """On the service's thread: another client's request, passed on as the window's own are
        (rounds coalesced to ~30 updates a second)."""
        if handle.client == self.CLIENT:
            return
        number = handle.number
        if isinstance(event, Started):
            self._traffic[number] = ([], time.perf_counter())
            self.traffic_started.emit(number, handle.client, conditions_of(handle.request.params))
        elif isinstance(event, Traced) and number in self._traffic:
            pending, last = self._traffic[number]
            pending.append(event.trace)
            if time.perf_counter() - last >= REPAINT_INTERVAL_S:
                self.traffic_rounds.emit(number, list(pending))
                self._traffic[number] = ([], time.perf_counter())
        elif (isinstance(event, Finished) or event is END) and number in self._traffic:
            pending, _ = self._traffic.pop(number)
            if pending:
                self.traffic_rounds.emit(number, pending)
            self.traffic_finished.emit(number, event if isinstance(event, Finished) else None)

    @property
    def runner(self) -> Runner:
        return self.service.runner

    def stop(self) -> None:
        """Called from the GUI thread: the window's request running now stops between rounds or
        draft steps (a server request running beside it is not touched)."""
        handle, racing = self._handle, self._racing
        if handle is not None:
            handle.cancel()
        if racing is not None:
            racing.cancel.cancel()

    def set_engine_wanted(self, wanted: bool) -> None:
        """Called from the GUI thread: a real request is queued or running (True), or the chat
        is idle again (False; then call `resume_background` on the worker's thread)."""
        if wanted:
            self._engine_wanted.set()
        else:
            self._engine_wanted.clear()

    def interrupt_trial(self) -> None:
        """Called from the GUI thread when quitting: background work ends after its round, and
        a load under way is no longer waited for (nothing of it needs keeping)."""
        self._quitting.set()
        self._engine_wanted.set()
        self.stop()

    def close(self) -> None:
        """When quitting, after the worker's thread has ended: the service stops too (a load in
        progress cannot be cut: `engine_stopped` says whether its thread ended in time)."""
        self.engine_stopped = self.service.close()

    def _give_way(self, service_wants: callable) -> callable:
        return lambda: self._engine_wanted.is_set() or service_wants()

    @Slot()
    def resume_background(self) -> None:
        """The chat is idle: finish a pair trial that gave way to a message."""
        if self._trial is not None and not self._trial_running and not self._engine_wanted.is_set():
            self._continue_trial()

    def _load(self, request: PairRequest, draft: DraftChoice):
        # The load's steps are said on the service's thread; emitted there, they reached the window
        # only when the load ended (measured: a 10 s load's lines all at its end). They go through
        # this queue and are emitted from the worker's own thread while it waits, as its other
        # signals are.
        said: queue.SimpleQueue[str] = queue.SimpleQueue()
        target = request.target
        if is_remote(target):
            ca_file = Path(request.ca_file) if request.ca_file else None
            target = RemoteSpec(target, request.remote_model or None, ca_file, request.remote_key)
        future = self.service.load(target, request.backend or None, draft=draft, precision=request.precision,
                                   context=request.context, client=self.CLIENT, progress=said.put)
        while True:  # a quitting window does not wait out a load (minutes for a large model)
            try:
                return future.result(timeout=QUIT_POLL_S)
            except FutureTimeout:
                if self._quitting.is_set():
                    raise RuntimeError("Tandem is quitting: the load was left unfinished.") from None
            finally:
                while not said.empty():
                    self.progress.emit(said.get())

    @Slot(object)
    def load_pair(self, request: PairRequest) -> None:
        """Load a pair; on any failure the current pair stays loaded and load_failed says why."""
        try:
            try:
                info = self._load(request, request.draft)
            except PairingError as exc:
                if not request.keep_draft:
                    raise
                draft_name = request.named()[1]
                # what the target alone is paired with: its own MTP layer where it has one, else prompt lookup
                fallback = auto_draft(request.target, request.backend or None, request.precision)
                info = self._load(request, fallback)
                request = replace(request, draft=fallback, draft_name=fallback)
                self.pair_notice.emit(f"The draft {draft_name} does not fit this target, so it drafts with "
                                      f"{fallback.label} for now. {exc} Drop a draft of the target's family on the "
                                      "Draft slot.")
        except Exception as exc:  # any failure is reported; the previous pair stays loaded
            log.warning("loading %s failed: %s", request.target, exc)
            if self.runner.loaded is None:  # it was unloaded to make room (Runner._check_memory)
                self.unloaded.emit()
            self.load_failed.emit(str(exc))
            fits_at = getattr(exc, "fits_at", None)  # app.models.memory.NotEnoughMemory
            if fits_at:
                draft = getattr(exc, "fits_with_draft", None) or request.draft
                self.smaller_offered.emit(replace(request, precision=fits_at, draft=draft,
                                                  draft_name=None if draft != request.draft else request.draft_name))
            return
        self.timings = Timings()  # a new pair: its own yardstick
        self._trial = None  # a trial of the previous pair says nothing about this one
        self.loaded.emit(info)
        if info.notice:
            self.pair_notice.emit(info.notice)
        self.paired.emit(request, info)
        self.measure_baseline(())
        # and once more, in the background: one timing has no range (the card then gives no verdict),
        # and one 32-token timing here spreads 70-108 tok/s on the demo
        self.measure_baseline((), SamplingParams())

    @Slot(object)
    def trial(self, request: PairRequest) -> None:
        """The quick pair trial (app/pair_trial.py) on the pair just loaded. It gives way to every
        message and finishes between them; trial_done comes once, when it has finished."""
        self._trial = (request, TrialProgress())
        if not self._engine_wanted.is_set():
            self._continue_trial()

    def _continue_trial(self) -> None:
        """Hand the rest of the trial to the service, in the background; it reports when done."""
        trial = self._trial
        request, progress = trial
        self._trial_running = True

        def run(runner: Runner, service_wants) -> object:
            return run_trial(runner, self._give_way(service_wants), progress=progress)

        def done(future: Future) -> None:  # on the service's thread
            self._trial_running = False
            if future.cancelled():
                return
            try:
                result = future.result()
            except Exception:  # a trial is a bonus: its failure must not look like a broken pair
                log.exception("pair trial failed")
                result, progress.gave_way = None, False
            if self._trial is not trial:
                return  # a new pair was loaded meanwhile
            if progress.gave_way:
                return  # resume_background goes on from the next prompt
            self._trial = None
            self.trial_done.emit(request, result)

        self.service.call(run, client=self.CLIENT, background=True).add_done_callback(done)

    @Slot(str, str, object)
    def load(self, spec: str, backend: str, draft: DraftChoice = AUTO_DRAFT) -> None:
        self.load_pair(PairRequest(spec, draft, backend))

    @Slot(object)
    def measure_baseline(self, messages, params: SamplingParams | None = None) -> None:
        """Time the target alone (the speedup's yardstick) after `messages`, or a short chat,
        sampling with `params` as the answers it is compared with do. Asked for with `params` (the
        chat's: between answers, when settings change) it is background work that gives way to a
        waiting request (no sample then); the greedy timing after a load runs in the window's turn."""
        messages = tuple(messages)
        background = params is not None
        params = params or SamplingParams()
        if background and self._engine_wanted.is_set():
            return

        def run(runner: Runner, service_wants=None):
            give_way = self._give_way(service_wants) if service_wants is not None else (lambda: False)
            remote = getattr(runner, "remote", None)  # a test's runner may have none
            if remote is not None and not remote.can_choose_draft():
                # a server that fixes its speculation at start has no target alone to time (the panel says so)
                return None
            self.hold_for_timing(True)
            try:
                return runner.time_target_alone(messages, cancelled=give_way, params=params)
            finally:
                self.hold_for_timing(False)

        def done(future: Future) -> None:  # on the service's thread
            if future.cancelled():
                return
            try:
                timing = future.result()
            except Exception as exc:  # no baseline: the panel says so rather than guess
                log.warning("timing the target alone failed: %s", exc)
                return
            if timing is None:
                return
            seconds, context = timing
            self.timings = self.timings.add(conditions_of(params), seconds, context, BASELINE_TOKENS)
            self.baseline.emit(self.timings)

        self.service.call(run, client=self.CLIENT, background=background).add_done_callback(done)

    def _measured_against(self, request: ChatRequest) -> None:
        """Say which timings of the target alone the answer to `request` is measured against (those
        at its sampling settings, in its context region: app/chat/baseline.py), or why none."""
        conditions = conditions_of(request.params)
        remote = getattr(self.runner, "remote", None)  # a test's runner may have none
        if remote is not None and not remote.can_choose_draft():
            # a server that fixes its speculation at start has no target alone to time
            self.answer_baseline.emit(None, f"{remote.engine} sets its speculation when it starts, so its target "
                                            "alone cannot be timed from here")
            return
        try:  # the prompt as the answer will read it (a few ms of tokenizing, in the request's turn)
            context = self.service.call(lambda runner: runner.prompt_length(runner.fit(request)[0]),
                                        client=self.CLIENT).result()
        except Exception:  # the request itself says what is wrong with it
            self.answer_baseline.emit(None, "the answer could not start")
            return
        baseline = self.timings.for_answer(conditions, context)
        self.answer_baseline.emit(baseline, "" if baseline else self.timings.missing(conditions, context))

    def _submit(self, request: ChatRequest) -> RequestHandle:
        self._handle = self.service.submit(request, client=self.CLIENT)
        return self._handle

    @Slot(object)
    def generate(self, request: ChatRequest) -> None:
        self._measured_against(request)
        pending_text: list[str] = []
        pending_thinking: list[str] = []
        pending_rounds: list[RoundTrace] = []
        answer: list[str] = []  # the answer's text without the thinking: what the history stores
        last_emit = time.perf_counter()

        def flush() -> None:
            nonlocal last_emit
            if pending_thinking:
                self.thinking.emit("".join(pending_thinking))
                pending_thinking.clear()
            if pending_text:
                self.text.emit("".join(pending_text))
                pending_text.clear()
            if pending_rounds:
                self.rounds.emit(list(pending_rounds))
                pending_rounds.clear()
            last_emit = time.perf_counter()

        try:
            for event in self._submit(request).events():
                if isinstance(event, (Traced, Text)):
                    if isinstance(event, Traced):
                        pending_rounds.append(event.trace)
                    for kind, text in event.pieces:
                        (pending_thinking if kind == THINKING else pending_text).append(text)
                        if kind != THINKING:
                            answer.append(text)
                    if time.perf_counter() - last_emit >= REPAINT_INTERVAL_S:
                        flush()
                elif isinstance(event, Started):
                    self.answering.emit(event.loaded)  # the pair that answers: a load may have come first
                elif isinstance(event, Notice):
                    self.notice.emit(event.message)
                elif isinstance(event, PrefillProgress):
                    self.prefill_progress.emit(event.done, event.total)
                elif isinstance(event, Finished):
                    flush()
                    self.finished.emit(replace(event, text="".join(answer)))
                    self.caches_kept.emit(self.service.kept_summary)
        except ContextOverflowError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:
            log.exception("generation failed")
            flush()
            self.failed.emit(f"The answer failed: {exc}")
        finally:
            self._handle = None

    @Slot(object)
    def race(self, request: ChatRequest) -> None:
        """The same request with the target alone, then speculatively, one after the other. Each
        side's text streams out as it is written (race_text), so a race of minutes is watched,
        not waited for; Stop (or cancelling the request) ends it between rounds."""
        self._racing = request
        try:
            fitted = self.service.call(lambda runner: runner.fit(request), client=self.CLIENT)
            request, left_out = fitted.result()  # once for both sides
            if left_out:
                self.notice.emit(left_out)
            runs = []
            for side, drafter in enumerate((NO_DRAFT, request.drafter)):
                finished = self._race_side(side, replace(request, drafter=drafter, draft_tokens=None))
                if finished is None or finished.stats.finish_reason == "cancelled":
                    self.race_failed.emit("The race was stopped.")
                    return
                runs.append(finished)
                if side == 0:
                    self._timed_by_race(request, finished.stats)
                self.race_side_done.emit(side, finished)
        except Exception as exc:
            log.exception("race failed")
            self.race_failed.emit(f"The race failed: {exc}")
            return
        finally:
            self._racing = None
        self.race_done.emit(RaceResult(runs[0], runs[1], request.params.greedy))

    def _timed_by_race(self, request: ChatRequest, stats) -> None:
        """A race's first side is the target alone at the question's settings and context, timed
        as an answer is (through the service, its text shown): one more timing for the answers
        after it, so the card and the next race are measured against the same kind of run."""
        if stats.decode_tokens < BASELINE_TOKENS:  # too short to say much (an early stop token)
            return
        context = stats.prompt_tokens + stats.tokens
        self.timings = self.timings.add(conditions_of(request.params), stats.decode_s / stats.decode_tokens,
                                        context, stats.decode_tokens)
        self.baseline.emit(self.timings)

    def _race_side(self, side: int, request: ChatRequest) -> Finished | None:
        """One side of a race; its text is coalesced as an answer's is (~30 updates a second)."""
        pending: list[str] = []
        last_emit = time.perf_counter()
        finished = None
        try:
            for event in self._submit(request).events():
                if isinstance(event, Traced) and event.round.text:
                    pending.append(event.round.text)
                    if time.perf_counter() - last_emit >= REPAINT_INTERVAL_S:
                        self.race_text.emit(side, "".join(pending))
                        pending.clear()
                        last_emit = time.perf_counter()
                elif isinstance(event, Finished):
                    finished = event
        finally:
            self._handle = None
        if pending:
            self.race_text.emit(side, "".join(pending))
        return finished
