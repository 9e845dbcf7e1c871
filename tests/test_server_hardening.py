"""The server against what a fuzz found breaking it (issue 34): bodies of wrong shapes are each a
400 that names the field; a non-streamed client that goes away frees the engine within a round;
half a request line, a body shorter than its Content-Length and a trickled body are cut off at
their deadlines while other clients are served; stopping the server, and SIGINT or SIGTERM to a
real `tandem-cli serve`, end each open stream with an error event and [DONE]; an API key HTTP
cannot carry is refused at start, and no Authorization header gets more than a 401.

The answers come from a scripted model behind the demo's real tokenizer and chat template (a
round every few milliseconds, or without end until cancelled), on a server whose read deadlines
are a second; the signalled servers are two processes started together, serving a tiny random
Llama, so the file runs in well under a minute."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from app.engine.events import Finished, GenerationStats, Round
from app.models.transformers_tokenizer import ChatTokenizer
from app.runner import LoadedModel, Runner
from app.server.host import MAX_CONNECTIONS, ApiServer, ServerError
from app.server.limits import ReadLimits
from app.server.openai_api import model_id
from app.server.requests import MAX_JSON_DEPTH
from app.service import RunnerService

ROOT = Path(__file__).resolve().parent.parent
SHORT = ReadLimits(headers_s=1.0, body_gap_s=1.0, body_s=2.5)  # the deadlines, short for tests
BOUND_S = 10  # a behaviour bound (a departed or stalled client frees the server), not a speed figure
SIGNAL_BOUND_S = 20  # a signalled server ends within this
ROUND_S = 0.01  # the scripted model's time per round: tokens arrive steadily
ENDLESS_ROUNDS = 2000  # an answer that, uncancelled, runs 20 s (the 2,000-token answer)
ABORTS = ("Traceback", "terminate called", "Event loop is closed", "Fatal Python error")


class Script:
    """What the scripted model writes: three words, or (endless) a word a round until cancelled."""

    def __init__(self):
        self.endless = False
        self.started = threading.Event()
        self.ended: list[str] = []  # each answer's finish reason
        self.ended_event = threading.Event()

    def reset(self, endless: bool) -> None:
        self.endless = endless
        self.started.clear()
        self.ended_event.clear()

    def chat(self, request):
        self.started.set()
        limit = ENDLESS_ROUNDS if self.endless else 3
        done, reason = 0, "length"
        try:
            while done < limit:
                if request.cancel.cancelled:  # as the engine does between rounds
                    reason = "cancelled"
                    break
                time.sleep(ROUND_S)  # the round's work
                yield Round(done, (), 0, (done + 1,), "word ")
                done += 1
            stats = GenerationStats(4, done, done, done, 0, 0, 0.001, done * ROUND_S, reason)
            yield Finished(stats, "word " * done)
        finally:
            self.ended.append(reason)
            self.ended_event.set()


@pytest.fixture(scope="module")
def scripted(demo):
    """The runner service over a scripted model: the demo's tokenizer and template, no weights."""
    runner = Runner()
    runner.tokenizer = ChatTokenizer(demo["hf"])
    runner.loaded = LoadedModel(demo["hf"], "torch", "cpu", "float32", "llama", context_length=4096,
                                weights_bytes=0, load_s=0.0)
    script = Script()
    runner.chat = script.chat
    service = RunnerService(runner)
    yield service, script
    service.close()


@pytest.fixture(scope="module")
def server(scripted):
    server = ApiServer(scripted[0], "127.0.0.1", 0, limits=SHORT)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=BOUND_S) as client:
        yield client


