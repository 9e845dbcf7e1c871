"""The window's parts without a model: Markdown rendering, messages, the composer, chat settings,
the conversation list, a damaged or locked history, a missing model, context fitting in the
worker, the theme. Fast: nothing here loads weights."""

from __future__ import annotations

import sqlite3

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox  # noqa: E402

from app.draft_choice import PROMPT_LOOKUP
from app.chat.history import HistoryStore  # noqa: E402
from app.chat.markdown import MarkdownRenderer  # noqa: E402
from app.chat.settings import ChatSettings  # noqa: E402
from app.engine.events import Finished, GenerationStats, Notice, Round  # noqa: E402
from app.runner import ChatRequest  # noqa: E402

CODE_ANSWER = "Here you go:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nDone. <b>not bold</b>"


# Markdown


def test_markdown_code_blocks_are_coloured_with_a_copy_link_and_raw_html_is_text():
    rendered = MarkdownRenderer().render(CODE_ANSWER)
    assert rendered.code_blocks == ["def add(a, b):\n    return a + b"]
    assert 'href="copy:0"' in rendered.html and ">python<" in rendered.html
    assert "<span style=" in rendered.html  # pygments colours, inline
    assert "&lt;b&gt;not bold&lt;/b&gt;" in rendered.html and "<b>" not in rendered.html


def test_markdown_of_an_unfinished_answer_shows_the_open_code_block_as_code():
    rendered = MarkdownRenderer().render("Look:\n\n```python\nx = 1\ny = ")
    assert rendered.code_blocks == ["x = 1\ny = "]
    assert "<pre" in rendered.html


def test_markdown_images_are_never_loaded_only_named():
    rendered = MarkdownRenderer().render("See ![the passwd](/etc/passwd) and ![](https://example.com/x.png).")
    assert "<img" not in rendered.html
    assert "the passwd" in rendered.html and "/etc/passwd" in rendered.html
    assert "https://example.com/x.png" in rendered.html


# Messages


TINTED_ANSWER = "# Plan\n\nUse **this**:\n\n```python\nprint(1)\n```\n"


def test_a_tinted_answer_is_still_markdown_with_its_text_coloured(qtbot):
    from ui.chat.message_widget import MessageWidget
    from ui.panel.colors import LIGHT

    widget = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(widget)
    drafted = len("# Plan\n\nUse **this**:\n\n```python\npri")  # a draft wrote up to "pri", the target the rest
    widget.set_spans([(drafted, "accepted"), (len(TINTED_ANSWER) - drafted, "target")])
    widget.set_tint(False)
    widget.finish(TINTED_ANSWER, "complete")
    assert widget.tinted
    text = widget.body.toPlainText()
    assert "```" not in text and "#" not in text and "**" not in text  # rendered, not shown raw
    assert "Plan" in text and "print(1)" in text and widget.code_blocks == ["print(1)"]
    document = widget.body.document()
    assert document.firstBlock().blockFormat().headingLevel() == 1
    colours = {}
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            colours.setdefault(fragment.charFormat().background().color().name(), "")
            colours[fragment.charFormat().background().color().name()] += fragment.text()
            it += 1
        block = block.next()
    assert colours[LIGHT["accepted"].background].startswith("Plan") and "pri" in colours[LIGHT["accepted"].background]
    assert colours[LIGHT["target"].background] == "nt(1)"
    widget.set_tint(None)
    assert not widget.tinted and "```" not in widget.body.toPlainText()


TRICKY_MARKDOWN = [
    "| a | b |\n|---|---|\n| 1 & 2 | <x> |\n\nafter",
    "> quote **bold** and `code`\n\n- item [link](https://example.com/a/long/path?q=1&r=2)\n  - nested",
    "Escapes: \\*not em\\* and 5 < 6 > 4 &amp; &copy;\n\n    indented code\n\n1. one\n2. two",
    "```\nno lang & <tag>\n```\n\n```js\nlet x = `t`;\n```\nline  \nbreak ~~strike~~ ![i](/etc/passwd)",
    "# H1\n### H3 with `code`\n\n***\n\nUnfinished ```python\nx = [1,\n",
]


