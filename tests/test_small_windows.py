"""Small windows (issue 35, defect 7): the chip rows of the side panel never draw over each other
when the panel's width or font changes, opening Chat settings at 900 x 600 leaves the window as it
is, and the header names the pair and the trial's range at 1,400 px, cutting text only at 900 px,
with everything in its tooltips. No model is loaded: the slots and the panel show hand-made values.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPoint, QRect, QSize  # noqa: E402
from PySide6.QtWidgets import QWidget  # noqa: E402

from app.chat.baseline import Timings  # noqa: E402
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Chip, RoundTrace  # noqa: E402
from app.draft_choice import PROMPT_LOOKUP  # noqa: E402
from app.models.names import DEMO_LABEL  # noqa: E402
from app.models.pair_memory import TrialResult  # noqa: E402
from app.runner import LoadedModel  # noqa: E402
from tests.test_panel_figures import make_trace  # noqa: E402

SHOTS = Path("/tmp/shots")
WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", " and", " runs", " away"]
# the demo pair as the issue saw it: the trial's figure about as fast, its range spanning 1
TRIAL = TrialResult(acceptance=0.08, speedup=0.95, tokens_per_pass=1.1, tokens=120, measured_at=0.0,
                    low=0.71, high=1.20)


def long_rounds(count: int = 40) -> list[RoundTrace]:
    """Rounds of 8 to 12 drafts: each wraps onto several lines in a side panel's width."""
    rounds = []
    for i in range(1, count + 1):
        k = 8 + i % 5
        accepted = i % (k + 1)
        chips = tuple([Chip(1, WORDS[(i + j) % len(WORDS)], ACCEPTED) for j in range(accepted)]
                      + [Chip(2, WORDS[(3 * i + j) % len(WORDS)], REJECTED) for j in range(k - accepted)]
                      + [Chip(3, " answer", TARGET)])
        rounds.append(RoundTrace(i, k, "lookup", chips, "", accepted + 1, at=0.05 * i))
    return rounds


# --- the rounds' rows ------------------------------------------------------------------------


def _rows_apart(view) -> None:
    """Each row starts below the one before and is as tall as its chips, wrapped at the view's
    width in the view's font, measured anew (a delegate with nothing cached)."""
    from ui.panel.rounds_view import TRACE_ROLE, ChipDelegate

    fresh = ChipDelegate(view)
    width = view.viewport().width()
    rects = [view.visualRect(view.model().index(row, 0)) for row in range(view.model().rowCount())]
    assert rects
    for row, rect in enumerate(rects):
        wanted = fresh.layout(view.model().index(row, 0).data(TRACE_ROLE), width)[1]
        assert rect.height() == wanted, f"row {row} is {rect.height()} px for chips {wanted} px high"
        if row:
            assert rect.top() > rects[row - 1].bottom(), f"row {row} starts inside row {row - 1}"


def _settled(qtbot, view) -> None:
    """Rows laid out again, whatever the view scheduled (waits at most a second)."""
    qtbot.waitUntil(lambda: _apart(view), timeout=1000)


def _apart(view) -> bool:
    try:
        _rows_apart(view)
    except AssertionError:
        return False
    return True


@pytest.fixture
def rounds_view(qtbot):
    from ui.panel.rounds_view import RoundsView

    view = RoundsView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    qtbot.waitExposed(view)
    view.set_rounds(long_rounds())
    return view


def test_chip_rows_never_overlap_when_the_panel_narrows_or_widens(rounds_view, qtbot):
    """The rows wrap at the width, but Qt lays a top-to-bottom list out again only when its height
    changes: rows kept the old width's positions and drew their wrapped chips over the next rows."""
    view = rounds_view
    _settled(qtbot, view)
    for width in (180, 300, 220, 420):
        view.resize(width, view.height())  # the width alone, as when the panel's splitter moves
        _settled(qtbot, view)
    _shot(view, "rounds_after_resizes.png")


def test_chip_rows_are_measured_again_when_the_font_changes(rounds_view, qtbot):
    """A font set after the rows were laid out (the system's, under a real desktop) kept the old
    font's chip widths and row heights: text ran out of its chips and rows into each other."""
    view = rounds_view
    _settled(qtbot, view)
    font = view.font()
    font.setPointSizeF(font.pointSizeF() * 1.5)
    view.setFont(font)
    _settled(qtbot, view)


# --- the window at 900 x 600 and at 1,400 px ---------------------------------------------------


@pytest.fixture
def window(offline_window, qtbot):
    w = offline_window()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: w.header.target_slot.name.text() == "No model loaded", timeout=30_000)  # the load failed
    w.side_panel_action.setChecked(True)
    info = LoadedModel(Path("/models/demo"), "torch", "cpu", "float32", "llama", 8192, 0, 0.0, draft=PROMPT_LOOKUP)
    from ui.header import target_short_detail, target_text

    w.header.show_loaded(info)
    w.header.target_slot.set_model(DEMO_LABEL, target_text(info)[1], target_short_detail(info))
    w.header.show_trial(TRIAL.summary())
    trace = make_trace()
    trace.add(long_rounds())
    w.draft_panel.set_baseline(Timings.of(trace.baseline))
    w.draft_panel.show_trace(trace)
    return w


def _resize(qtbot, w, width: int, height: int) -> None:
    w.resize(width, height)
    qtbot.waitUntil(lambda: w.size() == QSize(width, height), timeout=10_000)
    qtbot.wait(50)  # the panel and the header share their widths out on the resize


