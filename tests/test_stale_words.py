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
