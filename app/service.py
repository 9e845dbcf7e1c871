"""The runner as a service every client shares: the window, the CLI and the local server.

One thread of its own owns the loaded pair for its whole life (MLX streams belong to one thread),
and runs one job at a time:

- requests (`submit`): answered in turn, fairly: clients take turns (round-robin), so thirty
  server requests queued before the window's message do not make it wait for all thirty; within
  one client, first come first served;
- calls (`call`): a function of the runner (load, fit, a timing), in the same turns;
- background calls (`call(..., background=True)`): only when nothing else waits, and they are
  handed a `give_way()` that turns true the moment a request or call is queued.

Each request gets its own `RequestHandle`: its events, its cancel, its result. Cancelling one
never touches another client's. Loading a new pair cancels the requests answered or waiting on the
old one (their handles end "cancelled" with a Notice that says why); the load's progress names them.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace

from app.chat.thinking import ANSWER, THINKING, ThinkingSplitter
from app.chat.trace import trace_round
from app.chat.traced import Text, Traced
from app.engine.events import Finished, GenerationStats, Notice, PrefillProgress, Round
from app.runner import ChatRequest, LoadedModel, Runner

log = logging.getLogger(__name__)
END = object()  # after a request's last event (a listener's cue to read `error`)


@dataclass(frozen=True)
class Started:
    """The request left the queue: `loaded` is the pair that answers it."""

    loaded: LoadedModel | None
    waited_s: float  # in the queue


def cancelled_before_start(prompt_tokens: int = 0) -> Finished:
    """The Finished of a request cancelled before it ran: nothing was written."""
    return Finished(GenerationStats.nothing_written(prompt_tokens), "")


class RequestHandle:
    """One request's own view of the service: its events, in order, and its cancel."""

    def __init__(self, service: RunnerService, request: ChatRequest, client: str, number: int,
                 listener: Callable[[object], None] | None = None):
        self.request = request
        self.client = client
        self.number = number
        self.queued_at = time.perf_counter()
        self.finished: Finished | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._service = service
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        # called on the service's thread with each event, then END (an asyncio client hands them
        # to its loop); with a listener, `events()` is not used
        self._listener = listener

    def __repr__(self) -> str:
        return f"<request {self.number} of {self.client}>"

    def cancel(self) -> None:
        """Stop this request only: between rounds when it runs, at once when it waits."""
        self.request.cancel.cancel()
        self._service._drop_waiting(self)

    @property
    def cancelled(self) -> bool:
        return self.request.cancel.cancelled

    def events(self, timeout: float | None = None) -> Iterator[Started | Notice | PrefillProgress | Traced | Text
                                                               | Finished]:
        """Started, Notices, a long prompt's PrefillProgress, Traced rounds, Text, then one Finished;
        the request's error is raised here, in the client's thread. `timeout`: the longest wait for
        one event (queue.Empty)."""
        while True:
            item = self._events.get(timeout=timeout)
            if item is END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def result(self, timeout: float | None = None) -> Finished:
        """Wait for the answer; its Finished (raises the request's error)."""
        if not self.done.wait(timeout):
            raise TimeoutError(f"{self!r} did not finish within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.finished

    # the service's side

    def _put(self, item) -> None:
        if isinstance(item, Finished):
            self.finished = item
        self._deliver(item)
        self._tell_watchers(item)

    def _end(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()
        self._deliver(END)
        self._tell_watchers(END)

    def _tell_watchers(self, item) -> None:
        for watcher in list(self._service.watchers):
            try:
                watcher(self, item)
            except Exception:  # noqa: BLE001 - a watcher's fault must not end the request
                log.exception("a watcher of the engine failed")

    def _deliver(self, item) -> None:
        if self._listener is not None:
            self._listener(item)
        else:
            self._events.put(item)


@dataclass
class _Job:
    client: str
    handle: RequestHandle | None = None  # a request
    fn: Callable | None = None  # a call: fn(runner) or, in the background, fn(runner, give_way)
    future: Future | None = None
    background: bool = False
    cancels_requests: bool = False  # a load: the requests on the old pair end first


class RunnerService:
    """Owns a Runner on one thread; every client submits to it (see the module's docstring)."""

    def __init__(self, runner: Runner | None = None, name: str = "tandem-engine"):
        self.runner = runner or Runner()
        self._lock = threading.Condition()
        self._waiting: dict[str, deque[_Job]] = {}  # per client, first come first served
        self._turns: deque[str] = deque()  # clients with something waiting, in the order they are served
        self._background: deque[_Job] = deque()
        self._running: _Job | None = None
        self._numbers = itertools.count(1)
        self._closed = False
        self.served = 0  # requests answered (or ended) so far
        # watcher(handle, event) sees every request's events, then END, on the service's thread:
        # the window shows the server's traffic in its side panel this way
        self.watchers: list[Callable[[RequestHandle, object], None]] = []
        # the status bar's words for the caches set aside, taken on the service's thread after
        # each answer (a client reading KeptCaches while the service changes it could see it torn)
        self.kept_summary = ""
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # clients' side

    def submit(self, request: ChatRequest, client: str = "cli",
               listener: Callable[[object], None] | None = None) -> RequestHandle:
        """Queue a chat request; its handle streams the answer (to `listener` where given)."""
        handle = RequestHandle(self, request, client, next(self._numbers), listener)
        self._queue(_Job(client, handle=handle))
        return handle

    def call(self, fn: Callable, client: str = "cli", background: bool = False) -> Future:
        """Run `fn(runner)` on the service's thread in the client's turn; in the background,
        `fn(runner, give_way)` only while nothing else waits. A Future of what it returns."""
        future: Future = Future()
        self._queue(_Job(client, fn=fn, future=future, background=background))
        return future

    def load(self, *args, client: str = "cli", progress: Callable[[str], None] = print, **kwargs) -> Future:
        """Load a pair (Runner.load's arguments). The requests answered or waiting now were
        asked of the old pair: they end, cancelled, and `progress` says which."""
        def run(runner: Runner) -> LoadedModel:
            return runner.load(*args, progress=progress, **kwargs)

        future: Future = Future()
        job = _Job(client, fn=run, future=future, cancels_requests=True)
        stopped = self._cancel_requests("a new pair is loading")
        if stopped:
            progress(f"Stopped {_count(stopped)} to load the new pair.")
        self._queue(job)
        return future

    def wanted(self) -> bool:
        """Something other than background work waits for the engine (closing counts: a
        background job gives way to it, or the thread outlives the process)."""
        with self._lock:
            return self._closed or bool(self._turns)

    def pending(self) -> int:
        """Requests and calls waiting or running, background work aside."""
        with self._lock:
            running = self._running is not None and not self._running.background
            return sum(len(jobs) for jobs in self._waiting.values()) + running

    def close(self, timeout: float = 10.0) -> bool:
        """Cancel everything, let the current round (or prompt chunk) end, stop the thread.
        False when the thread was still running after `timeout` seconds (a pass that cannot be
        cut: a load, one long chunk on a slow machine)."""
        self._cancel_requests("Tandem is closing")
        with self._lock:
            self._closed = True
            for job in [*self._background, *(j for jobs in self._waiting.values() for j in jobs)]:
                if job.future is not None:
                    job.future.cancel()
            self._waiting.clear()
            self._turns.clear()
            self._background.clear()
            self._lock.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # the queue

    def _queue(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("The engine has stopped.")
            if job.background:
                self._background.append(job)
            else:
                self._waiting.setdefault(job.client, deque()).append(job)
                if job.client not in self._turns:
                    self._turns.append(job.client)
            self._lock.notify_all()

    def _next(self) -> _Job | None:
        """The next job in fair turns (None once closed). Called with the lock held."""
        while True:
            if self._closed:
                return None
            if self._turns:
                client = self._turns.popleft()
                jobs = self._waiting[client]
                job = jobs.popleft()
                if jobs:
                    self._turns.append(client)  # its next job waits for the other clients' turns
                else:
                    del self._waiting[client]
                return job
            if self._background:
                return self._background.popleft()
            self._lock.wait()

    def _drop_waiting(self, handle: RequestHandle) -> None:
        """A waiting request that was cancelled leaves the queue now; it ends without running."""
        with self._lock:
            jobs = self._waiting.get(handle.client)
            job = next((j for j in jobs or () if j.handle is handle), None)
            if job is None:
                return  # it runs (the engine sees its token) or has ended
            jobs.remove(job)
            if not jobs:
                del self._waiting[handle.client]
                self._turns.remove(handle.client)
        handle._put(cancelled_before_start())
        handle._end()

    def _cancel_requests(self, why: str) -> list[RequestHandle]:
        """End every request waiting or running (a load, closing): each is told why."""
        with self._lock:
            running = self._running.handle if self._running is not None else None
            waiting = [j.handle for jobs in self._waiting.values() for j in jobs if j.handle is not None]
        stopped = [h for h in (running, *waiting) if h is not None and not h.done.is_set()]
        for handle in stopped:
            handle._put(Notice(f"This request was stopped: {why}."))
            handle.cancel()
        return stopped

    # the service's thread

    def _serve(self) -> None:
        while True:
            with self._lock:
                job = self._next()
                self._running = job
            if job is None:
                self._settle()
                return
            try:
                if job.handle is not None:
                    self._answer(job.handle)
                else:
                    self._run_call(job)
            except BaseException:  # the thread serves on whatever one job did
                log.exception("the engine's job failed")
            finally:
                with self._lock:
                    self._running = None

    def _settle(self) -> None:
        """The thread's last act on closing: its device work finished where it was queued (Runner.settle)."""
        settle = getattr(self.runner, "settle", None)
        if settle is not None:
            try:
                settle()
            except Exception:  # noqa: BLE001 - closing goes on
                log.exception("finishing the engine's device work failed")

    def _run_call(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        try:
            result = job.fn(self.runner, self.wanted) if job.background else job.fn(self.runner)
        except BaseException as exc:  # the client's thread sees it
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)

    def _answer(self, handle: RequestHandle) -> None:
        """Run one request, every event to its handle; a failure ends it with its error."""
        runner = self.runner
        if handle.cancelled:  # cancelled as it left the queue
            handle._put(cancelled_before_start())
            handle._end()
            return
        handle._put(Started(runner.loaded, time.perf_counter() - handle.queued_at))
        first_token_at = None
        error = None
        try:
            token_text = getattr(runner.tokenizer, "token_text", str)
            starts = runner.starts_thinking(handle.request) if hasattr(runner, "starts_thinking") else None
            splitter = ThinkingSplitter(starts) if starts is not None else None
            for event in runner.chat(handle.request):
                if isinstance(event, (Traced, Text)):  # a remote target's rounds come drawn already
                    handle._put(event)
                    continue
                if isinstance(event, Round):
                    now = time.perf_counter()
                    first_token_at = first_token_at or now  # round 0 ends with the first token
                    trace = trace_round(event, token_text, now - first_token_at)
                    if splitter is None:
                        event = Traced(event, trace, ((ANSWER, event.text),) if event.text else ())
                    else:
                        thinking = splitter.phase == THINKING  # it began in the block, or opened it
                        pieces = tuple(splitter.feed(event.text))
                        thinking = thinking or splitter.phase == THINKING or any(k == THINKING for k, _ in pieces)
                        answer = "".join(text for kind, text in pieces if kind == ANSWER)
                        event = Traced(event, replace(trace, text=answer, thinking=thinking), pieces)
                elif isinstance(event, Finished) and splitter is not None:
                    rest = splitter.finish()
                    if rest:
                        handle._put(Text(tuple(rest)))
                handle._put(event)
        except Exception as exc:  # noqa: BLE001 - the client reports it; the service serves on
            if not isinstance(exc, (ValueError, ConnectionError)):  # a remote server's failure is not a bug here
                log.exception("request %s failed", handle.number)
            error = exc
        finally:
            self.served += 1
            handle._end(error)
            kept = getattr(runner, "kept", None)
            self.kept_summary = kept.summary() if kept is not None else ""


def _count(handles: list[RequestHandle]) -> str:
    """ "2 requests (server, window)" """
    clients = sorted({h.client for h in handles})
    noun = "request" if len(handles) == 1 else "requests"
    return f"{len(handles)} {noun} ({', '.join(clients)})"
