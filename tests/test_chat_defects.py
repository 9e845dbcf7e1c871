"""Issue 46's chat defects, each pinned: an edit keeps the earlier question and its answers as a
branch one click away (‹ 1/2 › on the message, any message of yours, the branch shown exported);
titles are stored whole and never carry a "…" into exports; the graphs' PNG says whose answer
it is, with which pair and figures; the tint leaves code's highlighting visible; and no text an
answer holds is ever read as the tint's own markers. No model: the engine's signals are played
by the test, as in tests/test_chat_turns.py."""

from __future__ import annotations

import sqlite3

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QColor, QImage, QTextDocument  # noqa: E402

from app.chat import history  # noqa: E402
from app.chat.export import chat_markdown, file_name  # noqa: E402
from app.chat.history import HistoryError, HistoryStore, auto_title  # noqa: E402
from app.chat.markdown import MarkdownRenderer, Tint  # noqa: E402
from app.chat.trace import ACCEPTED, TARGET  # noqa: E402

# the window told a pair is loaded, and the stand-in for the worker's thread, as the turn tests have them
from tests.test_chat_turns import OLD_PAIR as PAIR, Engine, chat  # noqa: E402, F401 (a fixture)


@pytest.fixture
def store(tmp_path):
    with HistoryStore.open(tmp_path / "history.sqlite3") as store:
        yield store


def _said(window) -> list[str]:
    return [m.text for m in window.chat_view.messages()]


def _stored(store, conv_id) -> list[str]:
    return [m.content for m in store.messages(conv_id)]


# Editing keeps the earlier branch


def test_editing_any_message_keeps_the_earlier_branch_one_click_away(chat, qtbot, tmp_path):  # noqa: F811 (the imported fixture)
    window, engine = chat
    assert window.send("Name a colour")
    engine.answer("Blue.")
    assert window.send("Why?")
    engine.answer("Because.")
    first = window.chat_view.messages()[0]
    assert first.edit_button.isVisibleTo(window)  # not only the last message of yours
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    assert window.composer.editing and window.composer.text() == "Name a colour"
    window.composer.set_text("Name a fruit")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    assert [m["content"] for m in engine.requests[-1].messages] == ["Name a fruit"]  # the branch, not the old turns
    engine.answer("Apple.")
    assert _said(window) == ["Name a fruit", "Apple."]

    question = window.chat_view.messages()[0]
    assert question.version_label.text() == "2/2" and question.previous_button.isVisibleTo(window)
    qtbot.mouseClick(question.previous_button, Qt.MouseButton.LeftButton)  # ‹: the old question and its answers
    assert _said(window) == ["Name a colour", "Blue.", "Why?", "Because."]
    question = window.chat_view.messages()[0]
    assert question.version_label.text() == "1/2" and question.next_button.isEnabled()
    conv_id = window.controller.current.id
    assert _stored(window.store, conv_id) == ["Name a colour", "Blue.", "Why?", "Because."]
    conversation = window.store.get_conversation(conv_id)
    exported = chat_markdown(conversation, window.store.messages(conv_id))  # the branch shown
    assert "## You (version 1 of 2)\n\nName a colour" in exported and "Why?" in exported and "Apple." not in exported

    window.send("And green?")  # the model reads the branch on screen
    assert [m["content"] for m in engine.requests[-1].messages] == ["Name a colour", "Blue.", "Why?", "Because.",
                                                                     "And green?"]
    engine.answer("Grass.")
    window.controller.open(None)
    window.controller.open(conv_id)  # as after a restart: the branch that was on screen
    assert _said(window)[-1] == "Grass."
    qtbot.mouseClick(window.chat_view.messages()[0].next_button, Qt.MouseButton.LeftButton)  # ›
    assert _said(window) == ["Name a fruit", "Apple."]
    exported = chat_markdown(window.store.get_conversation(conv_id), window.store.messages(conv_id))
    assert "## You (version 2 of 2)\n\nName a fruit" in exported and "Why?" not in exported


