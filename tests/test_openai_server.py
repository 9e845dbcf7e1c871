"""The OpenAI-compatible server (app/server/), driven by the official `openai` client and by plain
HTTP on a loopback port: the same text as `tandem-cli generate`, streamed and not; OpenAI's error
object for each bad request; a client that goes away cancels its request; 32 streams at once;
an API key off loopback; tools through the template's own format and tool calls read back."""

from __future__ import annotations

import json
import shutil
import threading
import time

import httpx2 as httpx  # the HTTP client the openai package itself uses
import pytest

from app.draft_choice import NO_DRAFT
from app.engine.events import Finished, GenerationStats, Round
from app.runner import Runner
from app.server.host import ApiServer, ServerError
from app.server.openai_api import model_id
from app.service import RunnerService

openai = pytest.importorskip("openai")
QUIET = {"progress": lambda message: None}
QUESTION = "tell me about the sea"


@pytest.fixture(scope="module")
def server(api_server):  # tests/conftest.py
    return api_server


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _post(server: ApiServer, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=120,
                      headers={"content-type": "application/json", **(headers or {})})


def _chat(service, text: str = QUESTION, **fields) -> dict:
    return {"model": model_id(service), "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": 16, **fields}


def test_a_streamed_chat_completion_writes_what_tandem_cli_generate_writes(tiny_pair, service, client, capsys):
    from app.cli import main

    assert main(["generate", "--model", str(tiny_pair["target"]), "--draft", str(tiny_pair["near"]),
                 "--backend", "torch", "--prompt", QUESTION, "--max-tokens", "16"]) == 0
    expected = capsys.readouterr().out.removesuffix("\n")
    assert expected  # the tiny model writes something

    asked = [{"role": "user", "content": QUESTION}]
    chunks = list(client.chat.completions.create(model=model_id(service), messages=asked, temperature=0,
                                                 max_tokens=16, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == expected
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("length", "stop")
    figures = last.model_extra["tandem"]  # the speculative figures of the answer
    assert figures["target_passes"] >= 1 and 0 <= figures["acceptance"] <= 1
    assert figures["drafted"] >= figures["accepted"]

    whole = client.chat.completions.create(model=model_id(service), messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, max_tokens=16)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    from app.runner import ChatRequest

    asked = ChatRequest(({"role": "user", "content": QUESTION},))
    assert whole.usage.prompt_tokens == len(service.runner.prompt_ids(asked))  # the template's prompt
    assert 1 <= whole.usage.completion_tokens <= 16
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens


def test_models_lists_the_loaded_model_and_completions_take_a_raw_prompt(service, client):
    assert [m.id for m in client.models.list().data] == [model_id(service)]
    whole = client.completions.create(model=model_id(service), prompt="The sea is", max_tokens=10, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id(service), prompt="The sea is", max_tokens=10, temperature=0, stream=True))
    assert whole.choices[0].text == streamed and whole.usage.completion_tokens >= 1
    # the raw prompt is not wrapped in the chat template: its token count is the text's own
    assert whole.usage.prompt_tokens == len(service.runner.tokenizer.encode("The sea is"))


def test_the_model_is_an_id_clients_expect_and_its_shown_name_is_accepted(service, client):
    """"SmolLM2 135M Instruct (demo)" in the window, "smollm2-135m-instruct" to clients: a
    request may name either (or any other), and the answer carries the id."""
    from app.models.resolve import display_name
    from app.server.openai_api import api_id

    assert api_id("SmolLM2 135M Instruct (demo)") == "smollm2-135m-instruct"
    assert api_id("Llama 3.1 8B Instruct") == "llama-3.1-8b-instruct"
    ident, shown = model_id(service), display_name(service.runner.loaded.folder)
    assert " " not in ident and "(" not in ident and ident == ident.lower()
    for name in (ident, shown):
        answer = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=2, temperature=0)
        assert answer.model == ident
        assert client.models.retrieve(name).id == ident
    # any other name is answered by the one loaded, which the answer names (as LM Studio does)
    other = client.chat.completions.create(model="another-model", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=2, temperature=0)
    assert other.model == ident


