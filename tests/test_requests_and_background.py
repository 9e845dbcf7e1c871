"""Each request has its own Stop, made when it is asked for; background work on the engine (the
pair trial, re-timing the target alone) gives way to every real request and finishes between
them; every drafter samples over the tokenizer's real vocabulary only."""

from __future__ import annotations

import pytest

from app.draft_choice import NO_DRAFT, PAIR_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.engine.events import Finished, Round
from app.pair_trial import TRIAL_PASSES, TRIAL_PROMPTS, TrialProgress, run_trial
from app.runner import CancelToken, ChatRequest, Runner
from tests.test_pairing_and_runner import _padded_copy

ASK = ({"role": "user", "content": "hi there"},)
QUIET = {"progress": lambda message: None}


@pytest.fixture(scope="module")
def runner(tiny_pair):
    runner = Runner()
    runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]), **QUIET)
    return runner


def _finished(events) -> Finished:
    return [e for e in events if isinstance(e, Finished)][-1]


def test_a_stop_pressed_before_the_request_starts_is_kept(runner):
    """The flag used to be cleared when work started, after the click: a Stop pressed at the same
    instant as Send was lost."""
    request = ChatRequest(ASK, max_tokens=30)
    request.cancel.cancel()  # Stop, before the runner has even seen the request
    events = list(runner.chat(request))
    assert _finished(events).stats.finish_reason == "cancelled"
    assert len([t for e in events if isinstance(e, Round) for t in e.emitted]) <= 1  # the prefill's token


def test_stopping_one_request_leaves_the_next_alone(runner):
    first, second = ChatRequest(ASK, max_tokens=30), ChatRequest(ASK, max_tokens=30)
    events = runner.chat(first)
    next(events)
    runner.cancel()  # what the worker's Stop does: the request running now
    assert _finished(events).stats.finish_reason == "cancelled"
    assert first.cancel.cancelled and not second.cancel.cancelled
    assert _finished(runner.chat(second)).stats.finish_reason in ("length", "stop")


def test_the_trial_gives_way_and_resumes_from_the_next_prompt(runner):
    wanted = [False]
    calls = []
    chat = runner.chat

    def counting_chat(request):
        calls.append(request.messages[0]["content"])
        if len(calls) == 3 and progress.done == 1:  # a message arrives during the second prompt
            wanted[0] = True
        return chat(request)

    runner.chat = counting_chat
    try:
        progress = TrialProgress()
        assert run_trial(runner, lambda: wanted[0], progress=progress) is None
        assert progress.gave_way and progress.done == 1  # the half-measured prompt is dropped
        wanted[0] = False
        calls.clear()
        result = run_trial(runner, lambda: wanted[0], progress=progress)
    finally:
        runner.chat = chat
    assert result is not None and not progress.gave_way and progress.done == len(TRIAL_PROMPTS) * TRIAL_PASSES
    # resumed, nothing repeated: the first pass's other prompts, then every prompt again
    assert calls == [p for p in TRIAL_PROMPTS[1:] + TRIAL_PROMPTS * (TRIAL_PASSES - 1) for _ in range(2)]
    assert result.tokens == progress.spec_n and result.speedup > 0  # every run counts
    each = progress.speedups()
    assert len(each) == TRIAL_PASSES and result.low == min(each + [result.speedup])
    assert result.high == max(each + [result.speedup]) and result.low <= result.speedup <= result.high


def test_the_trials_second_pass_runs_speculation_first(runner):
    """Each side runs first in one of the passes, so neither is always the warm one."""
    sides = []
    chat = runner.chat

    def recording_chat(request):
        sides.append((request.messages[0]["content"], request.drafter))
        return chat(request)

    runner.chat = recording_chat
    try:
        result = run_trial(runner, prompts=TRIAL_PROMPTS[:1], tokens=8)
    finally:
        runner.chat = chat
    first = TRIAL_PROMPTS[0]
    assert sides == [(first, NO_DRAFT), (first, PAIR_DRAFT), (first, PAIR_DRAFT), (first, NO_DRAFT)][:2 * TRIAL_PASSES]
    assert result is not None and result.low is not None and result.low <= result.high


def test_a_pass_that_measured_nothing_gives_no_range():
    """A range from one pass (or the figure alone) would look measured and be narrow."""
    from types import SimpleNamespace

    done = len(TRIAL_PROMPTS) * TRIAL_PASSES  # every run measured, so nothing runs again
    progress = TrialProgress(done=done, drafted=8, accepted=6, rounds=5, passes=[[1.0, 10, 0.5, 10], [0.0, 0, 0.0, 0]])
    result = run_trial(SimpleNamespace(loaded=True, drafter=True), progress=progress)
    assert result is not None and result.speedup == pytest.approx(2.0)
    assert result.low is None and result.high is None and "about 2.0x faster" in result.summary()
    progress.passes[1] = [1.0, 10, 0.4, 10]
    result = run_trial(SimpleNamespace(loaded=True, drafter=True), progress=progress)
    assert (result.low, result.high) == (pytest.approx(2.0), pytest.approx(2.5))


