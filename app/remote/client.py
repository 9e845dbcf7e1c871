"""The HTTP side of a remote target: OpenAI's API over httpx, streamed as server-sent events.

Every failure becomes a `RemoteError` whose message a user can act on: the server is down, the
name does not resolve, its certificate is not trusted, it refused the key, it does not speak
OpenAI's API at that address, it went silent, it dropped the stream mid-answer. TLS is verified
(the system's roots, or the CA file given for a self-signed home server); there is no switch to
turn it off. The key travels only in the Authorization header, which httpx drops on a redirect
to another origin or from https to plain http (tests/test_remote_client.py checks both).

A stream is read on a thread of its own and handed over through a queue, so the caller can stop
it at any moment (a Stop while a slow server is still reading a long prompt) by closing it.
"""

from __future__ import annotations

import json
import queue
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai package uses (pydantic's httpx2)

from app.remote.endpoint import Endpoint

CONNECT_S = 10.0
READ_S = 300.0  # the longest silence: a big model reading a long prompt sends nothing meanwhile
MAX_ERROR_BYTES = 64 * 1024  # of a refusal's body: enough for any server's message
POLL_S = 0.1  # how often a waiting stream looks at its caller's Stop


class RemoteError(ConnectionError):
    """A remote server failed or refused; `str()` is the user's message. `status`: the HTTP status
    where there was one; `code`: the server's error code ("context_length_exceeded", ...)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code

    def __str__(self) -> str:
        return self.args[0]


@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str = ""  # "tandem", "vllm", "llamacpp", "sglang", ...
    max_model_len: int | None = None  # the context, where the server says (vLLM, Tandem)


def tls_context(ca_file: Path | None) -> ssl.SSLContext | bool:
    """Verification with the system's roots, or with `ca_file` (PEM) for a self-signed server."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except FileNotFoundError:
        raise RemoteError(f"The CA file {ca_file} does not exist: give the PEM file of the certificate authority "
                          "that signed the server's certificate.") from None
    except (ssl.SSLError, OSError) as exc:
        raise RemoteError(f"The CA file {ca_file} cannot be used ({exc}): it must be a PEM certificate.") from None


class RemoteClient:
    def __init__(self, endpoint: Endpoint, key: str | None = None, ca_file: Path | None = None,
                 read_s: float = READ_S):
        self.endpoint = endpoint
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.read_s = read_s
        self._http = httpx.Client(verify=tls_context(ca_file), follow_redirects=True, headers=headers,
                                  timeout=httpx.Timeout(read_s, connect=CONNECT_S))

    def close(self) -> None:
        self._http.close()

    # plain requests

    def get_json(self, path: str, root: bool = False) -> object:
        """GET base + path (or root + path) as JSON; a RemoteError on anything else."""
        url = (self.endpoint.root if root else self.endpoint.base) + path
        with self._errors(url):
            response = self._http.get(url)
            if response.status_code != 200:
                raise _refusal(response, url, response.content[:MAX_ERROR_BYTES])
            try:
                return response.json()
            except ValueError:
                raise RemoteError(f"{url} answered with something that is not JSON: it may not be an OpenAI-compatible "
                                  "server, or a proxy stands in the way.", response.status_code) from None

    def get_text(self, path: str) -> str:
        """GET root + path as text (Prometheus metrics)."""
        url = self.endpoint.root + path
        with self._errors(url):
            response = self._http.get(url)
            if response.status_code != 200:
                raise _refusal(response, url, response.content[:MAX_ERROR_BYTES])
            return response.text

    def models(self) -> list[RemoteModel]:
        """The models the server serves (/v1/models)."""
        data = self.get_json("/models")
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise RemoteError(f"{self.endpoint.base}/models did not list models the way OpenAI's API does "
                              "({\"data\": [...]}): is this an OpenAI-compatible server?")
        models = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
                continue  # one odd entry does not hide the others
            models.append(RemoteModel(entry["id"], str(entry.get("owned_by") or ""), _context(entry)))
        return models

    # streams

    def stream(self, path: str, body: dict, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """POST `body` to base + path and yield each server-sent event's JSON until [DONE]. An error
        event in the stream is raised as a RemoteError, as is a stream that ends without [DONE].
        Returns quietly (closing the connection) once `cancelled()` turns true."""
        url = self.endpoint.base + path
        events: queue.Queue = queue.Queue()
        pump = _Pump(self, url, body, events)
        pump.start()
        try:
            while True:
                try:
                    kind, value = events.get(timeout=POLL_S)
                except queue.Empty:
                    if cancelled():
                        return
                    continue
                if kind == "event":
                    yield value
                    if cancelled():
                        return
                elif kind == "error":
                    raise value
                else:  # "done"
                    return
        finally:
            pump.stop()

    def _errors(self, url: str):
        return _ErrorWords(self, url)


class _Pump(threading.Thread):
    """Reads one stream into a queue: ("event", dict)..., then ("done", None) or ("error", RemoteError)."""

    def __init__(self, client: RemoteClient, url: str, body: dict, events: queue.Queue):
        super().__init__(name="tandem-remote-stream", daemon=True)
        self.client, self.url, self.body, self.events = client, url, body, events
        self._response: httpx.Response | None = None
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Close the connection (a read waiting on it ends at once)."""
        self._stopped.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing from another thread may race the reader; it ends either way
                pass

    def run(self) -> None:
        try:
            with self.client._errors(self.url):
                with self.client._http.stream("POST", self.url, json=self.body,
                                              headers={"Accept": "text/event-stream"}) as response:
                    self._response = response
                    if response.status_code != 200:
                        raise _refusal(response, self.url, _read_some(response))
                    for data in _sse_data(response.iter_lines()):
                        if self._stopped.is_set():
                            return
                        if data == "[DONE]":
                            self.events.put(("done", None))
                            return
                        self.events.put(("event", _event(data, self.url)))
            raise RemoteError(f"The server closed the stream before the answer's end ({self.url}): what came is "
                              "kept; send the message again for the rest.")
        except RemoteError as exc:
            if not self._stopped.is_set():
                self.events.put(("error", exc))
        except Exception as exc:  # noqa: BLE001 - closed under the reader by stop(): nobody waits
            if not self._stopped.is_set():
                self.events.put(("error", RemoteError(f"Reading the answer from {self.url} failed: {exc}")))


def _context(entry: dict) -> int | None:
    """A listed model's context: vLLM's, SGLang's and Tandem's `max_model_len`, llama-server's
    `meta.n_ctx`; None where the server does not say."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for length in (entry.get("max_model_len"), meta.get("n_ctx")):
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return length
    return None


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """Each event's data of a server-sent event stream (data lines joined by newlines, as the
    standard says; comments and other fields skipped)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue  # a comment: servers send them to keep the connection open
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _event(data: str, url: str) -> dict:
    try:
        event = json.loads(data)
    except ValueError:
        raise RemoteError(f"The server sent something that is not JSON in its stream ({url}): "
                          f"“{data[:120]}”.") from None
    if not isinstance(event, dict):
        raise RemoteError(f"The server sent an event that is not a JSON object ({url}).")
    if "error" in event:
        raise RemoteError(_error_message(event) or "The server ended the answer with an error.",
                          code=_error_code(event))
    return event


def _read_some(response: httpx.Response) -> bytes:
    got = b""
    for chunk in response.iter_bytes():
        got += chunk
        if len(got) >= MAX_ERROR_BYTES:
            break
    return got[:MAX_ERROR_BYTES]


def _error_message(payload: object) -> str | None:
    """The message of OpenAI's error object ({"error": {"message": ...}}), FastAPI's {"detail": ...},
    or a bare {"error": "..."} (llama.cpp's older servers)."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    if isinstance(payload.get("message"), str):
        return payload["message"]
    detail = payload.get("detail")
    return detail if isinstance(detail, str) else None


def _error_code(payload: object) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _refusal(response: httpx.Response, url: str, body: bytes) -> RemoteError:
    status = response.status_code
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    said = _error_message(payload)
    code = _error_code(payload)
    if status in (401, 403):
        why = f" It said: {said}" if said else ""
        return RemoteError(f"The server at {url} refused the API key (HTTP {status}): check the key in the Target "
                           f"slot's server settings.{why}", status, code)
    if status == 404:
        return RemoteError(f"Nothing answers at {url} (HTTP 404): check the address, and that the server has "
                           f"OpenAI's API there (most serve it under /v1).{' It said: ' + said if said else ''}",
                           status, code)
    if said:
        return RemoteError(f"The server refused (HTTP {status}): {said}", status, code)
    return RemoteError(f"The server at {url} answered HTTP {status} {response.reason_phrase}.", status, code)


class _ErrorWords:
    """httpx's exceptions as messages a user can act on."""

    def __init__(self, client: RemoteClient, url: str):
        self.client, self.url = client, url

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, RemoteError) or not isinstance(exc, (httpx.HTTPError, httpx.InvalidURL)):
            return False
        origin = self.client.endpoint.origin
        raise _words(exc, origin, self.url, self.client.read_s) from None


def _words(exc: Exception, origin: str, url: str, read_s: float) -> RemoteError:
    cause = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return RemoteError(f"The certificate of {origin} is not trusted ({cause.verify_message}): for a server "
                               "with a self-signed certificate, give the CA file that signed it in the server "
                               "settings.")
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return RemoteError(f"{origin} did not answer within {CONNECT_S:.0f} s: check that the server runs and that "
                           "this machine can reach it.")
    if isinstance(exc, httpx.ConnectError):
        if "refused" in text.lower():
            return RemoteError(f"Nothing is listening at {origin} (connection refused): is the server running, on "
                               "that port?")
        if "name" in text.lower() or "resolution" in text.lower() or "nodename" in text.lower():
            return RemoteError(f"The host in {origin} cannot be found: check the address.")
        if "ssl" in text.lower() or "tls" in text.lower() or "wrong version" in text.lower():
            return RemoteError(f"A TLS connection to {origin} failed ({text}): does the server speak https there?")
        return RemoteError(f"Cannot connect to {origin}: {text}.")
    if isinstance(exc, httpx.ReadTimeout):
        return RemoteError(f"{origin} sent nothing for {read_s:.0f} s, so the request was given up: the server may be "
                           "overloaded or stuck.")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return RemoteError(f"The connection to {origin} broke mid-answer ({text}): what came is kept; send the "
                           "message again for the rest.")
    if isinstance(exc, httpx.TooManyRedirects):
        return RemoteError(f"{url} redirects in a loop: check the address.")
    return RemoteError(f"The request to {url} failed: {text}.")
