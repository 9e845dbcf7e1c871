"""The side panel (draft activity) on a tiny model pair: its counts are the engine's, its chips
are coloured by what the target did, the inline tint survives a restart, exports read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, Slot  # noqa: E402
from PySide6.QtGui import QColor, QImage  # noqa: E402

from app.draft_choice import DraftChoice
from app.chat.trace import ACCEPTED, REJECTED, TARGET, TurnTrace, figures_from_csv, trace_round  # noqa: E402
from app.engine.events import Round  # noqa: E402
from tests.test_window import LOAD_TIMEOUT_MS, Session, greedy_answer, make_window, wait_until  # noqa: E402

ANSWER_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def panel_session(qapp, tiny_pair, tmp_path_factory):
    session = Session(None, tmp_path_factory.mktemp("panel"))
    session.window = make_window(session, str(tiny_pair["target"]), draft=DraftChoice.model(tiny_pair["near"]))
    wait_until(session.window.composer.can_send, LOAD_TIMEOUT_MS)
    wait_until(lambda: session.window.draft_panel.baseline is not None, LOAD_TIMEOUT_MS)
    yield session
    session.window.close()


def _answer(window, text: str, max_tokens: int = 40):
    return greedy_answer(window, text, max_tokens)


def test_panel_counts_are_the_engines(panel_session):
    window = panel_session.window
    stats = _answer(window, "Count with me: one two three four five six")
    f = window.draft_panel.trace.figures()
    assert (f.drafted, f.accepted) == (stats.drafted, stats.accepted)
    assert f.rejected == stats.drafted - stats.accepted > 0  # the near draft gets some wrong
    assert f.rounds == stats.rounds
    # every committed token is a chip: accepted drafts plus the target's own
    assert f.accepted + f.target_tokens == stats.tokens
    rows = window.draft_panel.rounds_view.model_.rowCount()
    assert len(window.draft_panel.trace.rounds) == stats.rounds + 1  # + the prefill's round
    assert rows == sum(1 for r in window.draft_panel.trace.rounds if r.chips)  # a round of only the end: no row
    # the speedup shown is baseline seconds per token over ours, from the measured baseline
    baseline = window.draft_panel.baseline.median
    assert f.speedup.median == pytest.approx(baseline * f.tokens_per_s)
    samples = window.draft_panel.baseline.samples
    assert (f.speedup.low, f.speedup.high) == (pytest.approx(min(samples) * f.tokens_per_s),
                                               pytest.approx(max(samples) * f.tokens_per_s))
    assert window.draft_panel.tiles["acceptance"].value.text() == f"{stats.acceptance_rate:.0%}"


def test_chip_colours_follow_the_round(qtbot):
    from ui.panel.colors import chip_colors
    from ui.panel.rounds_view import TRACE_ROLE, RoundsView

    event = Round(index=3, drafted=(11, 12, 13, 14), accepted=2, emitted=(11, 12, 99), text="a b c",
                  draft_p=(0.9, 0.8, 0.7, 0.6), target_q=(0.95, 0.7, 0.1, 0.2), k=4, source="model")
    r = trace_round(event, lambda t: f" t{t}", at=0.5)
    assert [c.kind for c in r.chips] == [ACCEPTED, ACCEPTED, REJECTED, REJECTED, TARGET]
    assert [c.token for c in r.chips] == [11, 12, 13, 14, 99]
    assert r.chips[2].p == 0.7 and r.chips[2].q == 0.1 and r.chips[4].p is None

    view = RoundsView()
    qtbot.addWidget(view)
    view.resize(420, 200)
    view.show()
    view.append([r])
    qtbot.waitExposed(view)
    image = view.viewport().grab().toImage()
    index = view.model_.index(0)
    rects, _ = view.delegate.layout(index.data(TRACE_ROLE), view.viewport().width())
    colors = chip_colors(False)
    top_left = view.visualRect(index).topLeft()
    seen = []
    for rect, _chip in rects:
        box = rect.translated(top_left)
        pixel = QColor(image.pixel(box.left() + 2, box.center().y()))  # the chip's padding, not its text
        seen.append(next(kind for kind, c in colors.items() if QColor(c.background).name() == pixel.name()))
    assert seen.count(ACCEPTED) == 2 and seen.count(REJECTED) == 2 and seen.count(TARGET) == 1
    assert seen == [c.kind for c in r.chips]
    # hovering a chip names its token and both probabilities
    from ui.panel.rounds_view import chip_tip

    assert "token id 13" in chip_tip(r.chips[2]) and "draft p = 0.700" in chip_tip(r.chips[2]) \
        and "target q = 0.100" in chip_tip(r.chips[2])


def test_inline_tint_survives_reloading_the_conversation(panel_session, tmp_path):
    window = panel_session.window
    _answer(window, "Count with me: one two three four five six")  # the near draft gets some right
    conv_id = window.controller.current.id
    message = window.store.messages(conv_id)[-1]
    trace = TurnTrace.from_dict(message.trace)
    assert trace is not None and trace.rounds
    assert sum(n for n, _ in trace.spans()) == len(message.content)  # every character has an origin
    assert {kind for _, kind in trace.spans()} == {ACCEPTED, TARGET}

    window.draft_panel.tint_box.setChecked(True)
    answer = window.chat_view.last_message()
    assert answer.tinted and "background-color" in answer.body.toHtml()
    window.draft_panel.tint_box.setChecked(False)
    assert not answer.tinted

    # a second window over the same history: the stored answer tints the same way
    from ui.main_window import MainWindow

    other = MainWindow(model=str(panel_session.root / "no-such-model"), backend="torch",
                       history_path=panel_session.history, settings=panel_session.settings())
    try:
        other._open(conv_id)
        other.draft_panel.tint_box.setChecked(True)
        reloaded = other.chat_view.last_message()
        assert reloaded.tinted and reloaded.text == message.content
        assert other.draft_panel.trace.figures() == trace.figures()  # the panel shows its rounds
    finally:
        other.close()


def test_exports_read_back_to_the_same_figures(panel_session, tmp_path):
    window = panel_session.window
    _answer(window, "List three colours")
    panel = window.draft_panel
    figures = panel.trace.figures()
    panel.export_csv(tmp_path / "rounds.csv")
    panel.export_json(tmp_path / "rounds.json")
    panel.export_png(tmp_path / "graphs.png")
    again = figures_from_csv((tmp_path / "rounds.csv").read_text(encoding="utf-8"), panel.trace.baseline)
    for name in ("drafted", "accepted", "rejected", "target_tokens", "rounds", "k"):
        assert getattr(again, name) == getattr(figures, name), name
    assert again.tokens_per_s == pytest.approx(figures.tokens_per_s, rel=1e-4)
    data = json.loads((tmp_path / "rounds.json").read_text(encoding="utf-8"))
    assert data["figures"]["accepted"] == figures.accepted and data["figures"]["rounds"] == figures.rounds
    assert TurnTrace.from_dict(data["trace"]).figures() == TurnTrace.from_dict(panel.trace.to_dict()).figures()
    image = QImage(str(tmp_path / "graphs.png"))
    assert not image.isNull() and image.width() > 100


def test_a_race_compares_at_temperature_0_with_the_chats_one_click_away(panel_session):
    """A chat at temperature 0.7 races at 0 (the exact comparison: the same text on both sides);
    a button races again at 0.7, and the dialog says the answers are then different samples."""
    from app.chat.settings import ChatSettings

    window = panel_session.window
    _answer(window, "Name a fruit", max_tokens=12)
    window.controller.settings = ChatSettings(temperature=0.7, max_tokens=12, draft_tokens=4)
    request = window.controller.race_request()
    assert request.params.temperature == 0.0 and window.controller.race_request(None).params.temperature == 0.7
    window.start_race()
    assert window.controller.busy  # nothing else may use the engine meanwhile
    wait_until(lambda: not window.controller.busy, ANSWER_TIMEOUT_MS)
    dialog = window.race_dialog
    assert "At temperature 0" in dialog.how.text()
    summary = dialog.summary.text()
    assert "identical" in summary and "differ" not in summary
    left, right = (t.toPlainText() for t in dialog.texts)
    assert left == right and left
    assert dialog.rerun_button is not None and "0.7" in dialog.rerun_button.text()
    dialog.rerun_button.click()
    assert window.race_dialog is not dialog and window.race_dialog.temperature == 0.7
    assert "different samples" in window.race_dialog.how.text() and window.race_dialog.rerun_button is None
    window.race_dialog.close()  # cancels the race at 0.7: its result is not what this test is about
    wait_until(lambda: not window.controller.busy, ANSWER_TIMEOUT_MS)



class TextReceiver(QObject):
    """Receives the worker's race_text on the GUI thread (a plain callable would run on the worker's)."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    @Slot(int, str)
    def text(self, side: int, delta: str) -> None:
        self.function(side, delta)