def test_another_version_of_a_question_is_shown_where_the_question_was(chat, qtbot):  # noqa: F811 (the imported fixture)
    """The chat is filled again from the question down: it stays where it was on screen, rather
    than the chat jumping to its end."""
    window, engine = chat
    window.resize(1100, 650)
    for i in range(4):
        window.send(f"Question {i}")
        engine.answer(f"Answer {i}.\n\n" * 10)
    window.edit_message(window.chat_view.messages()[4])
    window.composer.set_text("Question 2, again")
    qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
    engine.answer("Short.")
    bar, view = window.chat_view.scroll.verticalScrollBar(), window.chat_view
    qtbot.waitUntil(lambda: bar.maximum() > 300)
    bar.setValue(bar.maximum() - 150)
    question = view.messages()[4]
    where = question.mapTo(view, question.rect().topLeft()).y()
    qtbot.mouseClick(question.previous_button, Qt.MouseButton.LeftButton)
    qtbot.wait(100)  # the longer branch is laid out
    question = view.messages()[4]
    assert question.text == "Question 2" and bar.maximum() > bar.value() + 300  # not at the end
    assert question.mapTo(view, question.rect().topLeft()).y() == where


def test_branches_nest_and_each_keeps_the_branch_chosen_inside_it(store):
    conv = store.create_conversation()
    store.add_turn(conv.id, "one", "1")
    two, _ = store.add_turn(conv.id, "two", "2")
    three, _ = store.add_turn(conv.id, "three", "3")
    new_two, answer = store.edit_user(two.id, "TWO", "2!")
    assert (new_two.branch, new_two.branches, new_two.position, answer.position) == (2, 2, 2, 3)
    assert _stored(store, conv.id) == ["one", "1", "TWO", "2!"]
    store.add_turn(conv.id, "four", "4")
    four = store.messages(conv.id)[-2]
    store.edit_user(four.id, "FOUR", "4!")  # a branch inside the second branch
    assert _stored(store, conv.id) == ["one", "1", "TWO", "2!", "FOUR", "4!"]

    store.show_branch(new_two.id, 1)
    assert _stored(store, conv.id) == ["one", "1", "two", "2", "three", "3"]
    (first_three,) = [m for m in store.messages(conv.id) if m.content == "three"]
    assert first_three.id == three.id and (first_three.branch, first_three.branches) == (1, 1)
    store.show_branch(two.id, 2)  # back: with the branch that was chosen inside it
    assert _stored(store, conv.id) == ["one", "1", "TWO", "2!", "FOUR", "4!"]
    four_shown = store.messages(conv.id)[-2]
    assert (four_shown.branch, four_shown.branches) == (2, 2)
    with pytest.raises(HistoryError, match="no version 3"):
        store.show_branch(two.id, 3)
    with pytest.raises(HistoryError, match="not on screen"):
        store.edit_user(three.id, "hidden", "x")  # in a branch not shown
    assert store.list_conversations("three")[0].id == conv.id  # search finds every branch


