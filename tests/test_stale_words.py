"""Words that must not repeat or outlive what they describe (issue 35's defects 4-6): the
alignment card says "cancelled" once, every answer's line has its first-token time (the first of
a chat too), and a round whose only token was the hidden end of the answer draws no empty row."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.chat.trace import TARGET, Chip, RoundTrace  # noqa: E402


@pytest.mark.parametrize("message, title, note", [
    ("Alignment cancelled: nothing was saved.", "Alignment cancelled", "Nothing was saved."),
    ("Alignment cancelled during the pair trial; the aligned draft was kept.",
     "Alignment cancelled during the pair trial", "The aligned draft was kept."),
    ("The job ended when asked to.", "Alignment cancelled", "The job ended when asked to."),
])
def test_a_cancelled_alignment_says_cancelled_once(message, title, note):
    from ui.pairing.align import cancel_words

    got_title, got_note = cancel_words(message)
    assert (got_title, got_note) == (title, note)
    assert f"{got_title} {got_note}".lower().count("cancelled") == 1


def test_the_first_answer_of_a_chat_has_its_first_token_time():
    from ui.chat.message_widget import stats_line

    first = stats_line({"tokens": 12, "tokens_per_s": 30.0, "prefill_s": 0.42, "prompt_tokens": 40,
                        "reused_tokens": 0})
    assert "first token in 0.42s" in first and "kept" not in first
    follow_up = stats_line({"tokens": 12, "tokens_per_s": 30.0, "prefill_s": 0.05, "prompt_tokens": 80,
                            "reused_tokens": 60})
    assert "first token in 0.05s, 60 of 80 prompt tokens kept" in follow_up
    assert "first token" not in stats_line({"tokens": 3, "tokens_per_s": 1.0})  # an old row without the figure


def test_a_round_with_only_the_hidden_end_draws_no_row(qtbot):
    from ui.panel.rounds_view import RoundsView

    view = RoundsView()
    qtbot.addWidget(view)
    shown = RoundTrace(1, 0, "", (Chip(5, "hi", TARGET),), "hi", 2, 0.1)
    only_end = RoundTrace(2, 0, "", (), "", 0, 0.2)  # the end-of-answer token: in neither list
    view.append([shown, only_end])
    assert view.model_.rowCount() == 1
    view.set_rounds([shown, only_end, shown])
    assert view.model_.rowCount() == 2


def test_the_context_dialog_names_the_model_as_the_user_knows_it(monkeypatch, qtbot):
    """Not "with demo" (the internal name of the demo) but the model's name."""
    from types import SimpleNamespace

    from PySide6.QtWidgets import QInputDialog

    from ui.pairing import slot_menu

    asked = []
    monkeypatch.setattr(QInputDialog, "getInt", staticmethod(lambda *args: (asked.append(args[2]), (0, False))[1]))
    pairing = SimpleNamespace(loaded=SimpleNamespace(own_context=8192, context_length=8192),
                              current=SimpleNamespace(named=lambda: ("demo", None)))
    slot_menu._choose_context(pairing, None)
    assert "with SmolLM2 135M Instruct (demo)." in asked[0] and "with demo" not in asked[0]


def test_think_before_answering_shows_what_the_model_does(qtbot):
    """Ticked and greyed out for a model that does not think read as a promise it cannot keep: the
    box shows what the model does, and the chat's own choice comes back with a model that has the switch."""
    from app.chat.settings import ChatSettings
    from ui.chat.settings_drawer import SettingsDrawer

    drawer = SettingsDrawer()
    qtbot.addWidget(drawer)
    drawer.set_values(ChatSettings(thinking=True), "")
    drawer.set_thinking_switch("")  # a model that never thinks
    assert not drawer.thinking.isChecked() and not drawer.thinking.isEnabled()
    assert drawer.values().thinking is True  # the chat's choice is kept, not overwritten by the display
    drawer.set_thinking_switch("always")
    assert drawer.thinking.isChecked() and not drawer.thinking.isEnabled()
    drawer.set_thinking_switch("switch")
    assert drawer.thinking.isChecked() and drawer.thinking.isEnabled()
    drawer.thinking.click()  # the user turns it off
    assert drawer.values().thinking is False
    drawer.set_thinking_switch("")
    drawer.set_thinking_switch("switch")
    assert not drawer.thinking.isChecked()  # their choice, not the default