@pytest.mark.parametrize("text", TRICKY_MARKDOWN)
def test_tinting_never_changes_what_an_answer_says(qapp, text):
    from PySide6.QtGui import QTextDocument

    from app.chat.markdown import Tint

    spans = [(3, "accepted"), (2, "target")] * (len(text) // 5 + 1)
    plain, tinted = QTextDocument(), QTextDocument()
    renderer = MarkdownRenderer()
    plain.setHtml(renderer.render(text).html)
    tinted.setHtml(renderer.render(text, Tint(spans, {"accepted": "background-color:#00ff00;",
                                                      "target": "background-color:#0000ff;"})).html)
    assert tinted.toPlainText() == plain.toPlainText()
    assert "#00ff00" in tinted.toHtml() and "#0000ff" in tinted.toHtml()


def test_a_message_never_loads_an_image_from_the_answer(qtbot):
    from ui.chat.message_widget import MessageWidget

    widget = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(widget)
    widget.finish("![x](/etc/passwd) ![y](https://example.com/a.png)", "complete")
    document = widget.body.document()
    formats = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            formats.append(it.fragment().charFormat().isImageFormat())
            it += 1
        block = block.next()
    assert not any(formats)
    assert "/etc/passwd" in widget.body.toPlainText() and "x" in widget.body.toPlainText()


def test_a_message_renders_markdown_and_copies_code_and_text(qtbot):
    from ui.chat.message_widget import MessageWidget

    widget = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(widget)
    widget.finish(CODE_ANSWER, "complete", {"tokens": 12, "tokens_per_s": 30.5, "drafted": 10, "acceptance": 0.7})
    assert "def add(a, b):" in widget.body.toPlainText()
    assert "**" not in widget.body.toPlainText()
    assert widget.stats_label.text() == "12 tokens · 30.5 tok/s · 70% of drafts accepted"
    follow_up = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(follow_up)
    follow_up.finish("Yes.", "complete", {"tokens": 2, "tokens_per_s": 20.0, "prefill_s": 0.051,
                                          "prompt_tokens": 1480, "reused_tokens": 1466})
    assert follow_up.stats_label.text() == ("2 tokens · 20.0 tok/s · first token in 0.05s, "
                                            "1,466 of 1,480 prompt tokens kept")
    widget.body.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "def add(a, b):\n    return a + b"
    widget.copy_message()
    assert QGuiApplication.clipboard().text() == CODE_ANSWER


def test_a_streaming_message_renders_at_most_at_the_coalesced_rate(qtbot):
    from ui.chat.message_widget import MIN_RENDER_INTERVAL_S, MessageWidget

    widget = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(widget)
    renders = []
    original = widget._render
    widget._render = lambda: (renders.append(1), original())
    widget._render_timer.timeout.disconnect()
    widget._render_timer.timeout.connect(widget._render)
    for word in ["Hello", " there", ",", " friend", "."]:
        widget.stream(word)
    assert len(renders) == 1  # the first at once, the rest wait for the interval
    qtbot.waitUntil(lambda: widget.body.toPlainText().strip() == "Hello there, friend.", timeout=2000)
    assert len(renders) == 2
    assert widget._render_interval >= MIN_RENDER_INTERVAL_S


def test_stopped_and_failed_answers_are_marked(qtbot):
    from ui.chat.message_widget import MessageWidget

    widget = MessageWidget("assistant", MarkdownRenderer())
    qtbot.addWidget(widget)
    widget.finish("Once upon", "stopped")
    assert widget.status_tag.text() == "Stopped" and not widget.status_tag.isHidden()
    widget.finish("", "error", error="The answer failed: out of memory")
    assert widget.status_tag.text() == "Failed" and widget.error_label.text().endswith("out of memory")


# Composer


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot):
    from ui.chat.composer import Composer

    composer = Composer()
    qtbot.addWidget(composer)
    sent = []
    composer.send_requested.connect(sent.append)
    composer.set_ready(True)
    qtbot.keyClicks(composer.edit, "first line")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(composer.edit, "second")
    assert composer.text() == "first line\nsecond" and sent == []
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond"]

    composer.set_busy(True)  # an answer is being written: typing goes on, sending waits
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond"] and composer.stop_button.isVisibleTo(composer)


# Settings


def test_chat_settings_round_trip_and_survive_bad_stored_values():
    settings = ChatSettings(temperature=0.3, top_p=0.9, top_k=0, max_tokens=64, draft_tokens=5, drafter=PROMPT_LOOKUP)
    assert ChatSettings.from_dict(settings.to_dict()) == settings
    damaged = ChatSettings.from_dict({"temperature": -1, "top_k": "many", "drafter": "magic", "unknown": 1})
    assert damaged == ChatSettings()
    assert ChatSettings().sampling().temperature == 0.7
    with pytest.raises(ValueError, match="draft tokens"):
        ChatSettings(draft_tokens=99)


