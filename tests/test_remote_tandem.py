"""A remote Tandem as the target (app/remote/target.py): the answer is the server's model's own,
token for token at temperature 0, and every round the server ran arrives with its chips, as if
local; a request may turn speculation off there (the target-alone timing). One test runs the
server as another process (`tandem-cli serve`), as on a GPU box, and `tandem-cli generate`
against it; the others serve from this process to keep the suite short. What other engines send
(vLLM's and SGLang's reasoning field, tags in the text, no rounds) is read from recorded chunks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.chat.thinking import ANSWER, THINKING
from app.chat.trace import REJECTED
from app.chat.traced import Traced
from app.draft_choice import NO_DRAFT
from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from app.remote.client import RemoteError
from app.runner import ChatRequest, Runner
from app.server.host import ApiServer
from app.server.openai_api import model_id
from app.service import RunnerService

QUESTION = ({"role": "user", "content": "tell me about the sea and the sea and the sea"},)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def remote(api_server):
    runner = Runner()
    loaded = runner.load(api_server.url, progress=lambda message: None)
    yield runner, loaded
    runner.remote.close()


def _answer(runner_or_service, request: ChatRequest) -> tuple[list[Traced], Finished]:
    service = runner_or_service if isinstance(runner_or_service, RunnerService) else RunnerService(runner_or_service)
    try:
        events = list(service.submit(request).events(timeout=120))
    finally:
        if service is not runner_or_service:
            service.close()
    return [e for e in events if isinstance(e, Traced)], next(e for e in events if isinstance(e, Finished))


def test_a_remote_tandem_answers_as_its_model_alone_with_every_round_shown(service, remote):
    runner, loaded = remote
    assert (loaded.backend, loaded.remote_model, loaded.dtype) == ("remote", model_id(service), "Tandem")
    assert loaded.context_length == service.runner.loaded.context_length  # from /v1/models' max_model_len
    assert loaded.name == model_id(service) and loaded.remote in loaded.describe()

    request = ChatRequest(QUESTION, max_tokens=24)
    seen = []
    service.watchers.append(lambda handle, event: seen.append(event))
    try:
        rounds, finished = _answer(runner, request)
    finally:
        service.watchers.clear()
    local_rounds, local = _answer(service, ChatRequest(QUESTION, max_tokens=24, drafter=NO_DRAFT))
    assert finished.text == local.text and finished.text  # the target's own answer, token for token
    assert finished.stats.tokens == local.stats.tokens

    # the server's rounds, as the server's own service saw them: same chips, same counts
    served = [e for e in seen if isinstance(e, Traced)]
    assert [r.trace.chips for r in rounds] == [r.trace.chips for r in served]
    server_stats = next(e for e in seen if isinstance(e, Finished)).stats
    stats = finished.stats
    assert (stats.drafted, stats.accepted, stats.rounds) == (server_stats.drafted, server_stats.accepted,
                                                            server_stats.rounds)
    assert stats.drafted > 0 and any(c.kind == REJECTED for r in rounds for c in r.trace.chips)
    for field in ("accepted_by_position", "drafted_by_position", "reached_by_position"):  # the server pads with 0s
        assert _trimmed(getattr(stats, field)) == _trimmed(getattr(server_stats, field)), field
    assert stats.prompt_tokens == server_stats.prompt_tokens  # from usage
    assert "".join(r.part(ANSWER) for r in rounds) == finished.text


def _trimmed(counts: tuple[int, ...]) -> tuple[int, ...]:
    counts = list(counts)
    while counts and counts[-1] == 0:
        counts.pop()
    return tuple(counts)


def test_a_request_may_turn_the_servers_speculation_off_and_time_its_target_alone(remote):
    runner, _ = remote
    rounds, finished = _answer(runner, ChatRequest(QUESTION, max_tokens=12, drafter=NO_DRAFT))
    assert finished.stats.tokens == 12 and finished.stats.drafted == 0
    assert all(not r.trace.drafted for r in rounds) and len(rounds) == 12  # one token a pass
    seconds, context = runner.time_target_alone(QUESTION, tokens=8, params=SamplingParams())
    assert 0 < seconds < 5 and context > 8


def test_a_chats_trees_choice_reaches_the_server_as_its_own_request(remote):
    """The window's "Draft trees" on a remote Tandem: sent in the `tandem` field, read by the
    server into the request its engine runs; "auto" is the server's default and is not sent."""
    from app.server.requests import ChatBody

    runner, loaded = remote
    assert loaded.trees_note == ""  # another Tandem takes the choice
    for mode in ("on", "off", "auto"):
        path, body = runner.remote.body(ChatRequest(QUESTION, max_tokens=4, trees=mode))
        assert path == "/chat/completions" and ("trees" in body["tandem"]) == (mode != "auto")
        assert ChatBody.model_validate(body).to_request(512, with_tools=False).trees == mode