def _shot(widget: QWidget, name: str) -> None:
    """For a person to look at (the suite's other window tests save theirs beside it)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    widget.grab().save(str(SHOTS / name))


def _rect_in(widget: QWidget, ancestor: QWidget) -> QRect:
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def test_chat_settings_open_without_growing_the_window(window, qtbot):
    """The drafter's list was as wide as "The pair's draft (…)" and the settings sat in one row
    beside Defaults: opening them made a 900 px window 973 px wide."""
    w = window
    _resize(qtbot, w, 900, 600)
    w.settings_action.setChecked(True)
    qtbot.waitUntil(lambda: w.settings_drawer.isVisible(), timeout=10_000)
    qtbot.wait(50)
    assert w.size() == QSize(900, 600)
    drawer = w.settings_drawer
    fields = (drawer.system_prompt, drawer.temperature, drawer.top_p, drawer.top_k, drawer.max_tokens,
              drawer.draft_tokens, drawer.drafter, drawer.thinking, drawer.reset_button)
    for field in fields:
        rect = _rect_in(field, drawer)
        assert drawer.rect().contains(rect), f"{type(field).__name__} {rect} outside the drawer {drawer.rect()}"
        wanted = min(field.sizeHint().height(), field.maximumHeight())  # the prompt box has a fixed height
        assert field.height() >= wanted, f"{type(field).__name__} squeezed to {field.height()} px"
    # the box may be narrow; its popup and tooltip name the choice whole
    drafter = drawer.drafter
    assert drafter.currentText() in drafter.toolTip()
    assert drafter.view().minimumWidth() >= drafter.view().sizeHintForColumn(0)
    _rows_apart(w.draft_panel.rounds_view)
    _shot(w, "settings_900x600.png")
    _resize(qtbot, w, 1400, 900)
    assert drawer.isVisible() and w.size() == QSize(1400, 900)
    assert drawer._forms[0].y() == drawer._forms[1].y()  # side by side where there is room


def test_the_header_names_the_pair_and_the_trials_range_at_1400_px(window, qtbot):
    """A fixed 2:3 share of the header cut "SmolLM2 135M Ins…" and "accepts 8%, about as fast as
    the ta…" at 1,400 px, hiding the range that says whether the pair is faster."""
    w = window
    _resize(qtbot, w, 1400, 900)
    header = w.header
    target, draft = header.target_slot, header.draft_slot
    assert target.name.shown_text() == DEMO_LABEL
    assert draft.name.shown_text() == draft.name.text()
    trial = draft.detail.shown_text()
    assert not trial.endswith("…") and "about as fast" in trial and "(0.71-1.20x)" in trial, trial
    assert not target.detail.shown_text().endswith("…")
    assert TRIAL.summary() in draft.toolTip()  # the whole line, for whoever points at it
    for button in (header.settings_button, header.side_panel_button):
        assert header.rect().contains(_rect_in(button, header))


def test_at_900_px_the_header_cuts_its_words_last_and_keeps_them_in_tooltips(window, qtbot):
    w = window
    _resize(qtbot, w, 900, 600)
    header = w.header
    assert header.settings_button.text() == "Settings"  # the toggles went short first
    for slot, name in ((header.target_slot, DEMO_LABEL), (header.draft_slot, header.draft_slot.name.text())):
        shown = slot.name.shown_text()
        assert shown == name or len(shown.rstrip("…")) >= 11, shown  # still tells the model apart
        assert name in slot.toolTip()
        assert header.rect().contains(_rect_in(slot, header))
    assert header.draft_slot.detail.shown_text().startswith("accepts 8%")
    assert TRIAL.summary() in header.draft_slot.toolTip()
    _shot(w, "header_900x600.png")


def test_the_trials_shorter_words_keep_its_verdict_and_range():
    from ui.header import short_trial

    faster = TrialResult(0.71, 2.1, 3.0, 100, 0.0, 2.05, 2.20)
    slower = TrialResult(0.08, 0.62, 1.0, 100, 0.0, 0.55, 0.70)
    assert short_trial(TRIAL.summary()) == "accepts 8%, about as fast (0.71-1.20x)"
    assert short_trial(faster.summary()) == "accepts 71%, 2.1x faster (2.05-2.20x)"
    assert short_trial(slower.summary()) == "accepts 8%, 0.62x: slower (0.55-0.70x)"
    assert short_trial("trying the pair on a few prompts…") == "trying the pair…"
    assert short_trial("something else") == "something else"


def test_the_header_shares_its_width_without_cutting_one_slot_for_the_other():
    from ui.header import share

    assert share(500, [200, 250]) == [200, 250]  # room for both
    assert share(400, [150, 300]) == [150, 250]  # the smaller whole, the larger what is left
    assert share(300, [200, 250]) == [150, 150]  # neither whole: equal shares
    assert share(-5, [10, 20]) == [0, 0]


def test_the_draft_slots_trial_figure_says_what_it_measured(window):
    """Issue 46: the demo's slot read "0.97x: slower" (the trial's general prompts) beside a card of
    2.14x on a copying task; its tooltip says which prompts the figure is for, and where an
    answer's own speedup is."""
    tip = window.header.draft_slot.toolTip()
    assert TRIAL.summary() in tip
    assert "The pair trial: 3 general prompts" in tip and "side panel" in tip