def _chat(model: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def _served(http, model: str) -> None:
    """A well-behaved client is answered (within BOUND_S: the client's timeout)."""
    response = http.post("/chat/completions", json=_chat(model))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "word word word "


# Bodies of wrong shapes: (path, fields over a valid body, or raw JSON text; the param named)

USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _message(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi", **fields}]}


def _calls(calls) -> dict:
    return {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": calls}]}


def _nested(depth: int) -> dict:
    value: object = "deep"
    for _ in range(depth):
        value = {"a": value}
    return value


CHAT, COMPLETION = "/chat/completions", "/completions"
BAD_BODIES = [
    # message content: a number, an object, a list whose text part is not a string
    ("content number", CHAT, _message(content=5), "messages.0.content"),
    ("content float", CHAT, _message(content=1.5), "messages.0.content"),
    ("content true", CHAT, _message(content=True), "messages.0.content"),
    ("content object", CHAT, _message(content={"text": "hi"}), "messages.0.content"),
    ("part number", CHAT, _message(content=[5]), "messages.0.content.0"),
    ("part string", CHAT, _message(content=["hi"]), "messages.0.content.0"),
    ("part list", CHAT, _message(content=[[{"type": "text", "text": "hi"}]]), "messages.0.content.0"),
    ("part text number", CHAT, _message(content=[{"type": "text", "text": 5}]), "messages.0.content.0.text"),
    ("part text object", CHAT, _message(content=[{"type": "text", "text": {"a": 1}}]), "messages.0.content.0.text"),
    ("part text list", CHAT, _message(content=[{"type": "text", "text": ["a"]}]), "messages.0.content.0.text"),
    ("part text missing", CHAT, _message(content=[{"type": "text"}]), "messages.0.content.0.text"),
    ("part text null", CHAT, _message(content=[{"type": "text", "text": None}]), "messages.0.content.0.text"),
    ("part type missing", CHAT, _message(content=[{"text": "hi"}]), "messages.0.content.0.type"),
    ("part type number", CHAT, _message(content=[{"type": 1, "text": "hi"}]), "messages.0.content.0.type"),
    ("second part bad", CHAT, _message(content=[{"type": "text", "text": "a"}, {"type": "text", "text": 2}]),
     "messages.0.content.1.text"),
    # the messages themselves
    ("messages string", CHAT, {"messages": "hi"}, "messages"),
    ("messages object", CHAT, {"messages": USER}, "messages"),
    ("messages null", CHAT, {"messages": None}, "messages"),
    ("message number", CHAT, {"messages": [5]}, "messages.0"),
    ("message string", CHAT, {"messages": ["hi"]}, "messages.0"),
    ("message null", CHAT, {"messages": [USER, None]}, "messages.1"),
    ("role missing", CHAT, {"messages": [{"content": "hi"}]}, "messages"),
    ("role number", CHAT, _message(role=5), "messages"),
    ("role list", CHAT, _message(role=["user"]), "messages"),
    ("name number", CHAT, _message(name=5), "messages.0.name"),
    ("reasoning number", CHAT, _message(reasoning_content=5), "messages.0.reasoning_content"),
    ("tool_call_id number", CHAT,
     {"messages": [USER, {"role": "tool", "tool_call_id": 1, "content": "18 C"}]}, "messages.1.tool_call_id"),
    # an assistant message whose tool_calls is not a list of call objects
    ("tool_calls string", CHAT, _calls("get_weather"), "messages.1.tool_calls"),
    ("tool_calls object", CHAT, _calls(CALL), "messages.1.tool_calls"),
    ("tool_calls number", CHAT, _calls(3), "messages.1.tool_calls"),
    ("call number", CHAT, _calls([5]), "messages.1.tool_calls.0"),
    ("call string", CHAT, _calls(["call_1"]), "messages.1.tool_calls.0"),
    ("call function string", CHAT, _calls([{**CALL, "function": "get_weather"}]), "messages.1.tool_calls.0.function"),
    ("call function missing", CHAT, _calls([{"id": "call_1", "type": "function"}]),
     "messages.1.tool_calls.0.function"),
    ("call name missing", CHAT, _calls([{**CALL, "function": {"arguments": "{}"}}]),
     "messages.1.tool_calls.0.function.name"),
    ("call name number", CHAT, _calls([{**CALL, "function": {"name": 5, "arguments": "{}"}}]),
     "messages.1.tool_calls.0.function.name"),
    ("call arguments number", CHAT, _calls([{**CALL, "function": {"name": "f", "arguments": 5}}]),
     "messages.1.tool_calls.0.function.arguments"),
    ("call arguments list", CHAT, _calls([{**CALL, "function": {"name": "f", "arguments": [1]}}]),
     "messages.1.tool_calls.0.function.arguments"),
    ("call type", CHAT, _calls([{**CALL, "type": "code"}]), "messages.1.tool_calls.0.type"),
    ("call id number", CHAT, _calls([{**CALL, "id": 7}]), "messages.1.tool_calls.0.id"),
    # tools and tool_choice
    ("tools string", CHAT, {"tools": "get_weather"}, "tools"),
    ("tools object", CHAT, {"tools": TOOL}, "tools"),
    ("tool number", CHAT, {"tools": [5]}, "tools.0"),
    ("tool type", CHAT, {"tools": [{**TOOL, "type": "retrieval"}]}, "tools.0.type"),
    ("tool function missing", CHAT, {"tools": [{"type": "function"}]}, "tools.0.function"),
    ("tool function string", CHAT, {"tools": [{"type": "function", "function": "f"}]}, "tools.0.function"),
    ("tool name number", CHAT, {"tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0.function.name"),
    ("tool parameters string", CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools.0.function.parameters"),
    ("tool_choice number", CHAT, {"tools": [TOOL], "tool_choice": 5}, "tool_choice"),
    ("tool_choice word", CHAT, {"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ("tool_choice function string", CHAT, {"tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}},
     "tool_choice"),
    ("tool_choice no name", CHAT, {"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}},
     "tool_choice"),
    # the other fields
    ("model number", CHAT, {"model": 5}, "model"),
    ("model null", CHAT, {"model": None}, "model"),
    ("stream word", CHAT, {"stream": "maybe"}, "stream"),
    ("stream_options string", CHAT, {"stream": True, "stream_options": "yes"}, "stream_options"),
    ("include_usage word", CHAT, {"stream": True, "stream_options": {"include_usage": "sure"}},
     "stream_options.include_usage"),
    ("stop number", CHAT, {"stop": 5}, "stop"),
    ("stop list of numbers", CHAT, {"stop": [5]}, "stop.0"),
    ("stop object", CHAT, {"stop": {"a": "b"}}, "stop"),
    ("max_tokens word", CHAT, {"max_tokens": "many"}, "max_tokens"),
    ("max_tokens fraction", CHAT, {"max_tokens": 1.5}, "max_tokens"),
    ("temperature word", CHAT, {"temperature": "hot"}, "temperature"),
    ("top_p null", CHAT, {"top_p": None}, "top_p"),
    ("seed infinite", CHAT, '"seed": 1e400', "seed"),
    ("seed NaN", CHAT, '"seed": NaN', "seed"),
    ("user number", CHAT, {"user": 5}, "user"),
    ("n word", CHAT, {"n": "two"}, "n"),
    ("template kwargs string", CHAT, {"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("thinking switch word", CHAT, {"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
    # JSON nested past the limit, and deep enough to exhaust the parser itself
    ("nested tool schema", CHAT,
     {"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(MAX_JSON_DEPTH)}}]}, "tools"),
    ("nested extra field", CHAT, {"metadata": _nested(MAX_JSON_DEPTH + 5)}, "metadata"),
    ("nested content", CHAT, '"messages": [{"role": "user", "content": ' + "[" * 5000 + "]" * 5000 + "}]", None),
    ("nested past the parser", CHAT, '"metadata": ' + "[" * 100_000 + "]" * 100_000, None),
    ("lone surrogate", CHAT, '"messages": [{"role": "user", "content": "half \\ud800 a character"}]', "messages"),
    ("integer of 5,000 digits", CHAT, '"max_tokens": ' + "9" * 5000, None),
    # the completions endpoint
    ("prompt number", COMPLETION, {"prompt": 5}, "prompt"),
    ("prompt token ids", COMPLETION, {"prompt": [1, 2, 3]}, "prompt"),
    ("prompt one token id", COMPLETION, {"prompt": [1]}, "prompt"),
    ("prompt object", COMPLETION, {"prompt": {"text": "hi"}}, "prompt"),
    ("prompt null", COMPLETION, {"prompt": None}, "prompt"),
    ("prompt two strings", COMPLETION, {"prompt": ["a", "b"]}, "prompt"),
    ("echo word", COMPLETION, {"prompt": "hi", "echo": "yes"}, "echo"),
    ("completion stop number", COMPLETION, {"prompt": "hi", "stop": 5}, "stop"),
]


@pytest.mark.parametrize("path, fields, param", [case[1:] for case in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_each_body_of_a_wrong_shape_is_a_400_that_names_the_field(scripted, http, path, fields, param):
    service, script = scripted
    script.reset(endless=False)
    model = model_id(service)
    if isinstance(fields, str):  # raw JSON text (what json.dumps would not write)
        base = {"model": model, "max_tokens": 4} if path == COMPLETION else _chat(model)
        if fields.startswith('"messages"'):
            del base["messages"]
        content = json.dumps(base)[:-1] + ", " + fields + "}"
    else:
        base = {"model": model, "prompt": "hi", "max_tokens": 4} if path == COMPLETION else _chat(model)
        content = json.dumps({**base, **fields})
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error["message"]
    assert error["message"] and "Traceback" not in error["message"]
    assert not script.started.is_set()  # refused before anything rendered or ran


def test_the_bodies_refused_leave_the_server_serving(scripted, http):
    service, script = scripted
    script.reset(endless=False)
    _served(http, model_id(service))


# Clients that go away, or never finish

def _connect(server: ApiServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_S)  # a read past BOUND_S fails


def _request_bytes(path: str, body: bytes, length: int | None = None) -> bytes:
    head = (f"POST /v1{path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body) if length is None else length}\r\n\r\n")
    return head.encode() + body


def _read_all(sock: socket.socket) -> bytes:
    """What the server writes until it closes the connection (a timeout fails the test)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _error_of(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_a_non_streamed_client_that_goes_away_frees_the_engine_within_a_round(scripted, server, http):
    service, script = scripted
    script.reset(endless=True)  # tokens keep coming: the disconnect must be heard anyway
    body = json.dumps(_chat(model_id(service), max_tokens=ENDLESS_ROUNDS)).encode()
    sock = _connect(server)
    sock.sendall(_request_bytes(CHAT, body))
    assert script.started.wait(BOUND_S)  # the answer is being written
    sock.close()
    assert script.ended_event.wait(BOUND_S), "the engine wrote on for a client that had gone"
    assert script.ended[-1] == "cancelled"
    script.reset(endless=False)
    _served(http, model_id(service))  # and the next client is answered at once


def test_half_a_request_line_is_cut_off_at_its_deadline_while_others_are_served(scripted, server, http):
    service, script = scripted
    script.reset(endless=False)
    slow = [_connect(server) for _ in range(3)]
    for sock in slow[1:]:
        sock.sendall(b"POST /v1/chat/compl")  # half a request line; the first sends nothing at all
    _served(http, model_id(service))  # served while those are held
    for sock in slow:
        status, error = _error_of(_read_all(sock))  # cut off: a 408, then the connection closes
        assert status == 408 and error["code"] == "request_timeout" and "1 s" in error["message"]
        sock.close()


def test_slow_clients_on_every_slot_free_them_at_the_deadline(scripted, server, http):
    service, script = scripted
    script.reset(endless=False)
    slow = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in slow:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.")  # headers that never end
        for sock in slow:
            assert _read_all(sock).startswith(b"HTTP/1.1 408")
    finally:
        for sock in slow:
            sock.close()
    _served(http, model_id(service))  # the slots are free again


def test_a_body_shorter_than_its_length_ends_with_408_while_others_are_served(scripted, server, http):
    service, script = scripted
    script.reset(endless=False)
    body = json.dumps(_chat(model_id(service))).encode()
    sock = _connect(server)
    sock.sendall(_request_bytes(CHAT, body[:20], length=len(body)))
    _served(http, model_id(service))
    status, error = _error_of(_read_all(sock))
    sock.close()
    assert status == 408 and error["code"] == "request_timeout"
    assert f"after 20 bytes of the {len(body)} its Content-Length promised" in error["message"]


def test_a_body_trickled_slower_than_its_whole_deadline_is_cut_off(scripted, server):
    service, script = scripted
    script.reset(endless=False)
    body = json.dumps(_chat(model_id(service), stop=["x" * 200])).encode()
    sock = _connect(server)
    sock.sendall(_request_bytes(CHAT, b"", length=len(body)))
    answered = False
    for byte in body:  # a byte at a time, each well inside the gap deadline
        sock.sendall(bytes([byte]))
        if select.select([sock], [], [], SHORT.body_gap_s / 4)[0]:
            answered = True
            break
    assert answered, "the whole body arrived before its deadline: trickle it more slowly"
    status, error = _error_of(_read_all(sock))
    sock.close()
    assert status == 408 and f"at most {SHORT.body_s:g} s" in error["message"]


# Stopping, and signals

def _stream_lines(url: str, body: dict, lines_out: list[str], begun: threading.Event, want: int = 1) -> None:
    """Read a stream's lines into `lines_out`; `begun` is set once `want` lines have come."""
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=SIGNAL_BOUND_S) as response:
        for line in response.iter_lines():
            if line:
                lines_out.append(line)
                if len(lines_out) >= want:
                    begun.set()


def _ends_with_error_and_done(lines: list[str]) -> dict:
    assert lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_stopping" and error["type"] == "server_error", error
    return error


def test_stopping_the_server_ends_each_open_answer_with_an_error(scripted):
    service, script = scripted
    script.reset(endless=True)
    server = ApiServer(service, "127.0.0.1", 0, limits=SHORT)
    server.start()
    model = model_id(service)
    streams = [([], threading.Event()) for _ in range(2)]  # one answered, one waiting its turn
    threads = [threading.Thread(target=_stream_lines, args=(server.url, _chat(model, stream=True,
                                                                               max_tokens=ENDLESS_ROUNDS), *s))
               for s in streams]
    whole: list[httpx.Response] = []
    threads.append(threading.Thread(target=lambda: whole.append(httpx.post(
        server.url + "/chat/completions", json=_chat(model, max_tokens=ENDLESS_ROUNDS), timeout=SIGNAL_BOUND_S))))
    for thread in threads:
        thread.start()
    assert script.started.wait(BOUND_S)
    for _, begun in streams:
        assert begun.wait(BOUND_S)  # each stream has begun (the waiting one with its role chunk)
    queued_by = time.monotonic() + BOUND_S
    while service.pending() < 3:  # the whole request is queued too (the service has no event for it)
        assert time.monotonic() < queued_by and threads[-1].is_alive()
        time.sleep(0.01)
    server.stop()
    for thread in threads:
        thread.join(SIGNAL_BOUND_S)
    assert not server.running
    for lines, _ in streams:
        _ends_with_error_and_done(lines)
    assert whole[0].status_code == 503 and whole[0].json()["error"]["code"] == "server_stopping"
    assert script.ended_event.wait(BOUND_S) and script.ended[-1] == "cancelled"
    assert service.pending() == 0


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}


@pytest.fixture(scope="module")
def tiny_model(demo, tmp_path_factory) -> Path:
    """A random two-layer Llama with the demo's tokenizer: it loads in a moment."""
    from tests.factories import tiny_llama

    folder = tmp_path_factory.mktemp("tiny-served") / "tiny"
    vocab = json.loads((demo["hf"] / "config.json").read_text())["vocab_size"]
    tiny_llama(1, vocab=vocab).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (demo["hf"] / name).exists():
            shutil.copy(demo["hf"] / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def serving(tiny_model):
    """A `tandem-cli serve` process for each signal, started together: start-up is most of their time."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = {name: subprocess.Popen([sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
                                     "serve", "--model", str(tiny_model), "--draft", "none", "--backend", "torch",
                                     "--port", "0"],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in SIGNALS}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _url_of(proc: subprocess.Popen) -> str:
    """The API's address, once `tandem-cli serve` says it serves."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "Serving" in line:
            return line.split(" on ", 1)[1].split()[0]
    raise AssertionError(f"tandem-cli serve did not start: {''.join(seen)[-2000:]}")


@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_to_tandem_cli_serve_ends_each_stream_with_an_error_and_done(serving, name):
    proc = serving[name]
    url = _url_of(proc)
    model = httpx.get(url + "/models", timeout=BOUND_S).json()["data"][0]["id"]
    lines: list[str] = []
    began = threading.Event()
    body = {"model": model, "messages": [{"role": "user", "content": "tell me about the sea"}], "stream": True,
            "temperature": 0, "max_tokens": 1000}
    reader = threading.Thread(target=_stream_lines, args=(url, body, lines, began, 4))
    reader.start()
    assert began.wait(SIGNAL_BOUND_S), lines  # a few chunks of the answer have come
    sent = time.monotonic()
    proc.send_signal(SIGNALS[name])
    reader.join(SIGNAL_BOUND_S)
    _, err = proc.communicate(timeout=SIGNAL_BOUND_S)
    took = time.monotonic() - sent
    assert "data: [DONE]" not in lines[:-1]  # the answer was still streaming when the signal came
    _ends_with_error_and_done(lines)
    assert proc.returncode == 0, err[-2000:]  # stopped as asked
    assert not any(abort in err for abort in ABORTS), err[-2000:]
    assert took < SIGNAL_BOUND_S


# The API key

def test_a_key_http_cannot_carry_is_refused_at_start_without_repeating_it(scripted, capsys, monkeypatch):
    service, _ = scripted
    for key in ("clé-secrète", "with space", "tab\there"):
        with pytest.raises(ServerError, match="HTTP headers cannot carry") as refused:
            ApiServer(service, "127.0.0.1", 0, api_key=key)
        assert key not in str(refused.value)
    from app.cli import main

    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert main(["serve", "--api-key", "naïve", "--port", "0", "--model", "/nowhere"]) == 2  # before loading
    err = capsys.readouterr().err
    assert "not ASCII" in err and "naïve" not in err


@pytest.mark.parametrize("header", [b"Bearer cl\xc3\xa9", b"Bearer \xff\xfe", b"Bearer", b"bearer  s3cret-key ",
                                    b"Basic s3cret-key", b"Bearer " + b"s" * 8000],
                         ids=["utf-8", "latin-1", "no token", "spaced", "basic", "long"])
def test_an_authorization_header_of_any_bytes_gets_a_clean_401(scripted, header):
    service, script = scripted
    script.reset(endless=False)
    keyed = ApiServer(service, "127.0.0.1", 0, api_key="s3cret-key", limits=SHORT)
    keyed.start()
    try:
        sock = _connect(keyed)
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\nauthorization: "
                     + header + b"\r\n\r\n")
        response = _read_all(sock)
        sock.close()
        status = int(response.split()[1])
        if header == b"bearer  s3cret-key ":
            assert status == 200  # the scheme in any case, spaces around the key: still the key
        else:
            status, error = _error_of(response)
            assert status == 401 and error["code"] == "invalid_api_key"
        ok = httpx.get(keyed.url + "/models", headers={"authorization": "Bearer s3cret-key"}, timeout=BOUND_S)
        assert ok.status_code == 200
    finally:
        keyed.stop()
