"""How long the server waits for a request to arrive, so slow or stalled clients cannot hold it.

uvicorn times nothing while a request arrives: its keep-alive timeout starts only after a
response, and h11 does no I/O of its own. A connection that sends half a request line, or a body
shorter than its Content-Length, would hold one of the server's few connection slots for ever,
and enough of them lock every other client out (503). So:

- the request line and headers must arrive within `headers_s` of the connection opening (or of
  the next request's first byte on a kept-alive connection);
- a body must keep coming, no more than `body_gap_s` between two pieces and all of it within
  `body_s`: `BodyDeadline`, an ASGI middleware around the app's `receive`;
- while every slot is taken, a new client does not wait those out: the connection that has been
  silent longest, for at least `pressed_gap_s`, while the server waits on it (half a request, a
  body that stopped, an idle kept-alive connection) gives its slot up at once.

The first and the last are `protocol_with_limits`, uvicorn's own h11 protocol with a timer and a
count, passed as `uvicorn.Config(http=...)`. Each ends the request with 408 and OpenAI's error
object, and closes the connection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import h11
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server.requests import ApiError

# A request line and headers are a few hundred bytes that every client sends at once; 10 s is
# generous for any network, and short enough that stalled connections free their slots quickly.
HEADERS_TIMEOUT_S = 10.0
# A slow link pauses between pieces of a body for well under a second; a client that stops for
# 10 s has stalled (or sent a Content-Length longer than its body) and will not resume. No
# longer than the headers' deadline: a stalled body holds a slot no longer than stalled headers.
BODY_GAP_TIMEOUT_S = 10.0
# A whole body (at most MAX_BODY_BYTES, 16 MiB) in 5 minutes is ~55 KB/s: a client trickling a
# byte every few seconds under the gap limit still cannot hold a slot for hours.
BODY_TIMEOUT_S = 300.0
# With every slot taken, a request silent this long gives its slot to a new client: a client
# sending steadily is never silent for a second, even on a slow link.
PRESSED_GAP_S = 1.0


@dataclass(frozen=True)
class ReadLimits:
    """The deadlines for one server, in seconds (tests set them short)."""

    headers_s: float = HEADERS_TIMEOUT_S
    body_gap_s: float = BODY_GAP_TIMEOUT_S
    body_s: float = BODY_TIMEOUT_S
    pressed_gap_s: float = PRESSED_GAP_S


class RequestTimeout(ApiError):
    """A request that did not arrive in time: 408, and the connection closes (what is left of
    the request would be read as the next one)."""

    def __init__(self, message: str):
        super().__init__(408, message, code="request_timeout")

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={"connection": "close"})


def protocol_with_limits(limits: ReadLimits, slots: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol class, with `limits.headers_s` for each request's line and headers,
    and `slots` connections before the stalled ones give way (uvicorn's `limit_concurrency`,
    which answers 503 past it, should be `slots + 1`: it counts the connection asking)."""
    return type("H11WithReadLimits", (_ReadLimitsProtocol,), {"limits": limits, "slots": slots})


class _ReadLimitsProtocol(H11Protocol):
    limits = ReadLimits()
    slots = 64

    def connection_made(self, transport) -> None:
        self._headers_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._heard_at = self.loop.time()
        self._await_headers()
        if len(self.connections) > self.slots:
            self._free_a_slot()

    def data_received(self, data: bytes) -> None:
        self._heard_at = self.loop.time()
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._await_headers()  # a request has begun (or the connection is new): its headers are due
        else:
            self._headers_arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    # The headers' deadline

    def _await_headers(self) -> None:
        if self._headers_timer is None and not self.transport.is_closing():
            self._headers_timer = self.loop.call_later(self.limits.headers_s, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_late(self) -> None:
        self._headers_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.logger.info("Closed a connection whose request did not arrive within %s s", self.limits.headers_s)
        self._close_with(RequestTimeout(f"The request line and headers did not arrive within "
                                        f"{self.limits.headers_s:g} s: send each request whole, at once."))

    # Slots under pressure

    def _free_a_slot(self) -> None:
        """Every slot is taken and a client has come: the connection silent longest, if for at
        least `pressed_gap_s`, gives its slot up (else the new client's request gets uvicorn's 503)."""
        now = self.loop.time()
        waiting = [c for c in self.connections if c is not self and isinstance(c, _ReadLimitsProtocol)
                   and c._waits_on_client() and now - c._heard_at >= self.limits.pressed_gap_s]
        if not waiting:
            return
        oldest = min(waiting, key=lambda c: c._heard_at)
        silent = now - oldest._heard_at
        self.logger.info("Closed a connection silent for %.1f s to serve a new one: every slot was taken", silent)
        if oldest.conn.their_state is h11.IDLE and oldest.cycle is not None and not oldest.conn.trailing_data[0]:
            oldest.transport.close()  # kept alive between requests: closed as its keep-alive timeout would
        else:
            oldest._close_with(RequestTimeout(
                f"The request stopped arriving: nothing came for {silent:.1f} s while every connection slot "
                "was taken, so its slot went to a new client. Send each request whole, at once, with a "
                "Content-Length that matches its body."))
        self.connections.discard(oldest)  # now, not when the loop next runs: the new request counts on it

    def _waits_on_client(self) -> bool:
        """Whether the server waits on the client: for a request, or the rest of its body (and
        no response is being written, nor reading paused by the server itself)."""
        if self.transport.is_closing() or self.flow.read_paused:
            return False
        if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
            return False
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    def _close_with(self, error: RequestTimeout) -> None:
        body = json.dumps(error.body()).encode()
        # h11 has no response to send before it has read a request: the bytes are written as is
        head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()


class BodyDeadline:
    """ASGI middleware: a request's body must keep arriving (see the module's docstring); a late
    one raises RequestTimeout where the app reads it. Reads after the body (a wait for the
    client's disconnect) are not timed."""

    def __init__(self, app, limits: ReadLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        limits, ends = self.limits, loop.time() + self.limits.body_s
        received, complete = 0, False

        async def timed_receive():
            nonlocal received, complete
            if complete:
                return await receive()
            wait = min(limits.body_gap_s, ends - loop.time())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.0))
            except TimeoutError:
                declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
                of = f" of the {declared} its Content-Length promised" if declared.isdigit() else ""
                why = (f"nothing came for {limits.body_gap_s:g} s" if wait == limits.body_gap_s
                       else f"the whole body takes at most {limits.body_s:g} s")
                raise RequestTimeout(f"The request body stopped arriving after {received:,} bytes{of}: {why}. "
                                     "Send the whole body, and a Content-Length that matches it.") from None
            received += len(message.get("body", b""))
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)