def _race_settings(window, max_tokens: int) -> None:
    from app.chat.settings import ChatSettings

    window.controller.settings = ChatSettings(temperature=0.0, max_tokens=max_tokens, draft_tokens=4)


def test_race_streams_both_sides_into_their_panes(panel_session):
    """Both panes fill as the race runs: the target alone's first, then speculation's, each
    while it is written (not all at the end)."""
    window = panel_session.window
    _answer(window, "Name a fruit", max_tokens=12)
    _race_settings(window, 24)
    seen: dict[int, list[str]] = {0: [], 1: []}
    mid_race: list[tuple[str, str, bool]] = []

    def on_text(side: int, delta: str) -> None:
        seen[side].append(delta)
        if side == 1 and len(seen[1]) == 1:  # speculation has begun: what the dialog shows now
            dialog = window.race_dialog
            mid_race.append((dialog.texts[0].toPlainText(), dialog.texts[1].toPlainText(), window.controller.busy))
            Path("/tmp/shots").mkdir(parents=True, exist_ok=True)
            dialog.grab().save("/tmp/shots/race_mid.png")

    receiver = TextReceiver(on_text)  # after the window's own connection: the pane has the delta already
    window.worker.race_text.connect(receiver.text)
    try:
        window.start_race()
        wait_until(lambda: not window.controller.busy, ANSWER_TIMEOUT_MS)
    finally:
        window.worker.race_text.disconnect(receiver.text)
    assert seen[0] and seen[1]
    left, right = (t.toPlainText() for t in window.race_dialog.texts)
    assert "".join(seen[0]) == left and "".join(seen[1]) == right
    alone_done, spec_so_far, busy = mid_race[0]
    assert alone_done == left  # the target alone had finished and was on screen
    assert spec_so_far and right.startswith(spec_so_far) and busy  # speculation streaming, race running
    window.race_dialog.close()