def test_the_settings_drawer_shows_and_reports_settings(qtbot):
    from ui.chat.settings_drawer import SettingsDrawer

    drawer = SettingsDrawer()
    qtbot.addWidget(drawer)
    assert drawer.values() == ChatSettings()
    assert drawer.draft_tokens.text() == "auto" and drawer.temperature.toolTip()
    with qtbot.waitSignal(drawer.settings_changed) as blocker:
        drawer.top_k.setValue(0)
    assert blocker.args[0].top_k == 0 and drawer.top_k.text() == "off"
    with qtbot.waitSignal(drawer.system_prompt_changed, timeout=2000) as blocker:
        drawer.system_prompt.setPlainText("Be brief.")
    assert blocker.args[0] == "Be brief."
    drawer.set_pair_draft("prompt lookup")
    assert drawer.drafter.itemText(0) == "The pair's draft (prompt lookup)"
    assert drawer.trees.currentText() == "Auto: where they pay" and drawer.trees.isEnabled()
    with qtbot.waitSignal(drawer.settings_changed) as blocker:
        drawer.trees.setCurrentIndex(drawer.trees.findText("Off: chains only"))
    assert blocker.args[0].trees == "off"
    drawer.set_values(ChatSettings(trees="on"), "")
    assert drawer.trees.currentText() == "Always" and drawer.values().trees == "on"


def test_the_trees_box_says_why_a_target_checks_chains_and_keeps_the_chats_choice(qtbot):
    from ui.chat.settings_drawer import SettingsDrawer

    drawer = SettingsDrawer()
    qtbot.addWidget(drawer)
    drawer.set_values(ChatSettings(trees="on"), "")
    drawer.set_trees_note("trees of drafts are verified on the CPU only so far (not in CUDA graphs)")
    assert not drawer.trees.isEnabled()
    tip = " ".join(drawer.trees.toolTip().split())  # wrapped for the screen
    assert "one guess per position" in tip and "(not in CUDA graphs)" in tip
    assert drawer.values().trees == "on"  # kept for a target that takes trees
    drawer.set_trees_note("")
    assert drawer.trees.isEnabled() and "second guesses" in " ".join(drawer.trees.toolTip().split())
    with pytest.raises(ValueError, match="trees must be one of auto, on, off"):
        ChatSettings(trees="sometimes")


# The window without a model


def test_a_bad_model_path_is_reported_in_the_window(offline_window, qtbot):
    window = offline_window()
    qtbot.waitUntil(lambda: any("Could not load" in text for text in window.banners.texts()), timeout=30_000)
    assert any("no such file or folder" in text for text in window.banners.texts())
    assert not window.composer.send_button.isEnabled()
    assert window.header.target_slot.name.text() == "No model loaded"
    assert not window.send("Hello")


def test_a_corrupt_history_is_moved_aside_with_a_message(offline_window, tmp_path):
    history = tmp_path / "history.sqlite3"
    history.write_bytes(b"SQLite format 3\x00" + b"\x13" * 5000)
    window = offline_window(history)
    assert any("damaged" in text and "moved" in text for text in window.banners.texts())
    moved = list(tmp_path.glob("history.sqlite3.corrupt-*"))
    assert len(moved) == 1 and moved[0].read_bytes().startswith(b"SQLite format 3\x00\x13\x13")
    assert window.store.list_conversations() == []
    window.store.create_conversation("still works")