def test_a_format_3_history_is_migrated_losing_nothing(tmp_path):
    path = tmp_path / "history.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    for step in history.MIGRATIONS[:3]:  # the format Tandem wrote before edits kept their branches
        step(db)
    db.execute("PRAGMA user_version = 3")
    long = "Plan a week in Lisbon with two kids who love trams, the sea and old castles on hills"
    old_title = " ".join(long.split())[:47].rstrip() + "…"  # what Tandem stored until issue 46
    db.execute("INSERT INTO conversations VALUES (1, ?, '', '{}', 1.0, 2.0)", (old_title,))
    db.execute("INSERT INTO conversations VALUES (2, 'Mine, to be continued…', '', '{}', 1.0, 3.0)")
    rows = [(1, 1, 0, "user", long), (2, 1, 1, "assistant", "Day one"), (3, 1, 2, "user", "More?"),
            (4, 1, 3, "assistant", "Day two"), (5, 2, 0, "user", "Hello")]
    for message_id, conv_id, position, role, text in rows:
        db.execute("INSERT INTO messages (id, conversation_id, position, role, content, status, settings, stats, "
                   "trace, created, version, thinking) VALUES (?, ?, ?, ?, ?, 'complete', NULL, NULL, NULL, 1.0, ?, "
                   "'')", (message_id, conv_id, position, role, text, 2 if role == "assistant" else 0))
    for answer_id in (2, 4):
        for number in (1, 2):
            db.execute("INSERT INTO answer_versions VALUES (?, ?, ?, 'complete', NULL, NULL, NULL, 1.0, '')",
                       (answer_id, number, f"v{number}"))
    db.close()
    with HistoryStore.open(path) as store:
        assert _stored(store, 1) == [long, "Day one", "More?", "Day two"]
        assert [len(store.versions(answer_id)) for answer_id in (2, 4)] == [2, 2]
        assert all(m.branches == (1 if m.role == "user" else 0) for m in store.messages(1))
        title = store.get_conversation(1).title
        assert "…" not in title and title == auto_title(long)  # restored from the question it was cut from
        assert store.get_conversation(2).title == "Mine, to be continued…"  # a name the user chose stays
        store.edit_user(3, "Less?", "Rest")
        assert _stored(store, 1) == [long, "Day one", "Less?", "Rest"]
        store.show_branch(3, 1)
        assert _stored(store, 1) == [long, "Day one", "More?", "Day two"]
        assert [v.content for v in store.versions(4)] == ["v1", "v2"]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (len(history.MIGRATIONS),)


# Titles


def test_titles_are_stored_whole_or_cut_at_a_word_and_exports_never_carry_an_ellipsis(store):
    question = "Plan a week in Lisbon with two kids who love trams and the sea\nmore"
    conv = store.create_conversation()
    store.add_turn(conv.id, question, "Sure.")
    title = store.get_conversation(conv.id).title
    assert title == "Plan a week in Lisbon with two kids who love trams and the sea"
    very_long = "word " * 60
    cut = auto_title(very_long)
    assert "…" not in cut and very_long.startswith(cut) and cut.endswith("word") and len(cut) <= 100
    stored = store.create_conversation("Plan a week in Lisbon with two kids who love…")  # as stored before
    heading = chat_markdown(store.get_conversation(stored.id), []).splitlines()[0]
    assert heading == "# Plan a week in Lisbon with two kids who love"
    assert file_name(stored.title) == "Plan a week in Lisbon with two kids who love.md"


def test_the_chat_list_elides_a_long_title_only_when_drawing(chat):  # noqa: F811 (the imported fixture)
    window, engine = chat
    question = "Plan a week in Lisbon with two kids who love trams and the sea and old castles"
    window.send(question)
    engine.answer("Sure.")
    items = window.conversation_list
    assert items.titles()[0] == question and items.list.item(0).toolTip() == question
    assert items.list.textElideMode() == Qt.TextElideMode.ElideRight


# The graphs' PNG


def test_the_graphs_png_names_the_answer_its_pair_and_its_figures(chat, tmp_path):  # noqa: F811 (the imported fixture)
    window, engine = chat
    window.side_panel_action.setChecked(True)
    window.send("Name a colour")
    engine.answer("Blue is a calm colour.")
    panel = window.draft_panel
    path = tmp_path / "graphs.png"
    panel.export_png(path)
    image = QImage(str(path))
    assert image.height() > panel.graphs.grab().height()  # the lines above the graphs
    assert "Name a colour" in image.text("Title")
    pair = image.text("Pair")
    assert "old-target" in pair and PAIR.draft_words()[0] in pair
    figures = image.text("Figures")
    tiles = panel.tiles
    for name in ("tokens_per_s", "speedup", "acceptance"):
        assert tiles[name].value.text() in figures, (name, figures)
    assert "tok/s" in figures and "accepted" in figures

    window.controller.open(None)  # a stored answer, opened again: its pair comes from the history
    window.controller.open(window.store.list_conversations()[0].id)
    panel.export_png(path)
    assert "old-target" in QImage(str(path)).text("Pair")


# The tint