def test_a_timing_that_gives_way_yields_no_sample(runner):
    assert runner.time_target_alone(ASK, tokens=8, cancelled=lambda: True) is None
    seconds, context = runner.time_target_alone(ASK, tokens=8)
    assert seconds > 0 and context > 8


def test_the_worker_finishes_a_trial_only_when_the_chat_is_idle(runner, qtbot):
    from ui.worker import EngineWorker, PairRequest

    worker = EngineWorker(runner)
    done = []  # Qt delivers the report on this thread, from its event loop (qtbot's waits run it)
    worker.trial_done.connect(lambda request, result: done.append(result))
    try:
        worker.set_engine_wanted(True)  # a message was sent before the trial could start
        worker.trial(PairRequest("tiny"))
        qtbot.wait(500)
        assert done == []  # it waits: the message goes first
        worker.set_engine_wanted(False)
        worker.resume_background()
        qtbot.waitUntil(lambda: bool(done), timeout=120_000)  # the service runs it in the background
        assert len(done) == 1 and done[0] is not None and done[0].tokens > 0
    finally:
        worker.close()


def test_the_trial_gives_way_to_another_clients_request_too(runner, qtbot):
    """A server request arriving mid-trial goes first; the trial finishes when the chat is idle."""
    from ui.worker import EngineWorker, PairRequest

    worker = EngineWorker(runner)
    done = []
    worker.trial_done.connect(lambda request, result: done.append(result))
    chat, served = runner.chat, []

    def chat_then_a_server_request(request):
        if not served:  # the trial's first request: another client asks meanwhile
            served.append(worker.service.submit(ChatRequest(ASK, max_tokens=4), client="server"))
        return chat(request)

    runner.chat = chat_then_a_server_request
    try:
        worker.trial(PairRequest("tiny"))
        qtbot.waitUntil(lambda: bool(served), timeout=60_000)
        assert served[0].result(120).stats.finish_reason in ("length", "stop")
        qtbot.wait(500)
        assert done == []  # it gave way, and waits for the chat to be idle
        worker.resume_background()
        qtbot.waitUntil(lambda: bool(done), timeout=120_000)
        assert done[0] is not None and done[0].tokens > 0
    finally:
        runner.chat = chat
        worker.close()


def test_every_drafter_samples_over_the_real_vocabulary(tiny_pair, tmp_path):
    """A target whose embedding is padded past its tokenizer: the runner used to cut the padded
    logits only when a draft model was loaded, so the target alone and prompt lookup could pick
    a padding row."""
    padded = _padded_copy(tiny_pair, tmp_path)
    for draft in (NO_DRAFT, PROMPT_LOOKUP):
        runner = Runner()
        runner.load(padded, "torch", draft=draft, **QUIET)
        assert runner.target.vocab_size == 1088 and runner.target.vocab_limit == 1024, draft


def test_cancel_token_can_follow_another_reason():
    reason = [False]
    token = CancelToken(also=lambda: reason[0])
    assert not token.cancelled
    reason[0] = True
    assert token.cancelled


def test_a_loads_steps_are_passed_on_while_it_runs_not_when_it_ends():
    """The service says a load's steps on its own thread; the worker emits each while it waits
    (emitted from the service's thread, they reached the window only when the load ended)."""
    import threading
    import time
    from concurrent.futures import Future
    from types import SimpleNamespace

    from app.draft_choice import NO_DRAFT
    from ui.worker import EngineWorker, PairRequest

    done = threading.Event()

    class SlowService:
        watchers: list = []

        def load(self, *args, progress, **kwargs) -> Future:
            future: Future = Future()

            def run():
                for layer in range(3):
                    progress(f"layer {layer}")
                    time.sleep(0.3)
                done.set()
                future.set_result(SimpleNamespace())
            threading.Thread(target=run, daemon=True).start()
            return future

    worker = EngineWorker(service=SlowService())
    heard: list[tuple[str, bool]] = []
    worker.progress.connect(lambda message: heard.append((message, done.is_set())))
    worker._load(PairRequest("demo"), NO_DRAFT)
    assert [message for message, _ in heard] == ["layer 0", "layer 1", "layer 2"]
    assert not heard[0][1] and not heard[1][1]  # said before the load ended
