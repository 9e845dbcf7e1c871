"""The runner as a shared service (app/service.py): clients at once each get their own complete
answer, each cancels only its own, turns are fair, background work gives way, a load ends the
requests asked of the old pair and says which, and a failing request leaves the service serving."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP
from app.chat.context import ContextOverflowError
from app.engine.events import Finished, Notice
from app.runner import ChatRequest, Runner
from app.service import RunnerService, Started, Traced

QUIET = {"progress": lambda message: None}


def _ask(text: str, tokens: int = 12, conversation: str = "") -> ChatRequest:
    return ChatRequest(({"role": "user", "content": text},), max_tokens=tokens, conversation=conversation)


@pytest.fixture(scope="module")
def alone(service):
    """What the runner writes for a question when nothing else runs (temperature 0)."""
    answers = {}

    def answer(text: str, tokens: int = 12) -> str:
        if (text, tokens) not in answers:
            answers[text, tokens] = service.submit(_ask(text, tokens)).result(60).text
        return answers[text, tokens]

    return answer


def _gate(service: RunnerService, client: str) -> threading.Event:
    """Hold the engine with a call until the event is set, so requests queue behind it."""
    release, running = threading.Event(), threading.Event()
    service.call(lambda runner: (running.set(), release.wait(30)), client=client)
    assert running.wait(30)
    return release


def test_two_clients_at_once_each_get_their_own_complete_answer(service, alone):
    questions = {"window": "tell me about the sea", "server": "write a list of fruit"}
    expected = {client: alone(text, 16) for client, text in questions.items()}
    got, errors = {}, []

    def client(name: str) -> None:
        try:
            handle = service.submit(_ask(questions[name], 16, conversation=name), client=name)
            events = list(handle.events(timeout=60))
            text = "".join(e.round.text for e in events if isinstance(e, Traced))
            got[name] = (text, events[-1])
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(name,)) for name in questions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    for name, (text, finished) in got.items():
        assert isinstance(finished, Finished) and finished.stats.finish_reason in ("length", "stop")
        assert text == finished.text == expected[name]  # whole, and nobody else's tokens in it


def test_each_client_cancels_only_its_own_request(service, alone):
    release = _gate(service, "server")
    running = service.submit(_ask("count to a hundred", 40), client="server")
    waiting = service.submit(_ask("name three colours", 12), client="window")
    other = service.submit(_ask("write a list of fruit", 12), client="cli")
    waiting.cancel()  # still queued: it ends now, without running
    assert waiting.result(5).stats.finish_reason == "cancelled" and waiting.finished.text == ""
    release.set()
    events = running.events(timeout=60)
    assert isinstance(next(events), Started)
    next(e for e in events if isinstance(e, Traced))  # it is writing
    running.cancel()
    assert running.result(60).stats.finish_reason == "cancelled"
    assert running.finished.stats.tokens < 40
    finished = other.result(60)  # the third client's request was touched by neither
    assert finished.stats.finish_reason in ("length", "stop") and finished.text == alone("write a list of fruit")


def test_clients_take_turns(service, monkeypatch):
    order = []
    chat = service.runner.chat
    monkeypatch.setattr(service.runner, "chat", lambda request: (order.append(request.conversation), chat(request))[1])
    release = _gate(service, "server")
    handles = [service.submit(_ask("hi", 2, conversation=f"server {i}"), client="server") for i in range(3)]
    handles.append(service.submit(_ask("hi", 2, conversation="window"), client="window"))
    release.set()
    for handle in handles:
        handle.result(60)
    # the window's message, queued last, waits for one server request, not for all three
    assert order == ["server 0", "window", "server 1", "server 2"]


def test_background_work_gives_way_when_a_request_arrives(service):
    started, steps = threading.Event(), []

    def background(runner, give_way):
        started.set()
        while not give_way():
            steps.append(1)
            threading.Event().wait(0.01)
        return "gave way"

    future = service.call(background, client="window", background=True)
    assert started.wait(30)
    handle = service.submit(_ask("hi", 4), client="server")
    assert future.result(30) == "gave way" and steps
    assert handle.result(60).stats.finish_reason in ("length", "stop")
    assert not service.wanted() and service.pending() == 0


def test_a_failing_request_reaches_its_client_and_the_service_serves_on(service, alone):
    context = service.runner.loaded.context_length
    too_long = _ask("word " * (context * 2), 4)
    with pytest.raises(ContextOverflowError):
        list(service.submit(too_long, client="server").events(timeout=60))
    assert service.submit(_ask("write a list of fruit"), client="cli").result(60).text == alone("write a list of fruit")


def test_the_rounds_carry_the_side_panels_chips(service):
    events = list(service.submit(_ask("tell me about the sea", 16), client="window").events(timeout=60))
    rounds = [e for e in events if isinstance(e, Traced)]
    assert rounds and all(e.trace.index == e.round.index for e in rounds)
    assert sum(e.trace.tokens for e in rounds) == events[-1].stats.tokens
    assert sum(e.trace.drafted for e in rounds) == events[-1].stats.drafted
    ats = [e.trace.at for e in rounds]
    assert ats == sorted(ats) and ats[0] == 0.0  # seconds from the first token


def test_loading_a_pair_ends_the_requests_of_the_old_one_and_says_which(tiny_pair):
    runner = Runner()
    runner.load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, **QUIET)
    service = RunnerService(runner)
    try:
        release = _gate(service, "window")
        waiting = [service.submit(_ask("hi", 8), client=c) for c in ("server", "server", "cli")]
        said = []
        loaded = service.load(tiny_pair["near"], "torch", draft=NO_DRAFT, client="window", progress=said.append)
        release.set()
        assert loaded.result(60).draft == NO_DRAFT and service.runner.loaded.folder == tiny_pair["near"]
        assert said[0] == "Stopped 3 requests (cli, server) to load the new pair."
        for handle in waiting:
            events = list(handle.events(timeout=5))
            assert isinstance(events[0], Notice) and "a new pair is loading" in events[0].message
            assert events[-1].stats.finish_reason == "cancelled" and events[-1].text == ""
        # the new pair answers the next request
        started = next(service.submit(_ask("hi", 2), client="server").events(timeout=60))
        assert started.loaded.folder == tiny_pair["near"]
    finally:
        service.close()
    with pytest.raises(RuntimeError, match="stopped"):
        service.submit(replace(_ask("hi")), client="cli")