def _foreground(document: QTextDocument, word: str) -> QColor:
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if word in fragment.text():
                return fragment.charFormat().foreground().color()
            it += 1
        block = block.next()
    raise AssertionError(f"{word!r} is not in the document")


def test_the_tint_keeps_syntax_highlighting_visible_in_code(qapp):
    text = "Here:\n\n```python\ndef f(x):\n    return x\n```\n\nDone."
    renderer = MarkdownRenderer()
    spans = [(len(text), ACCEPTED)]
    styles = {ACCEPTED: "background-color:#d3f0dc; color:#14532d;", TARGET: "background-color:#dbe4ff; color:#1e3a8a;"}
    plain, tinted = QTextDocument(), QTextDocument()
    plain.setHtml(renderer.render(text).html)
    tinted.setHtml(renderer.render(text, Tint(spans, styles)).html)
    keyword = _foreground(plain, "def").name()
    assert keyword != QColor("#14532d").name()
    assert _foreground(tinted, "def").name() == keyword  # the code's own colour
    assert _foreground(tinted, "Done").name() == QColor("#14532d").name()  # prose is tinted


# Markers an answer holds are its text


@pytest.mark.parametrize("text", [
    "\ue002" + "1" * 5000 + "\ue002",
    "before \ue002" + "9" * 5000 + "\ue002 after",
    "\ue00212\ue002 twelve",
    "\ue002\ue002 \ue002-3\ue002 \ue0021e5\ue002",
    "\ue000 chrome? \ue001 no",
    "```\n\ue002" + "7" * 5000 + "\ue002\n```",
    "```python\nx = '\ue000'\n```\n\ue00299999999999999999999999\ue002",
])
def test_a_stored_answer_holding_marker_characters_is_tinted_as_plain_text(qapp, text):
    from ui.chat.message_widget import MessageWidget

    renderer = MarkdownRenderer()
    widget = MessageWidget("assistant", renderer)
    widget.finish(text, "complete")
    untinted = widget.body.toPlainText()
    widget.set_spans([(len(text) // 2, ACCEPTED), (len(text) - len(text) // 2, TARGET)])
    widget.set_tint(False)  # raised ValueError on 5,000 digits; ate the digits of a short marker
    assert widget.tinted and widget.body.toPlainText() == untinted


def test_a_damaged_history_is_read_without_hanging_or_refusing_to_open(tmp_path):
    """A review found two damaged files that the branching broke: links that go round (switching
    branch looped for good, holding the write lock), and two messages at one place of a chat with
    its index lost (the upgrade failed, and a file the previous version opened would not open)."""
    path = tmp_path / "history.sqlite3"
    with HistoryStore.open(path) as store:
        chat = store.create_conversation()
        first, _ = store.add_turn(chat.id, "Q", "A")
        second, answer = store.add_turn(chat.id, "Q2", "A2")
        store.edit_user(second.id, "Q2b", "A2b")
    db = sqlite3.connect(path)
    db.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (answer.id, first.id))  # a loop
    db.commit()
    db.close()
    with HistoryStore.open(path) as store, pytest.raises(HistoryError, match="damaged"):
        store.show_branch(second.id, 1)

    old = tmp_path / "old.sqlite3"
    db = sqlite3.connect(old, isolation_level=None)
    for step in history.MIGRATIONS[:3]:
        step(db)
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO conversations VALUES (1, 'Chat', '', '{}', 1.0, 2.0)")
    db.execute("DROP INDEX messages_in_order")
    for message_id, position, text in ((1, 0, "Hello"), (2, 1, "Hi"), (3, 1, "a second at the same place")):
        db.execute("INSERT INTO messages (id, conversation_id, position, role, content, status, created) "
                   "VALUES (?, 1, ?, ?, ?, 'complete', 1.0)", (message_id, position, "user" if position == 0
                                                               else "assistant", text))
    db.close()
    with HistoryStore.open(old) as store:
        assert [m.content for m in store.messages(1)] == ["Hello", "Hi"]  # the earliest on screen; nothing lost
