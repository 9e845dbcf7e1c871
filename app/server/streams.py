"""Each answer the server has in flight, handed from the service's thread to the event loop, and
the set of them (`OpenAnswers`), so that a stopping server ends every one with an error instead
of cutting it off.

A client that goes away cancels its answer, which the engine hears between rounds: a streamed
response learns of it from Starlette; a whole (non-streamed) one waits for the client's
`http.disconnect` beside the answer, so it is heard at once however fast or slowly tokens come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.chat.thinking import ANSWER, THINKING
from app.engine.events import Finished
from app.runner import ChatRequest
from app.server.requests import ApiError
from app.service import END, RequestHandle, RunnerService, Text, Traced

CLIENT = "server"  # the service's name for this client
STOPPING = object()  # put in each open answer's queue when the server stops


class OpenAnswers:
    """The answers in flight on one server (used on its event loop only)."""

    def __init__(self):
        self._open: set[Answer] = set()
        self.stopping = False

    def open(self, service: RunnerService, request: ChatRequest, prompt_tokens: int) -> Answer:
        if self.stopping:
            raise _stopping()
        answer = Answer(service, request, prompt_tokens, self)
        self._open.add(answer)
        return answer

    def stop_all(self) -> None:
        """End every open answer with an error (a stream's last events: the error, then
        [DONE]) and cancel its request; new ones are refused from now on."""
        self.stopping = True
        for answer in list(self._open):
            answer.stop()

    def __len__(self) -> int:
        return len(self._open)

    def _closed(self, answer: Answer) -> None:
        self._open.discard(answer)


class Answer:
    """One request's events, handed from the service's thread to this event loop."""

    def __init__(self, service: RunnerService, request: ChatRequest, prompt_tokens: int, owner: OpenAnswers):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.prompt_tokens = prompt_tokens
        self._owner = owner
        self.handle: RequestHandle = service.submit(request, client=CLIENT, listener=self._hand_over)

    def _hand_over(self, item) -> None:  # on the service's thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop has closed (the server stopped): nobody waits for this answer
            self.handle.request.cancel.cancel()

    def stop(self) -> None:
        self.handle.cancel()
        self.queue.put_nowait(STOPPING)

    def close(self) -> None:
        """The client has what it will get: nothing runs on for nobody."""
        if not self.handle.done.is_set():
            self.handle.cancel()
        self._owner._closed(self)

    async def events(self) -> AsyncIterator[object]:
        """The request's events; its error, or the server's stopping, raised as an ApiError."""
        try:
            while True:
                item = await self.queue.get()
                if item is STOPPING:
                    raise _stopping()
                if item is END:
                    if self.handle.error is not None:
                        raise _engine_error(self.handle.error)
                    return
                yield item
        finally:
            self.close()

    async def whole(self, receive) -> tuple[str, str, Finished | None]:
        """(the answer, a reasoning model's thinking, the Finished), cancelled the moment the
        client disconnects (`receive`: the request's ASGI receive, its body already read)."""
        watch = asyncio.ensure_future(self._cancel_when_gone(receive))
        answer, thinking, finished = [], [], None
        try:
            async for item in self.events():
                if isinstance(item, (Traced, Text)):
                    answer.append(item.part(ANSWER))
                    thinking.append(item.part(THINKING))
                elif isinstance(item, Finished):
                    finished = item
        finally:
            watch.cancel()
        return "".join(answer), "".join(thinking), finished

    async def _cancel_when_gone(self, receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass  # after the body, a server sends nothing else
        except Exception:  # noqa: BLE001 - a receive that fails has lost its client as well
            pass
        self.handle.cancel()


def _stopping() -> ApiError:
    return ApiError(503, "Tandem's server is stopping, so this answer ends here: send the request again once "
                         "it is back.", type_="server_error", code="server_stopping")


def _engine_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ValueError):  # the prompt, the context: the request's fault
        return ApiError(400, str(exc), code="context_length_exceeded" if "context" in str(exc) else None)
    return ApiError(500, f"The answer failed: {exc}", type_="server_error")
