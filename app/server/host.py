"""Serving the API on uvicorn: on 127.0.0.1 by default; any other address only with an API key.

`ApiServer` runs uvicorn on a thread of its own (the window's switch, the tests) or in the
foreground (`tandem-cli serve`). It binds its socket itself, before uvicorn starts, so a port in
use is a clear error at once and port 0 gets a free port whose number is known.

Stopping (Ctrl+C, SIGTERM, `stop()`) ends each answer in flight with an error, a stream's with
the error event and `data: [DONE]`, before uvicorn waits for the connections to close; the
engine thread is its owner's to close (`RunnerService.close`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable

import uvicorn

from app.server.api_key import KEY_VARIABLE as API_KEY_VARIABLE
from app.server.api_key import key_problem
from app.server.limits import ReadLimits, protocol_with_limits
from app.server.openai_api import MAX_BODY_BYTES, create_app
from app.service import RunnerService

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
# Requests at once (counting idle kept-alive connections); beyond this a stalled one gives way,
# else uvicorn answers 503 at once rather than queue without end (app/server/limits.py)
MAX_CONNECTIONS = 64
# Once the answers are ended, what is left to wait for is a response being written, or a body
# still arriving: both short, and a stop should not take longer than this.
GRACEFUL_STOP_S = 5
log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """The server cannot start as asked: the message says why and what to do."""


def is_loopback(host: str) -> bool:
    """Whether `host` is this computer alone: every address it resolves to is loopback ("127.1"
    and "localhost" are; a name that does not resolve is not)."""
    try:
        return _all_loopback(_addresses(host))
    except ServerError:
        return False


def _all_loopback(addresses: list[str]) -> bool:
    return all(ipaddress.ip_address(address).is_loopback for address in addresses)


def _addresses(host: str) -> list[str]:
    """The numeric addresses `host` names, as the socket will bind them (inet_aton's spellings such
    as 127.1 included); ServerError for a blank host or a name that does not resolve."""
    if not host.strip():
        raise ServerError("The host to serve on is blank: name an address, 127.0.0.1 (this computer only, "
                          "the default) or 0.0.0.0 (every network, with an API key).")
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise ServerError(f"Cannot serve on {host!r}: it is not an address, and no name of this computer's "
                          f"network resolves to it ({exc}). Give an address such as 127.0.0.1.") from None
    # the scope of a link-local IPv6 address ("fe80::1%eth0") is not part of the address
    return [info[4][0].split("%")[0] for info in found]


def api_key_from(given: str | None) -> str | None:
    """The key given, else the environment's ($TANDEM_API_KEY); None for none."""
    key = given if given is not None else os.environ.get(API_KEY_VARIABLE)
    return key or None


class ApiServer:
    def __init__(self, service: RunnerService, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 api_key: str | None = None, max_body: int = MAX_BODY_BYTES, limits: ReadLimits = ReadLimits()):
        if not _all_loopback(_addresses(host)) and not api_key:
            raise ServerError(f"Serving on {host} lets other machines use this model: set an API key first "
                              f"(--api-key KEY, or ${API_KEY_VARIABLE}), or serve on 127.0.0.1.")
        if api_key and key_problem(api_key):
            raise ServerError(key_problem(api_key))
        if not 0 <= port <= 65535:
            raise ServerError(f"The port must be from 1 to 65535 (0 picks a free one), not {port}.")
        self.service, self.host, self.api_key = service, host, api_key
        self.socket = self._bind(host, port)
        self.port = self.socket.getsockname()[1]
        app = create_app(service, api_key, max_body, limits)
        # uvicorn's limit counts the connection asking: + 1 serves MAX_CONNECTIONS at once
        config = uvicorn.Config(app, log_level="warning", http=protocol_with_limits(limits, MAX_CONNECTIONS),
                                limit_concurrency=MAX_CONNECTIONS + 1, timeout_graceful_shutdown=GRACEFUL_STOP_S)
        self._server = _Uvicorn(config, on_stop=app.state.answers.stop_all)
        self._thread: threading.Thread | None = None

    @staticmethod
    def _bind(host: str, port: int) -> socket.socket:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = min(found, key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise ServerError(f"Cannot serve on {host}:{port}: {exc.strerror or exc}. "
                              "Another program may use that port: choose another with --port.") from exc
        sock.listen(128)
        return sock

    @property
    def url(self) -> str:
        """The address bound, as a client reaches it ("127.1" is served as http://127.0.0.1:...)."""
        host = self.socket.getsockname()[0]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1"

    def serve_forever(self) -> None:
        """In the foreground, until Ctrl+C or SIGTERM; returns once the server has stopped."""
        self._server.run(sockets=[self.socket])

    def start(self) -> None:
        """On a thread of its own; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.serve_forever, name="tandem-api", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise ServerError(f"The server on {self.url} stopped as it started (see the log).")
            self._thread.join(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, end the requests in flight (each within one round), close the socket."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.socket.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, which ends the answers in flight as it stops, and returns (rather than
    raise the signal again) when a signal stopped it: the signal's work is done."""

    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]):
        super().__init__(config)
        self._on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # first, or uvicorn would wait out GRACEFUL_STOP_S for streams that never end and cut them
        self._on_stop()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self._captured_signals.clear()