def test_closing_the_race_cancels_it(panel_session):
    window = panel_session.window
    _answer(window, "Name a fruit", max_tokens=12)
    _race_settings(window, 4000)  # far longer than the race is let run
    failed, done = [], []
    window.worker.race_failed.connect(failed.append)
    window.worker.race_done.connect(done.append)

    def close_on_first_text() -> bool:
        if window.race_dialog is not None and window.race_dialog.texts[0].toPlainText():
            window.race_dialog.close()  # Close, while the target alone is still writing
            return True
        return False

    try:
        window.start_race()
        wait_until(close_on_first_text, ANSWER_TIMEOUT_MS)
        wait_until(lambda: not window.controller.busy, ANSWER_TIMEOUT_MS)
    finally:
        window.worker.race_failed.disconnect(failed.append)
        window.worker.race_done.disconnect(done.append)
    assert not done and failed and "stopped" in failed[0]
    assert window.draft_panel.race_button.isEnabled()  # the engine is free again
    conv_id = window.controller.current.id
    question = [m for m in window.store.messages(conv_id) if m.role == "user"][-1]
    assert not (question.stats or {}).get("race")  # a cancelled race is not kept


def test_a_finished_race_is_kept_with_the_chat(panel_session):
    window = panel_session.window
    _answer(window, "Name a fruit", max_tokens=12)
    _race_settings(window, 12)
    window.start_race()
    wait_until(lambda: not window.controller.busy, ANSWER_TIMEOUT_MS)
    summary = window.race_dialog.summary.text()
    texts = [t.toPlainText() for t in window.race_dialog.texts]
    window.race_dialog.close()
    conv_id = window.controller.current.id
    question = [m for m in window.store.messages(conv_id) if m.role == "user"][-1]
    race = question.stats["race"]
    assert race["identical"] and race["greedy"] and race["ratio"] > 0
    assert f"{race['ratio']:.2f}×" in summary
    notice = "Race (target with near): speculation ran"
    assert notice in window.chat_view.plain_text()  # under the question now
    asked = [m for m in window.chat_view.messages() if m.role == "user"][-1]
    assert asked.stats_label.text() == ""  # the race is not shown as the question's stats
    # the race window closed, its link under the question opens it again as it ended
    from PySide6.QtWidgets import QLabel

    link = next(label for label in window.chat_view.findChildren(QLabel, "noticeLabel")
                if "Show the race" in label.text())
    link.linkActivated.emit("open")
    assert [t.toPlainText() for t in window.race.kept.texts] == texts and texts[0]
    assert window.race.kept.summary.text() == summary
    window.race.kept.close()

    from ui.main_window import MainWindow

    other = MainWindow(model=str(panel_session.root / "no-such-model"), backend="torch",
                       history_path=panel_session.history, settings=panel_session.settings())
    try:
        other._open(conv_id)
        text = other.chat_view.plain_text()
        assert notice in text and f"{race['ratio']:.2f}×" in text  # and when the chat is reopened
        assert text.index(notice) > text.index("Name a fruit")
    finally:
        other.close()