def test_the_server_going_away_mid_chat_is_an_error_that_keeps_the_answer_so_far(tiny_pair):
    runner = Runner()
    runner.load(tiny_pair["target"], "torch", progress=lambda message: None)
    service = RunnerService(runner)
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    client = Runner()
    client.load(server.url, progress=lambda message: None)
    server.stop()
    service.close()
    with pytest.raises(RemoteError, match="Nothing is listening"):
        _answer(client, ChatRequest(QUESTION, max_tokens=4))


def _serve(folder: Path, draft: Path) -> tuple[subprocess.Popen, str]:
    """`tandem-cli serve` as a process of its own, on a free port; (the process, its address)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--model", str(folder), "--draft",
                                str(draft), "--backend", "torch", "--port", "0"], cwd=REPO, env=env,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 240
    lines = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line)
        found = re.search(r"on (http://\S+/v1)", line)
        if found:
            return process, found.group(1)
    process.kill()
    raise AssertionError("tandem-cli serve did not start:\n" + "".join(lines))


def test_tandem_cli_generate_against_another_tandem_process_writes_its_answer(tiny_pair, capsys):
    from app.cli import main

    assert main(["generate", "--model", str(tiny_pair["target"]), "--draft", "none", "--backend", "torch",
                 "--prompt", QUESTION[0]["content"], "--max-tokens", "16"]) == 0
    expected = capsys.readouterr().out
    process, address = _serve(tiny_pair["target"], tiny_pair["near"])
    try:
        done = subprocess.run([sys.executable, "-m", "app.cli", "generate", "--model", address, "--show-rounds",
                               "--prompt", QUESTION[0]["content"], "--max-tokens", "16"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        models = subprocess.run([sys.executable, "-m", "app.cli", "remote", "models", address], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
    finally:
        process.terminate()
        process.wait(30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected  # the same model's answer, written by the other process
    assert re.search(r"\[round \d+ k=\d+\] +[+-]'", done.stderr)  # the server's rounds, drafts and all
    assert "acceptance" in done.stderr and "on Tandem at http://127.0.0.1:" in done.stderr
    assert models.returncode == 0 and re.fullmatch(r"\S+\tTandem\t\d+ tokens\n", models.stdout)


def test_other_engines_chunks_become_chipless_rounds_with_their_thinking_apart():
    """Recorded chunks: vLLM and SGLang with a reasoning parser send `reasoning_content` (newer
    vLLM `reasoning`); without one, the tags come in the text; usage ends the stream."""
    from app.remote.target import _Answer

    answer = _Answer(target=None, started=time.perf_counter())
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"reasoning_content": "Let me think."}}]},
              {"choices": [{"index": 0, "delta": {"reasoning": " More."}}]},
              {"choices": [{"index": 0, "delta": {"content": "The sea "}}]},
              {"choices": [{"index": 0, "delta": {"content": "<think>hmm</th"}}]},
              {"choices": [{"index": 0, "delta": {"content": "ink>is blue."}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 14, "total_tokens": 23}}]
    traced = [event for chunk in chunks for event in answer.feed(chunk)]
    assert all(not t.trace.chips for t in traced)  # no rounds sent: nothing is made up
    assert "".join(t.part(THINKING) for t in traced) == "Let me think. More.hmm"
    assert "".join(t.part(ANSWER) for t in traced) == "The sea is blue."
    finished = list(answer.finish(cancelled=False))[-1]
    assert finished.text == "The sea is blue."
    stats = finished.stats
    assert (stats.prompt_tokens, stats.tokens, stats.finish_reason) == (9, 14, "length")
    assert stats.drafted == 0 and stats.rounds == 0  # not measured, so not shown


def test_a_damaged_round_from_a_server_is_left_out_of_the_panel_not_the_answer():
    from app.remote.target import _Answer

    answer = _Answer(target=None, started=time.perf_counter())
    good = [1, 2, "lookup", "ab", 1, 0.1, 0.0, 0.01, [[5, "a", "accepted", 0.9, 0.8], [6, "b", "target", None, None]],
            False]
    chunk = {"choices": [{"index": 0, "delta": {"content": "ab"}}],
             "tandem": {"rounds": [good, ["x"], [*good[:8], [[7, "c", "weird", None, None]], False]]}}
    [traced] = list(answer.feed(chunk))
    assert traced.part(ANSWER) == "ab" and [c.token for c in traced.trace.chips] == [5, 6]
    assert traced.round.drafted == (5,) and traced.round.accepted == 1 and traced.round.emitted == (5, 6)


def test_bench_against_a_server_runs_the_rows_that_apply_and_says_which_it_left_out(api_server, capsys):
    from app.cli import main

    assert main(["bench", "--model", api_server.url, "--quick", "--repeats", "1"]) == 0
    table = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in table.splitlines() if line.startswith("server")}
    assert set(rows) == {"server as started", "server, target alone", "server, prompt lookup only"}
    assert re.search(r"server as started\s+[\d.]+ \[[\d.]+-[\d.]+\]\s+[\d.]+ \[[\d.]+-[\d.]+\]x", table)
    assert "left out: the anchors" in table and "left out: the exactness check" in table
    assert "on Tandem at http://127.0.0.1:" in table
