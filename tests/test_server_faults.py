"""The server against the fuzz cases of issue 46: stalled bodies on every connection slot give
way to a new client; OpenAI features the server does not have are refused with a 400 that names
the parameter (their no-op values still accepted); an answer says the max_tokens it ran under,
and a client's timeout ends a non-streamed answer; `--host 127.1` is loopback and a blank host
is refused in words; any model id is answered by the loaded model, which the answer names.

The answers come from the scripted model of tests/test_server_hardening.py (the demo's tokenizer
and template, no weights), so the file runs in seconds."""

from __future__ import annotations

import json
import select
import time

import httpx2 as httpx
import pytest

from app.runner import ChatRequest, Runner
from app.server.host import MAX_CONNECTIONS, ApiServer, ServerError, is_loopback
from app.server.limits import ReadLimits
from app.server.openai_api import model_id
from app.service import RunnerService
# the scripted model and its server, as the hardening tests have them (fixtures, imported to be used here)
from tests.test_server_hardening import (BOUND_S, CHAT, COMPLETION, SHORT, _chat, _connect,  # noqa: F401
                                         _error_of, _read_all, _request_bytes, http, scripted, server)

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


# 10. Stalled bodies on every slot

def test_stalled_bodies_on_every_slot_give_way_to_a_new_client(scripted):  # noqa: F811
    """64 clients that send half a body and stop hold every connection slot; a new client is
    still served at once: the body that has stalled longest is cut off (408) to make room, and
    only as many as needed."""
    service, script = scripted
    script.reset(endless=False)
    limits = ReadLimits()  # the deadlines as served: a stalled body is not cut off by its own deadline here
    api = ApiServer(service, "127.0.0.1", 0, limits=limits)
    api.start()
    body = json.dumps(_chat(model_id(service))).encode()
    stalled = [_connect(api) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in stalled:
            sock.sendall(_request_bytes(CHAT, body[:20], length=len(body)))
        time.sleep(limits.pressed_gap_s * 1.5)  # each body has stalled for longer than a pressed server waits
        assert not select.select(stalled, [], [], 0)[0], "every one of the slots holds its stalled request"
        with httpx.Client(base_url=api.url, timeout=BOUND_S) as client:
            response = client.post("/chat/completions", json=_chat(model_id(service)))
        assert response.status_code == 200, response.text
        cut = [sock for sock in stalled if select.select([sock], [], [], 0)[0]]
        assert len(cut) == 1, "one stalled client makes room for one new one"
        status, error = _error_of(_read_all(cut[0]))
        assert status == 408 and error["code"] == "request_timeout"
        assert "stopped arriving" in error["message"] and "every connection" in error["message"]
    finally:
        for sock in stalled:
            sock.close()
        api.stop()


def _one_response(sock) -> bytes:
    """One whole response off a connection that stays open (its Content-Length says where it ends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return data


def test_an_idle_kept_alive_connection_gives_way_first_and_quietly(scripted):  # noqa: F811
    service, script = scripted
    script.reset(endless=False)
    limits = ReadLimits()
    api = ApiServer(service, "127.0.0.1", 0, limits=limits)
    api.start()
    body = json.dumps(_chat(model_id(service))).encode()
    kept = _connect(api)  # answered, then kept alive: silent longest
    kept.sendall(_request_bytes(CHAT, body))
    assert _one_response(kept).startswith(b"HTTP/1.1 200")
    stalled = [_connect(api) for _ in range(MAX_CONNECTIONS - 1)]
    try:
        for sock in stalled:
            sock.sendall(_request_bytes(CHAT, body[:20], length=len(body)))
        time.sleep(limits.pressed_gap_s * 1.5)
        with httpx.Client(base_url=api.url, timeout=BOUND_S) as client:
            assert client.post("/chat/completions", json=_chat(model_id(service))).status_code == 200
        assert kept.recv(65536) == b""  # closed, as its keep-alive timeout would close it: no 408
        assert not select.select(stalled, [], [], 0)[0]  # the stalled requests keep their slots
    finally:
        for sock in [kept, *stalled]:
            sock.close()
        api.stop()


def test_a_stalled_body_holds_its_slot_no_longer_than_stalled_headers():
    assert ReadLimits().body_gap_s <= ReadLimits().headers_s


# 11. OpenAI features the server does not have: refused, naming the parameter

REFUSED = [
    ("logprobs", CHAT, {"logprobs": True}, "logprobs"),
    ("top_logprobs", CHAT, {"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ("top_logprobs alone", CHAT, {"top_logprobs": 3}, "top_logprobs"),
    ("json object", CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
    ("json schema", CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     "response_format"),
    ("response_format string", CHAT, {"response_format": "json"}, "response_format"),
    ("logit_bias", CHAT, {"logit_bias": {"50256": -100}}, "logit_bias"),
    ("functions", CHAT, {"functions": [TOOL["function"]]}, "functions"),
    ("function_call", CHAT, {"function_call": {"name": "get_weather"}}, "function_call"),
    ("penalty", CHAT, {"presence_penalty": 0.5}, "presence_penalty"),
    ("n", CHAT, {"n": 2}, "n"),
    ("completion logprobs", COMPLETION, {"logprobs": 2}, "logprobs"),
    ("completion suffix", COMPLETION, {"suffix": " and so on"}, "suffix"),
    ("completion logit_bias", COMPLETION, {"logit_bias": {"1": 5}}, "logit_bias"),
    ("completion best_of", COMPLETION, {"best_of": 2}, "best_of"),
]
TOOL_CHOICES = [  # a tool_choice that cannot be done: (fields, what the message says)
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "names the tool 'get_time', but tools holds 'get_weather'"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "names the tool 'get_weather', but no tools were sent"),
    ({"tool_choice": "required"}, "'required' asks for a tool call, but no tools were sent"),
]
NO_OPS = [  # what OpenAI's clients send by default: accepted, as OpenAI accepts them
    ("logprobs false", CHAT, {"logprobs": False, "top_logprobs": None}),
    ("logprobs null", CHAT, {"logprobs": None}),
    ("response_format text", CHAT, {"response_format": {"type": "text"}}),
    ("logit_bias empty", CHAT, {"logit_bias": {}}),
    ("logit_bias null", CHAT, {"logit_bias": None}),
    ("n 1", CHAT, {"n": 1, "frequency_penalty": 0, "presence_penalty": 0}),
    ("tool_choice auto, no tools", CHAT, {"tool_choice": "auto"}),
    ("tool_choice none, no tools", CHAT, {"tool_choice": "none"}),
    ("functions null", CHAT, {"functions": None, "function_call": None}),
    ("completion defaults", COMPLETION, {"logprobs": None, "suffix": None, "best_of": 1, "logit_bias": None}),
]


def _body(path: str, model: str, fields: dict) -> dict:
    base = {"model": model, "prompt": "hi", "max_tokens": 4} if path == COMPLETION else _chat(model)
    return {**base, **fields}


@pytest.mark.parametrize("path, fields, param", [case[1:] for case in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_feature_the_server_does_not_have_is_refused_naming_it(scripted, http, path, fields, param):  # noqa: F811
    service, script = scripted
    script.reset(endless=False)
    script.started.clear()
    response = http.post(path, json=_body(path, model_id(service), fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error["message"]
    assert param in error["message"] and "not supported" in error["message"], error["message"]
    assert not script.started.is_set()  # refused before anything ran


@pytest.mark.parametrize("fields, words", TOOL_CHOICES, ids=["missing tool", "no tools", "required, no tools"])
def test_a_tool_choice_that_cannot_be_done_is_refused_naming_it(scripted, http, fields, words):  # noqa: F811
    """Before, the named tool was dropped where no tools were sent (and any tools refused first
    where the template has no tool format), and "required" ran without tools."""
    service, script = scripted
    script.reset(endless=False)
    script.started.clear()
    response = http.post(CHAT, json=_chat(model_id(service), **fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tool_choice" and words in error["message"], error
    assert not script.started.is_set()


@pytest.mark.parametrize("path, fields", [case[1:] for case in NO_OPS], ids=[c[0] for c in NO_OPS])
def test_the_no_op_values_clients_send_are_accepted(scripted, http, path, fields):  # noqa: F811
    service, script = scripted
    script.reset(endless=False)
    response = http.post(path, json=_body(path, model_id(service), fields))
    assert response.status_code == 200, response.text


# 12. The max_tokens an answer runs under, and a client's timeout

def test_an_answer_says_the_max_tokens_it_ran_under(scripted, http):  # noqa: F811
    service, script = scripted
    script.reset(endless=False)
    model = model_id(service)
    context = service.runner.loaded.context_length
    huge = http.post("/chat/completions", json=_chat(model, max_tokens=10**9)).json()
    room = context - len(service.runner.prompt_ids(ChatRequest(({"role": "user", "content": "hi"},))))
    assert huge["tandem"]["max_tokens"] == room  # capped where the context ends, and said so
    note = huge["tandem"]["max_tokens_note"]
    assert "1,000,000,000" in note and f"{room:,}" in note
    with http.stream("POST", "/completions", json={"model": model, "prompt": "hi", "max_tokens": 10**9,
                                                   "stream": True}) as response:
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["tandem"]["max_tokens"] < context and "max_tokens_note" in events[-1]["tandem"]
    asked = http.post("/chat/completions", json=_chat(model, max_tokens=7)).json()["tandem"]
    assert asked["max_tokens"] == 7 and "max_tokens_note" not in asked
    default = http.post("/chat/completions", json={**_chat(model), "max_tokens": None}).json()["tandem"]
    assert 0 < default["max_tokens"] < room and "no max_tokens" in default["max_tokens_note"]


@pytest.mark.parametrize("path", [CHAT, COMPLETION])
def test_a_clients_timeout_ends_a_non_streamed_answer(scripted, server, path):  # noqa: F811
    service, script = scripted
    script.reset(endless=True)  # an answer that runs on until cancelled
    body = _body(path, model_id(service), {"max_tokens": 10**9})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + path, json=body, timeout=httpx.Timeout(BOUND_S, read=0.5))
    assert script.started.is_set()
    assert script.ended_event.wait(BOUND_S), "the engine wrote on for a client that had timed out"
    assert script.ended[-1] == "cancelled"
    script.reset(endless=False)


# 13. The address to serve on

def test_127_1_and_other_spellings_of_loopback_are_loopback(scripted):  # noqa: F811
    for host in ("127.1", "127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.5"):
        assert not is_loopback(host), host
    served = ApiServer(scripted[0], "127.1", 0, limits=SHORT)  # no key needed: this computer only
    served.start()
    try:
        assert httpx.get(served.url + "/models", timeout=BOUND_S).status_code == 200
    finally:
        served.stop()


def test_a_blank_host_is_refused_in_words(scripted, capsys, monkeypatch):  # noqa: F811
    for host in ("", "  "):
        with pytest.raises(ServerError, match="blank") as refused:
            ApiServer(scripted[0], host, 0, api_key="s3cret")
        assert "127.0.0.1" in str(refused.value)
    from app.cli import main

    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert main(["serve", "--host", "", "--port", "0", "--model", "/nowhere"]) == 2  # before loading
    err = capsys.readouterr().err
    assert "blank" in err and "Serving on  " not in err


# Any model id, answered by the one loaded

@pytest.mark.parametrize("name", ["gpt-4o", "llama3", "", "Some Model (v2)"])
def test_any_model_id_is_answered_by_the_loaded_model_which_the_answer_names(scripted, http, name):  # noqa: F811
    service, script = scripted
    script.reset(endless=False)
    loaded = model_id(service)
    whole = http.post("/chat/completions", json=_chat(name))
    assert whole.status_code == 200, whole.text
    assert whole.json()["model"] == loaded
    with http.stream("POST", "/completions", json={"model": name, "prompt": "hi", "max_tokens": 2,
                                                   "stream": True}) as response:
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    assert events and all(event["model"] == loaded for event in events)
    if name:
        assert http.get(f"/models/{name}").json()["id"] == loaded


def test_with_no_model_loaded_a_request_is_a_503_that_says_so():
    service = RunnerService(Runner())
    api = ApiServer(service, "127.0.0.1", 0, limits=SHORT)
    api.start()
    try:
        response = httpx.post(api.url + "/chat/completions", json=_chat("gpt-4o"), timeout=BOUND_S)
        assert response.status_code == 503 and response.json()["error"]["code"] == "model_not_loaded"
    finally:
        api.stop()
        service.close()
