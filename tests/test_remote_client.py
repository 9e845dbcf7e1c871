"""The remote target's HTTP side (app/remote/client.py) against real servers on loopback: the key
is dropped on a redirect to another origin or to plain http; TLS is verified, with a CA file for a
self-signed server; and each way a server fails (down, refusing the key, not an OpenAI API,
silent, dropping the stream, an error in the stream) is a message that says so. The failing
servers are small fakes (a real engine cannot be made to fail on cue); the engines themselves are
tested in tests/test_remote_tandem.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, StreamingResponse
from starlette.routing import Route

from app.remote.client import RemoteClient, RemoteError
from app.remote.endpoint import parse_endpoint
from tests.loopback import make_ca_and_certificate, serving

KEY = "sk-test-0123456789"


def _echo_app(seen: list[str | None]) -> Starlette:
    """/v1/models lists one model and notes the Authorization header it was sent."""

    async def models(request: Request):
        seen.append(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]})

    return Starlette(routes=[Route("/v1/models", models)])


def _redirecting_app(target: str) -> Starlette:
    async def moved(request: Request):
        return RedirectResponse(target + request.url.path, status_code=307)

    return Starlette(routes=[Route("/v1/models", moved)])


def test_the_key_goes_to_the_server_and_never_past_a_redirect_to_another_origin():
    seen: list[str | None] = []
    with serving(_echo_app(seen)) as origin:
        client = RemoteClient(parse_endpoint(origin), KEY)
        [model] = client.models()
        assert (model.id, model.owned_by, model.max_model_len) == ("m", "vllm", 4096)
        assert seen == [f"Bearer {KEY}"]  # sent where it belongs
        with serving(_redirecting_app(origin)) as elsewhere:
            RemoteClient(parse_endpoint(elsewhere), KEY).models()
        assert seen[-1] is None  # another port is another origin: the key stayed behind


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    pytest.importorskip("cryptography")
    return make_ca_and_certificate(tmp_path_factory.mktemp("tls"))


def test_tls_is_verified_and_a_ca_file_trusts_a_self_signed_server(certificates):
    seen: list[str | None] = []
    with serving(_echo_app(seen), certificates["cert"], certificates["key"]) as origin:
        assert origin.startswith("https://")
        with pytest.raises(RemoteError, match="not trusted.*CA file"):
            RemoteClient(parse_endpoint(origin), KEY).models()  # the system's roots know no such CA
        with pytest.raises(RemoteError, match="not trusted"):
            RemoteClient(parse_endpoint(origin), KEY, certificates["other_ca"]).models()
        assert seen == []  # nothing reached the server: the key never left over an untrusted link
        assert RemoteClient(parse_endpoint(origin), KEY, certificates["ca"]).models()[0].id == "m"
        assert seen == [f"Bearer {KEY}"]


def test_a_redirect_from_https_to_plain_http_drops_the_key(certificates):
    seen: list[str | None] = []
    with serving(_echo_app(seen)) as plain:
        with serving(_redirecting_app(plain), certificates["cert"], certificates["key"]) as secure:
            RemoteClient(parse_endpoint(secure), KEY, certificates["ca"]).models()
    assert seen == [None]


def test_a_ca_file_that_is_missing_or_not_a_certificate_is_said_so(tmp_path):
    with pytest.raises(RemoteError, match="does not exist"):
        RemoteClient(parse_endpoint("https://127.0.0.1:1"), None, tmp_path / "nope.pem")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(RemoteError, match="cannot be used"):
        RemoteClient(parse_endpoint("https://127.0.0.1:1"), None, tmp_path / "bad.pem")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_that_is_not_there_is_said_so():
    with pytest.raises(RemoteError, match="Nothing is listening at http://127.0.0.1:"):
        RemoteClient(parse_endpoint(f"http://127.0.0.1:{_free_port()}")).models()


def _failing_app() -> Starlette:
    async def refuse(request: Request):
        return JSONResponse({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
                            status_code=401)

    async def html(request: Request):
        return PlainTextResponse("<html>a login page</html>")

    async def bad_request(request: Request):
        return JSONResponse({"error": {"message": "This model's maximum context length is 4096 tokens.",
                                       "code": "context_length_exceeded"}}, status_code=400)

    def stream(parts: list[str], then=None):
        async def events():
            for part in parts:
                yield part
                await asyncio.sleep(0.01)
            if then is not None:
                then()

        return StreamingResponse(events(), media_type="text/event-stream")

    def chunk(text: str) -> str:
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}) + "\n\n"

    async def cut_short(request: Request):  # ends without [DONE]
        return stream([": keep-alive\n\n", chunk("Hel"), chunk("lo")])

    async def error_event(request: Request):
        return stream([chunk("Hel"), "data: " + json.dumps({"error": {"message": "the engine ran out of memory"}})
                       + "\n\n", "data: [DONE]\n\n"])

    async def broken(request: Request):  # the connection breaks mid-body
        def fail():
            raise RuntimeError("the process died")

        return stream([chunk("Hel")], then=fail)

    async def silent(request: Request):
        await asyncio.sleep(30)
        return JSONResponse({})

    return Starlette(routes=[Route("/refuse/v1/models", refuse), Route("/html/v1/models", html),
                             Route("/v1/chat/completions", bad_request, methods=["POST"]),
                             Route("/short/v1/chat/completions", cut_short, methods=["POST"]),
                             Route("/error/v1/chat/completions", error_event, methods=["POST"]),
                             Route("/broken/v1/chat/completions", broken, methods=["POST"]),
                             Route("/silent/v1/chat/completions", silent, methods=["POST"])])


@pytest.fixture(scope="module")
def failing():
    with serving(_failing_app()) as origin:
        yield origin


def _client(origin: str, prefix: str = "", read_s: float = 30.0) -> RemoteClient:
    return RemoteClient(parse_endpoint(origin + prefix), KEY, read_s=read_s)


def test_each_way_a_server_refuses_is_a_message_that_says_so(failing):
    with pytest.raises(RemoteError, match="refused the API key.*Incorrect API key") as refused:
        _client(failing, "/refuse").models()
    assert refused.value.status == 401 and KEY not in str(refused.value)
    with pytest.raises(RemoteError, match="Nothing answers at .*/nowhere/v1/models.*404"):
        _client(failing, "/nowhere").models()
    with pytest.raises(RemoteError, match="not JSON"):
        _client(failing, "/html").models()
    with pytest.raises(RemoteError, match="maximum context length is 4096") as too_long:
        list(_client(failing).stream("/chat/completions", {"model": "m"}))
    assert too_long.value.code == "context_length_exceeded" and too_long.value.status == 400


def _texts(client: RemoteClient, got: list[str]):
    for event in client.stream("/chat/completions", {"model": "m", "stream": True}):
        got.append(event["choices"][0]["delta"]["content"])


def test_a_stream_that_ends_early_or_breaks_keeps_what_came_and_says_so(failing):
    for prefix, words in (("/short", "closed the stream before the answer's end"),
                          ("/error", "the engine ran out of memory"),
                          ("/broken", "broke mid-answer")):
        got: list[str] = []
        with pytest.raises(RemoteError, match=words):
            _texts(_client(failing, prefix), got)
        assert "".join(got).startswith("Hel"), prefix  # what came before the failure was handed on


def test_a_silent_server_is_given_up_and_a_stop_ends_the_wait_at_once(failing):
    started = time.perf_counter()
    with pytest.raises(RemoteError, match="sent nothing for 1 s"):
        list(_client(failing, "/silent", read_s=1.0).stream("/chat/completions", {}))
    assert time.perf_counter() - started < 10
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.perf_counter()
    assert list(_client(failing, "/silent").stream("/chat/completions", {}, cancelled=stop.is_set)) == []
    assert time.perf_counter() - started < 5  # not the server's 30 s, nor the read limit


def test_a_model_the_server_does_not_serve_or_a_choice_left_open_is_said_with_the_ids():
    from app.remote.endpoint import RemoteSpec
    from app.remote.target import RemoteTarget

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "a", "owned_by": "vllm"},
                                                        {"id": "b", "owned_by": "vllm"}, {"no id": 1}]})

    quiet = {"progress": lambda message: None}
    with serving(Starlette(routes=[Route("/v1/models", models)])) as origin:
        with pytest.raises(RemoteError, match="serves “a”, “b”, not “c”: choose one"):
            RemoteTarget(RemoteSpec(origin, model="c"), **quiet)
        with pytest.raises(RemoteError, match="serves 2 models .*--remote-model"):
            RemoteTarget(RemoteSpec(origin), **quiet)
        chosen = RemoteTarget(RemoteSpec(origin, model="b"), **quiet)  # the odd entry hides nothing
        assert (chosen.model.id, chosen.engine) == ("b", "vLLM")
        chosen.close()