def test_a_locked_history_is_left_alone_and_the_session_runs_in_memory(offline_window, tmp_path):
    history = tmp_path / "history.sqlite3"
    with HistoryStore.open(history) as store:
        store.create_conversation("kept")
    other = sqlite3.connect(history, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another Tandem writing
    try:
        window = offline_window(history)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert any("locked" in text and "memory" in text for text in window.banners.texts())
    assert str(window.store.path) == ":memory:"
    with HistoryStore.open(history) as store:
        assert [c.title for c in store.list_conversations()] == ["kept"]


def _history_with(tmp_path, titles):
    with HistoryStore.open(tmp_path / "history.sqlite3") as store:
        for title in titles:
            conversation = store.create_conversation(title)
            store.add_turn(conversation.id, f"question about {title}", f"answer about {title}")


def test_the_conversation_list_creates_renames_searches_and_deletes(offline_window, tmp_path, qtbot, monkeypatch):
    _history_with(tmp_path, ["Dragons", "Knights", "Castles"])
    window = offline_window()
    chats = window.conversation_list
    assert chats.titles() == ["Castles", "Knights", "Dragons"]

    chats.list.setCurrentRow(1)
    assert window.controller.current.title == "Knights"
    assert "answer about Knights" in window.chat_view.plain_text()

    chats.list.item(1).setText("Brave knights")  # what an in-place edit does
    assert window.store.get_conversation(chats.ids()[1]).title == "Brave knights"
    chats.list.item(1).setText("   ")  # an empty name is refused
    assert chats.titles()[1] == "Brave knights"

    chats.search.setText("DRAG")
    qtbot.waitUntil(lambda: chats.titles() == ["Dragons"], timeout=2000)
    chats.search.setText("")
    qtbot.waitUntil(lambda: len(chats.titles()) == 3, timeout=2000)

    knights = chats.ids()[1]
    asked = answer_next_dialog("Cancel")  # the real box: Cancel keeps the chat
    window.delete_conversation(knights)
    assert knights in chats.ids() and "Brave knights" in asked["text"]
    asked = answer_next_dialog("Delete")
    window.delete_conversation(knights)
    assert asked["destructive"] and chats.titles() == ["Castles", "Dragons"]
    assert window.controller.current is None and window.chat_view.currentIndex() == 0

    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    chats.list.setCurrentRow(0)
    qtbot.keyClick(window.chat_view, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.current is None and window.chat_view.currentIndex() == 0


def answer_next_dialog(button_text: str) -> dict:
    """Click `button_text` on the next modal dialog once it is open (the real QMessageBox, run by
    its own event loop); what it asked is filled in the dict returned."""
    asked: dict = {}

    def click() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(10, click)  # not open yet
            return
        button = next(b for b in box.buttons() if b.text().replace("&", "") == button_text)
        asked.update(text=box.text(), destructive=box.buttonRole(button) == QMessageBox.ButtonRole.DestructiveRole)
        button.click()

    QTimer.singleShot(0, click)
    return asked


def test_delete_from_the_list_menu_asks_with_the_real_dialog(offline_window, tmp_path):
    _history_with(tmp_path, ["Dragons"])
    window = offline_window()
    dragons = window.conversation_list.ids()[0]
    window.conversation_list.list.setCurrentRow(0)
    answer_next_dialog("Delete")
    window.conversation_list.delete_requested.emit(dragons)  # what "Delete…" in the context menu sends
    assert window.conversation_list.ids() == [] and window.store.list_conversations() == []
    assert window.controller.current is None


def test_search_says_when_nothing_matches(offline_window, tmp_path, qtbot):
    _history_with(tmp_path, ["Dragons", "Knights"])
    window = offline_window()
    chats = window.conversation_list
    assert chats.empty_label.isHidden()
    chats.search.setText("unicorns")
    qtbot.waitUntil(lambda: chats.titles() == [], timeout=2000)
    assert not chats.empty_label.isHidden() and "No matches" in chats.empty_label.text()
    assert "unicorns" in chats.empty_label.text()
    chats.search.setText("")
    qtbot.waitUntil(lambda: len(chats.titles()) == 2, timeout=2000)
    assert chats.empty_label.isHidden()


def test_the_rename_editor_is_a_normal_line_edit_height(offline_window, tmp_path, qtbot):
    _history_with(tmp_path, ["Dragons"])
    window = offline_window()
    window.conversation_list.start_rename(window.conversation_list.ids()[0])
    editor = window.conversation_list.list.findChild(QLineEdit)
    qtbot.waitUntil(lambda: editor.isVisible())
    assert editor.height() >= editor.sizeHint().height() >= editor.fontMetrics().height() + 8


def test_copy_says_copied(offline_window, tmp_path, qtbot):
    _history_with(tmp_path, ["Dragons"])
    window = offline_window()
    window.conversation_list.list.setCurrentRow(0)
    answer = window.chat_view.last_message()
    qtbot.mouseClick(answer.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == "answer about Dragons"
    assert answer.copy_button.text() == "Copied" and "Copied" in window.status.currentMessage()
    qtbot.waitUntil(lambda: answer.copy_button.text() == "Copy", timeout=5000)  # only for a moment
    window.copy_last_answer()  # Ctrl+Shift+C
    assert answer.copy_button.text() == "Copied"


def test_the_side_panel_and_the_settings_drawer_toggle_and_stay_open(offline_window, qtbot):
    window = offline_window()
    assert window.side_panel_host.title.text() == "Draft activity"
    assert window.side_panel_host.content.itemAt(0).widget() is window.draft_panel
    assert not window.side_panel_host.isHidden()  # Tandem's signature: shown on a first start
    qtbot.waitUntil(lambda: window.splitter.sizes()[2] >= window.side_panel_host.minimumWidth())
    window.header.side_panel_button.click()
    assert not window.side_panel_action.isChecked() and window.side_panel_host.isHidden()
    window.settings_action.trigger()
    assert not window.settings_drawer.isHidden()
    window.close()

    again = offline_window()  # the same settings file: the next start
    assert again.side_panel_host.isHidden() and not again.settings_drawer.isHidden()
    assert not again.header.side_panel_button.isChecked()
    again.header.side_panel_button.click()
    assert not again.side_panel_host.isHidden()


# The worker's context fitting, without a model


class _FakeTokenizer:
    def render_chat(self, messages, tools=None, thinking=None):
        return [0] * sum(len(m["content"].split()) + 2 for m in messages)

    def token_text(self, token_id):
        return f"<{token_id}>"


class _FakeLoaded:
    context_length = 100


class _FakeRunner:
    def __init__(self):
        self.loaded, self.tokenizer, self.requests = _FakeLoaded(), _FakeTokenizer(), []

    def cancel(self):
        pass

    def chat(self, request):
        self.requests.append(request)
        yield Round(0, (), 0, (1,), "ok")
        yield Finished(GenerationStats(1, 1, 1, 1, 0, 0, 0.0, 0.1, "stop"), "ok")


class _FittingRunner(_FakeRunner):
    """Fits as the real runner does (Runner.fit, tested in test_chat_context.py) over the fake
    tokenizer: a Notice for what it left out, ContextOverflowError for what cannot fit."""

    remote = None  # a local target, as Runner.fit asks

    def chat(self, request):
        from app.runner import Runner

        request, left_out = Runner.fit(self, request)
        if left_out:
            yield Notice(left_out)
        yield from super().chat(request)


def test_the_worker_passes_on_what_the_runner_left_out(qtbot):
    from ui.worker import EngineWorker

    runner = _FittingRunner()
    worker = EngineWorker(runner)
    notices = []
    worker.notice.connect(notices.append)
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        messages += [{"role": "user", "content": f"question {i} " + "w " * 10},
                     {"role": "assistant", "content": f"answer {i} " + "w " * 10}]
    messages.append({"role": "user", "content": "last question"})
    with qtbot.waitSignal(worker.finished):
        worker.generate(ChatRequest(tuple(messages), max_tokens=20))
    sent = runner.requests[0].messages
    assert sent[0]["content"] == "be brief" and sent[-1]["content"] == "last question"
    assert len(sent) < len(messages)
    assert notices == [f"{len(messages) - len(sent)} earlier messages were left out to fit the model's context."]


def test_the_worker_reports_a_message_that_cannot_fit(qtbot):
    from ui.worker import EngineWorker

    worker = EngineWorker(_FittingRunner())
    with qtbot.waitSignal(worker.failed) as blocker:
        worker.generate(ChatRequest(({"role": "user", "content": "w " * 200},), max_tokens=20))
    assert "context holds" in blocker.args[0]


# Theme, and the PySide6 build


def test_the_theme_can_be_forced_dark(monkeypatch):
    from ui import theme

    monkeypatch.setenv("TANDEM_THEME", "dark")
    assert theme.requested_theme() is theme.DARK
    monkeypatch.setenv("TANDEM_THEME", "light")
    assert theme.requested_theme() is theme.LIGHT
    assert "$" not in theme.DARK.stylesheet()


def test_qt_calls_do_not_use_up_none(qtbot):
    """PySide6 6.12.0 on CPython 3.11 drops a reference to None per void call and aborts the app
    within minutes of streaming; pyproject excludes it. This catches a build with that bug."""
    import sys

    from PySide6.QtWidgets import QLabel

    label = QLabel()
    qtbot.addWidget(label)
    before = sys.getrefcount(None)
    for _ in range(1000):
        label.setText("x")
    lost = before - sys.getrefcount(None)
    assert lost <= 0