@pytest.mark.parametrize("body, status, param, words", [
    (b"{not json", 400, None, "not valid JSON"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model", "model"),
    ("TOO_LONG", 400, "messages", "context holds"),
    ("FIELD temperature 3", 400, "temperature", "less than or equal to 2"),
    ("FIELD top_p 0", 400, "top_p", "greater than 0"),
    ("FIELD max_tokens 0", 400, "max_tokens", "greater than or equal to 1"),
    ("FIELD n 2", 400, "n", "not supported (one answer per request)"),
    ("FIELD seed -1", 400, "seed", "greater than or equal to 0"),
    ("FIELD messages []", 400, "messages", "at least 1"),
    ("FIELD messages [{\"role\": \"robot\", \"content\": \"hi\"}]", 400, "messages", "role must be one of"),
    ("FIELD tools [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 400, "tools", "no format for tools"),
    ("FIELD top_k -2", 400, "top_k", "greater than or equal to -1"),
    ("FIELD tandem {\"draft\": \"bogus\"}", 400, "tandem.draft", "must be one of 'pair', 'model', 'ngram', 'none'"),
    ("FIELD tandem {\"draft_tokens\": 0}", 400, "tandem.draft_tokens", "greater than or equal to 1"),
    ("FIELD tandem {\"trees\": \"sometimes\"}", 400, "tandem.trees", "'auto', 'on' or 'off'"),
])
def test_each_bad_request_gets_its_status_and_openais_error_object(service, server, body, status, param, words):
    if body == "TOO_LONG":
        body = _chat(service, "word " * (service.runner.loaded.context_length * 2))
    elif isinstance(body, str) and body.startswith("FIELD"):
        _, name, value = body.split(" ", 2)
        body = _chat(service, **{name: json.loads(value)})
    response = _post(server, "/chat/completions", body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and words in error["message"]
    assert error["param"] == param
    assert _post(server, "/chat/completions", _chat(service)).status_code == 200  # it serves on


def test_an_unknown_path_and_a_body_over_the_limit_are_refused_in_the_same_shape(service):
    small = ApiServer(service, "127.0.0.1", 0, max_body=2048)
    small.start()
    try:
        response = _post(small, "/chat/completions", _chat(service, "x" * 4096))
        assert response.status_code == 413 and "limit" in response.json()["error"]["message"]
        chunked = httpx.post(small.url + "/chat/completions", timeout=30,  # no length header: counted as read
                             content=iter([json.dumps(_chat(service, "x" * 4096)).encode()]))
        assert chunked.status_code == 413
        missing = httpx.get(small.url + "/engines", timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    finally:
        small.stop()


def test_a_client_that_disconnects_mid_stream_stops_its_generation(service, server):
    ended = []
    watcher = lambda handle, event: ended.append((handle, event)) if isinstance(event, Finished) else None  # noqa: E731
    service.watchers.append(watcher)
    try:
        body = _chat(service, max_tokens=400, stream=True)
        with httpx.stream("POST", server.url + "/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few chunks of the answer: then the client goes away
        assert any(line.startswith("data: ") for line in got)
        deadline = time.monotonic() + 30
        while not ended and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        service.watchers.remove(watcher)
    handle, finished = ended[0]
    assert handle.client == "server" and finished.stats.finish_reason == "cancelled"
    assert finished.stats.tokens < 400
    assert _settled(service)  # nothing left running or waiting


def _settled(service, within: float = 10.0) -> bool:
    """Whether nothing is left running or waiting, given the service's thread a moment: a stream's
    last chunk reaches the client before that thread has put the finished request away (on a busy
    machine that took longer than the assertion)."""
    deadline = time.monotonic() + within
    while service.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    return service.pending() == 0


def test_32_streams_at_once_all_complete_whole_and_unmixed(service, server, client):
    questions = [f"question number {i}: name a colour" for i in range(4)]
    expected = {q: client.chat.completions.create(model=model_id(service), temperature=0, max_tokens=6,
                                                  messages=[{"role": "user", "content": q}]).choices[0].message.content
                for q in questions}
    results, errors = [None] * 32, []

    def ask(i: int) -> None:
        try:
            stream = client.chat.completions.create(model=model_id(service), temperature=0, max_tokens=6, stream=True,
                                                    messages=[{"role": "user", "content": questions[i % 4]}])
            results[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors
    assert results == [expected[questions[i % 4]] for i in range(32)]
    assert _settled(service)
    assert client.chat.completions.create(**_chat(service)).choices[0].message.content  # and it serves on


def test_each_named_user_answers_from_caches_of_its_own(service, client):
    """Two agents that send `user` keep a conversation each: the second one's follow-up prefills
    only its new tokens although the other agent asked in between."""
    model = model_id(service)
    first = [{"role": "user", "content": "tell me about the sea"}]
    answer = client.chat.completions.create(model=model, messages=first, temperature=0, max_tokens=8, user="agent-a")
    client.chat.completions.create(model=model, temperature=0, max_tokens=8, user="agent-b",
                                   messages=[{"role": "user", "content": "write a list of fruit"}])
    assert service.runner.kept.current == "server agent-b" and "server agent-a" in service.runner.kept.conversations
    follow_up = first + [{"role": "assistant", "content": answer.choices[0].message.content},
                         {"role": "user", "content": "and the mountains?"}]
    again = client.chat.completions.create(model=model, messages=follow_up, temperature=0, max_tokens=8,
                                           user="agent-a")
    reused = again.model_extra["tandem"]["reused_prompt_tokens"]
    assert reused >= answer.usage.prompt_tokens  # agent-a's first turn was kept while agent-b asked


def test_off_loopback_the_server_needs_a_key(service):
    with pytest.raises(ServerError, match="API key"):
        ApiServer(service, "0.0.0.0", 0)
    keyed = ApiServer(service, "0.0.0.0", 0, api_key="s3cret")
    keyed.start()
    try:
        local = f"http://127.0.0.1:{keyed.port}/v1"  # the test's traffic stays on this machine
        refused = httpx.get(local + "/models", timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.get(local + "/models", headers={"authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401
        keyed_client = openai.OpenAI(base_url=local, api_key="s3cret", max_retries=0)
        assert [m.id for m in keyed_client.models.list().data] == [model_id(service)]
    finally:
        keyed.stop()


def test_serve_refuses_an_open_address_without_a_key_before_loading(capsys, monkeypatch):
    from app.cli import main

    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--model", "/nowhere"]) == 2
    assert "set an API key first" in capsys.readouterr().err


# Tools: a tool-aware (Qwen/Hermes-style) template, and a scripted model that calls one

TOOL_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
# what the scripted model writes, cut where rounds might cut it (inside the opener, too)
CALL_PIECES = ["Let me check. <tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": ",
               "\"Paris\"}}\n</tool_call>"]


@pytest.fixture(scope="module")
def tool_server(tiny_pair, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tools") / "model"
    shutil.copytree(tiny_pair["target"], folder)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)  # transformers reads the template here
    runner = Runner()
    runner.load(folder, "torch", draft=NO_DRAFT, **QUIET)
    prompts = []

    def scripted_chat(request):
        prompts.append(runner.tokenizer.decode(runner.prompt_ids(request)))
        for i, piece in enumerate(CALL_PIECES):
            yield Round(i, (), 0, (i + 1,), piece)
        stats = GenerationStats(len(prompts[-1]), len(CALL_PIECES), len(CALL_PIECES), len(CALL_PIECES), 0, 0,
                                0.01, 0.02, "stop")
        yield Finished(stats, "".join(CALL_PIECES))

    runner.chat = scripted_chat
    service = RunnerService(runner)
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    yield server, prompts
    server.stop()
    service.close()


def test_tools_reach_the_prompt_in_the_templates_format(tool_server):
    server, prompts = tool_server
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    client.chat.completions.create(model=model_id(server.service), tools=[WEATHER],
                                   messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert "<tools>" in prompts[-1] and '"name": "get_weather"' in prompts[-1]
    # a follow-up with the call and its result renders through the template as well
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    client.chat.completions.create(model=model_id(server.service), tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompts[-1]
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompts[-1]
    # tool_choice "none": the template gets no tools
    client.chat.completions.create(model=model_id(server.service), tools=[WEATHER], tool_choice="none",
                                   messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert "<tools>" not in prompts[-1]


def test_a_tool_call_in_the_output_comes_back_as_tool_calls_whole_and_streamed(tool_server):
    server, _ = tool_server
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    ask = {"model": model_id(server.service), "tools": [WEATHER], "messages": [{"role": "user", "content": "Paris?"}]}
    whole = client.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Let me check."
    (call,) = whole.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(client.chat.completions.create(**ask, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me check." and "<tool" not in content  # no half call reaches the client as text
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
