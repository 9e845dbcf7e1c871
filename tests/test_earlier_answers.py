"""Going back over a chat (issue 35): an older answer clicked shows its own rounds in the side panel,
named, while the answer being written keeps streaming into its own; and a race kept with the chat
opens again, as it ended, from the link under the question it raced. No model: the chats are
written into the history by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLabel  # noqa: E402

from app.chat.baseline import Baseline  # noqa: E402
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Chip, RoundTrace, TurnTrace  # noqa: E402
from app.engine.events import Finished, GenerationStats  # noqa: E402

BASELINE = Baseline((0.1, 0.125, 0.08), context=120, tokens=32)


def _trace(first_word: str, rounds: int) -> TurnTrace:
    """A trace whose chips say which answer it is (`first_word`), `rounds` passes long."""
    trace = TurnTrace([RoundTrace(0, 0, "", (Chip(5, first_word, TARGET),), first_word, 1, at=0.0)], BASELINE)
    trace.add(RoundTrace(i, 3, "model", (Chip(1, " a", ACCEPTED), Chip(2, " r", REJECTED), Chip(3, " t", TARGET)),
                         " a t", 2, at=0.05 * i) for i in range(1, rounds + 1))
    return trace


@pytest.fixture
def chat(offline_window, qtbot):
    """A window with a chat of two answers, each stored with its own rounds."""
    window = offline_window()
    qtbot.waitUntil(lambda: window.header.target_slot.name.text() == "No model loaded", timeout=30_000)
    window.side_panel_action.setChecked(True)
    store = window.store
    conversation = store.create_conversation("Food")
    store.add_turn(conversation.id, "Name a fruit", "Apple.", trace=_trace("Apple", 3).to_dict())
    store.add_turn(conversation.id, "Name a vegetable", "Carrot.", trace=_trace("Carrot", 5).to_dict())
    window.controller.open(conversation.id)
    return window


def _first_chips(window) -> str:
    rounds = window.draft_panel.rounds_view.model_.rounds()
    return rounds[0].chips[0].text if rounds else ""


def test_an_older_answer_clicked_shows_its_rounds_in_the_panel(chat, qtbot):
    window = chat
    panel = window.draft_panel
    first, last = (m for m in window.chat_view.messages() if m.role == "assistant")
    assert _first_chips(window) == "Carrot" and not panel.source_label.isVisible()  # the latest, on opening
    qtbot.mouseClick(first.body.viewport(), Qt.MouseButton.LeftButton)  # on its text
    assert _first_chips(window) == "Apple" and len(panel.trace.rounds) == 4
    assert panel.source_label.isVisible() and panel.source_label.text() == "Showing the answer to “Name a fruit”"
    assert panel.tiles["tokens_per_pass"].value.text() == f"{panel.trace.figures().tokens_per_pass:.2f}"
    qtbot.mouseClick(last.role_label, Qt.MouseButton.LeftButton)  # anywhere on the message
    assert _first_chips(window) == "Carrot" and not panel.source_label.isVisible()
    user = next(m for m in window.chat_view.messages() if m.role == "user")
    qtbot.mouseClick(user.body.viewport(), Qt.MouseButton.LeftButton)  # a question has no rounds
    assert _first_chips(window) == "Carrot"


def test_the_answer_being_written_streams_into_its_own_rows_only(chat, qtbot):
    """With an older answer's rounds on the panel, the live answer's rounds were added to them."""
    from ui.chat.controller import _Pending
    from ui.panel.draft_panel import REFRESH_MS

    window = chat
    controller, panel = window.controller, window.draft_panel
    first, last = (m for m in window.chat_view.messages() if m.role == "assistant")
    # the last answer is being written again (as by Regenerate): its trace is live on the panel
    live = _trace("Beet", 2)
    controller.pending = _Pending(controller.current.id, last.message_id, {}, live)
    try:
        controller._attach(last)
        qtbot.mouseClick(last.body.viewport(), Qt.MouseButton.LeftButton)
        assert panel.trace is live
        qtbot.mouseClick(first.body.viewport(), Qt.MouseButton.LeftButton)
        assert _first_chips(window) == "Apple"
        more = [RoundTrace(3, 3, "model", (Chip(1, " b", ACCEPTED),), " b", 1, at=0.2)]
        controller._on_rounds(more)  # the worker's report, as it comes
        qtbot.wait(REFRESH_MS + 100)
        assert _first_chips(window) == "Apple" and len(panel.rounds_view.model_.rounds()) == 4
        assert live.rounds[-1] is more[0]  # the live answer kept it
        qtbot.mouseClick(last.body.viewport(), Qt.MouseButton.LeftButton)  # back to the live answer
        assert panel.trace is live and panel.rounds_view.model_.rounds()[-1] is more[0]
    finally:
        controller.pending = None


def _race_side(text: str, tokens_per_s: float, drafted: int) -> dict:
    return {"tokens": 12, "tokens_per_s": tokens_per_s, "decode_s": 1.2, "drafted": drafted,
            "acceptance": 0.75 if drafted else 0.0, "tokens_per_round": 2.5 if drafted else 1.0, "text": text}


def _race_link(window) -> QLabel:
    links = [label for label in window.chat_view.findChildren(QLabel, "noticeLabel") if "Show the race" in label.text()]
    assert len(links) == 1
    return links[0]


def test_a_race_kept_with_the_chat_opens_again_from_under_its_question(chat, qtbot):
    window = chat
    store, controller = window.store, window.controller
    question = [m for m in store.messages(controller.current.id) if m.role == "user"][-1]
    record = {"ratio": 1.8, "greedy": True, "identical": True, "temperature": 0.0, "target": "Big", "draft": "small",
              "alone": _race_side("Carrot.", 10.0, 0), "speculative": _race_side("Carrot.", 18.0, 16)}
    store.save_race(question.id, record)
    controller.open(controller.current.id)  # as the chat opens again, days later
    assert "Race (Big with small): speculation ran 1.80× as fast" in window.chat_view.plain_text()
    _race_link(window).linkActivated.emit("open")
    dialog = window.race.kept
    assert dialog is not None and dialog.isVisible() and not dialog.running
    assert [t.toPlainText() for t in dialog.texts] == ["Carrot.", "Carrot."]
    assert "1.80×" in dialog.summary.text() and "identical" in dialog.summary.text()
    assert dialog.stats[0].text().startswith("12 tokens in 1.20 s")
    assert "75% of drafts accepted" in dialog.stats[1].text()
    assert "temperature 0" in dialog.how.text()
    dialog.close()


def test_a_kept_race_from_before_its_texts_were_kept_or_damaged_still_opens(chat, qtbot):
    from ui.panel.race_dialog import NO_TEXT

    window = chat
    store, controller = window.store, window.controller
    question = [m for m in store.messages(controller.current.id) if m.role == "user"][0]
    store.save_race(question.id, {"ratio": 1.2, "greedy": False, "identical": False,
                                  "alone": {"tokens": "many"}, "speculative": 5})
    controller.open(controller.current.id)
    _race_link(window).linkActivated.emit("open")
    dialog = window.race.kept
    assert dialog.isVisible()
    assert [t.toPlainText() for t in dialog.texts] == [NO_TEXT, NO_TEXT]
    assert all("could not be read" in s.text() for s in dialog.stats)
    assert "could not be read" in dialog.summary.text()
    assert "Above temperature 0" in dialog.how.text()
    dialog.close()


def test_a_races_record_keeps_both_answers_texts():
    from ui.worker import RaceResult

    def finished(text: str, drafted: int) -> Finished:
        stats = GenerationStats(prompt_tokens=5, tokens=3, rounds=2, decode_tokens=2, drafted=drafted, accepted=drafted,
                                prefill_s=0.1, decode_s=0.2, finish_reason="stop")
        return Finished(stats, text)

    record = RaceResult(finished("Kiwi.", 0), finished("Kiwi.", 4), greedy=True).to_dict()
    assert record["alone"]["text"] == record["speculative"]["text"] == "Kiwi."
