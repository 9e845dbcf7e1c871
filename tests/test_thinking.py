"""Reasoning models: the thinking block is split from the answer as it streams (app/chat/thinking.py),
the template's switch is a per-chat setting, the service's events carry both parts, the server
returns the thinking as `reasoning_content`, and the window folds it above the answer and keeps
both in the history. No offline model thinks: a tiny model behind a Qwen3-style template, with
its output scripted, stands in."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from app.draft_choice import NO_DRAFT
from app.chat.thinking import ANSWER, THINKING, ThinkingSplitter, starts_thinking
from app.engine.events import Finished, GenerationStats, Round
from app.runner import ChatRequest, Runner
from app.service import RunnerService, Text, Traced

QWEN3_OUTPUT = "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?"
THOUGHT, ANSWERED = "The user greets me. I greet back.\n", "Hello! How can I help?"
# a Qwen3-style template: its switch writes an empty block into the prompt
QWEN3_TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""
QUIET = {"progress": lambda message: None}


def _split(chunks: list[str], thinking: bool = False) -> tuple[str, str, list[str]]:
    splitter = ThinkingSplitter(thinking)
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)] + splitter.finish()
    text = {THINKING: "", ANSWER: ""}
    for kind, piece in pieces:
        text[kind] += piece
    return text[THINKING], text[ANSWER], [kind for kind, _ in pieces]


@pytest.mark.parametrize("cut", range(1, len(QWEN3_OUTPUT)))
def test_the_thinking_is_split_from_the_answer_wherever_a_round_ends(cut):
    thinking, answer, kinds = _split([QWEN3_OUTPUT[:cut], QWEN3_OUTPUT[cut:]])
    assert (thinking, answer) == (THOUGHT, ANSWERED)  # tags and the template's blank lines left out
    assert kinds.index(ANSWER) > kinds.index(THINKING) and THINKING not in kinds[kinds.index(ANSWER):]


def test_a_block_the_prompt_opened_and_a_tag_that_never_completes():
    # DeepSeek-R1 distills: the generation prompt ends with "<think>\n"; the model writes no opening tag
    assert starts_thinking("<|Assistant|><think>\n") and not starts_thinking("<think>\n\n</think>\n\n")
    assert not starts_thinking("<|im_start|>assistant\n")
    assert _split(["I should add.", "</think>", "\n\n4"], thinking=True)[:2] == ("I should add.", "4")
    assert _split(["a < b and <thi"])[:2] == ("", "a < b and <thi")  # held back, then text after all
    assert _split(["no thinking at all"])[:2] == ("", "no thinking at all")


@pytest.fixture(scope="module")
def thinking_model(tiny_pair, tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-style") / "model"
    shutil.copytree(tiny_pair["target"], folder)
    (folder / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    return folder


def _scripted(runner: Runner, chunks: list[str], prompts: list[str] | None = None):
    """Runner.chat writing `chunks`, one round each (the tiny model cannot think)."""
    def chat(request):
        if prompts is not None:
            prompts.append(runner.tokenizer.render_text(list(request.messages), thinking=request.thinking))
        for i, chunk in enumerate(chunks):
            yield Round(i, (), 0, (i + 1,), chunk)
        stats = GenerationStats(10, len(chunks), len(chunks), len(chunks), 0, 0, 0.01, 0.02, "stop")
        yield Finished(stats, "".join(chunks))

    return chat


CHUNKS = ["<think>\nThe user", " greets me. I greet back.\n</th", "ink>\n\nHello!", " How can I help?"]


@pytest.fixture(scope="module")
def service(thinking_model):
    runner = Runner()
    runner.load(thinking_model, "torch", draft=NO_DRAFT, **QUIET)
    service = RunnerService(runner)
    yield service
    service.close()


def test_the_templates_switch_is_a_request_setting(service):
    runner = service.runner
    assert runner.loaded.reasoning == "switch" and runner.tokenizer.thinks
    ask = ChatRequest(({"role": "user", "content": "Hi"},))
    off = ChatRequest(ask.messages, thinking=False)
    assert "</think>" not in runner.tokenizer.decode(runner.prompt_ids(ask))
    assert runner.tokenizer.decode(runner.prompt_ids(off)).endswith("<think>\n\n</think>\n\n")
    assert runner.starts_thinking(ask) is False and runner.starts_thinking(off) is False


def test_the_services_events_carry_the_thinking_and_the_answer_apart(service, monkeypatch):
    monkeypatch.setattr(service.runner, "chat", _scripted(service.runner, CHUNKS))
    events = list(service.submit(ChatRequest(({"role": "user", "content": "Hi"},))).events(timeout=60))
    parts = [e for e in events if isinstance(e, (Traced, Text))]
    assert "".join(e.part(THINKING) for e in parts) == THOUGHT
    assert "".join(e.part(ANSWER) for e in parts) == ANSWERED
    rounds = [e.trace for e in events if isinstance(e, Traced)]
    assert [r.thinking for r in rounds] == [True, True, True, False]  # the round the answer began in began thinking
    assert "".join(r.text for r in rounds) == ANSWERED  # the chat's tint spans the answer only


def test_the_server_returns_the_thinking_as_reasoning_content(service, monkeypatch):
    openai = pytest.importorskip("openai")
    from app.server.host import ApiServer
    from app.server.openai_api import model_id

    prompts: list[str] = []
    monkeypatch.setattr(service.runner, "chat", _scripted(service.runner, CHUNKS, prompts))
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        ask = {"model": model_id(service), "messages": [{"role": "user", "content": "Hi"}]}
        message = client.chat.completions.create(**ask).choices[0].message
        assert message.content == ANSWERED and message.model_extra["reasoning_content"] == THOUGHT
        chunks = list(client.chat.completions.create(**ask, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == THOUGHT
        assert "".join(d.content or "" for d in deltas) == ANSWERED
        client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert prompts[-1].endswith("<think>\n\n</think>\n\n") and not prompts[0].endswith("</think>\n\n")
    finally:
        server.stop()


def test_the_history_keeps_the_thinking_beside_the_answer_and_migrates_older_files(tmp_path):
    from app.chat import history
    from app.chat.history import HistoryStore

    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in history.MIGRATIONS[:2]:  # the format before thinking was kept
        step(db)
    db.execute("PRAGMA user_version = 2")
    db.close()
    with HistoryStore.open(path) as store:
        conv = store.create_conversation()
        answer_id = store.begin_answer(conv.id, "Hi")
        store.finish_answer(answer_id, ANSWERED, "complete", thinking=THOUGHT)
        user, answer = store.messages(conv.id)
        assert (answer.content, answer.thinking) == (ANSWERED, THOUGHT)
        assert answer.as_chat() == {"role": "assistant", "content": ANSWERED}  # the model reads the answer again
        second = store.add_answer_version(conv.id)
        store.finish_answer(second.id, "Hi there.", "complete")
        assert store.messages(conv.id)[1].thinking == ""  # each version its own
        assert store.show_version(answer_id, 1).thinking == THOUGHT


def test_the_window_folds_the_thinking_above_the_answer_and_stores_both(thinking_model, qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    from app.chat.settings import ChatSettings
    from ui.main_window import MainWindow

    window = MainWindow(model=str(thinking_model), backend="torch", draft=NO_DRAFT,
                        history_path=tmp_path / "history.sqlite3",
                        settings=QSettings(str(tmp_path / "t.ini"), QSettings.Format.IniFormat),
                        chat_defaults=ChatSettings(temperature=0.0, max_tokens=16))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(window.composer.can_send, timeout=120_000)
    assert window.settings_drawer.thinking.isEnabled()  # the template has the switch
    prompts: list[str] = []
    runner = window.worker.runner
    runner.chat = _scripted(runner, CHUNKS, prompts)
    with qtbot.waitSignal(window.controller.busy_changed, check_params_cb=lambda busy: not busy, timeout=60_000):
        window.send("Hi")
    widget = window.chat_view.last_message()
    block = widget.thinking
    assert block.isVisible() and not block.body.isVisible()  # folded
    assert block.toggle.text() == f"Thought for {len(THOUGHT.split())} words"
    assert widget.text == ANSWERED
    block.toggle.click()
    assert block.body.isVisible() and block.body.text() == THOUGHT.strip()
    answer = window.store.messages(window.controller.current.id)[-1]
    assert (answer.content, answer.thinking) == (ANSWERED, THOUGHT)
    assert window.draft_panel.trace.rounds[0].thinking
    assert "thinking&nbsp;rounds" in window.draft_panel.legend.text()  # the band's key, for this answer
    # the switch off, for this chat: the template writes the empty block
    window.settings_drawer.thinking.setChecked(False)
    runner.chat = _scripted(runner, ["Hello again."], prompts)
    with qtbot.waitSignal(window.controller.busy_changed, check_params_cb=lambda busy: not busy, timeout=60_000):
        window.send("Hi again")
    assert prompts[-1].endswith("<think>\n\n</think>\n\n") and not window.chat_view.last_message().thinking.isVisible()
    assert "thinking&nbsp;rounds" not in window.draft_panel.legend.text()  # an answer without thinking
    assert window.store.get_conversation(window.controller.current.id).settings["thinking"] is False  # per chat
    window.close()
