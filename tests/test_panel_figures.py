"""The side panel's figures on hand-made traces, no model: the speedup carries its spread and
says how it was measured, an answer keeps the baseline it was measured against, the rounds list
never shows another answer's chips, and before the first answer the panel says what it will show."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("pytestqt")

from app.chat.baseline import METHOD, Baseline, Speedup, Timings  # noqa: E402
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Chip, RoundTrace, TurnTrace, figures_from_csv  # noqa: E402

# the target alone timed three times: 10, 8 and 12.5 tokens/s
BASELINE = Baseline((0.1, 0.125, 0.08), context=120, tokens=32)


def _round(index: int, accepted: int, k: int = 4, at: float | None = None) -> RoundTrace:
    chips = tuple([Chip(1, "a", ACCEPTED)] * accepted + [Chip(2, "r", REJECTED)] * (k - accepted)
                  + [Chip(3, "t", TARGET)])
    return RoundTrace(index, k, "model", chips, "", 1, at=0.05 * index if at is None else at)


def make_trace(baseline: Baseline | None = BASELINE) -> TurnTrace:
    prefill = RoundTrace(0, 0, "", (Chip(5, "Hi", TARGET),), "Hi", 2, at=0.0)
    return TurnTrace([prefill] + [_round(i, a) for i, a in enumerate([4, 2, 0, 3], start=1)], baseline)


def test_figures_carry_the_speedup_with_its_spread():
    f = make_trace().figures()
    assert isinstance(f.speedup, Speedup)
    # ours: 13 tokens after the first in 0.2 s = 65 tokens/s
    assert f.tokens_per_s == pytest.approx(65.0)
    assert f.speedup.median == pytest.approx(0.1 * 65)
    assert (f.speedup.low, f.speedup.high) == (pytest.approx(0.08 * 65), pytest.approx(0.125 * 65))
    assert make_trace(None).figures().speedup is None


def test_an_answer_keeps_the_baseline_it_was_measured_against():
    trace = make_trace()
    again = TurnTrace.from_dict(trace.to_dict())
    assert again.baseline == BASELINE
    assert again.figures() == trace.figures()
    # a version-1 trace stored one number: still read, as one timing
    old = trace.to_dict() | {"version": 1, "baseline_s_per_token": 0.1}
    old.pop("baseline", None)
    v1 = TurnTrace.from_dict(old)
    assert v1 is not None and v1.baseline.samples == (0.1,)
    assert v1.figures().speedup.median == pytest.approx(6.5)
    # the CSV export read back with the same baseline gives the same speedup
    assert figures_from_csv(trace.to_csv(), BASELINE).speedup == trace.figures().speedup


def test_speedup_series_has_its_band():
    series = make_trace().series()
    for mid, low, high in zip(series["speedup"], series["speedup_low"], series["speedup_high"], strict=True):
        assert low < mid < high


def test_speedup_tile_shows_the_median_its_range_and_how_it_was_measured(qtbot):
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    panel.set_baseline(Timings.of(BASELINE))
    panel.show_trace(make_trace())
    tile = panel.tiles["speedup"]
    assert tile.value.text() == "6.50×"
    assert tile.detail.isVisibleTo(panel) and tile.detail.text() == "5.20-8.12"
    assert tile.toolTip() == METHOD and "backwards" not in tile.toolTip()
    assert panel.baseline_label.text() == BASELINE.describe()


def test_a_stored_answer_shows_its_own_baseline(qtbot):
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    now = Baseline((0.5,), context=900, tokens=32)  # the machine is slower now
    panel.set_baseline(Timings.of(now))
    panel.show_trace(TurnTrace.from_dict(make_trace().to_dict()))
    assert panel.tiles["speedup"].value.text() == "6.50×"  # against the answer's baseline, not today's
    assert "120 tokens of context" in panel.baseline_label.text()


def test_rounds_list_never_reuses_another_answers_layout(qtbot):
    """Python reuses an object's id once it is freed (after Regenerate, row 1 showed one chip where
    the answer had 14 accepted drafts): a layout cached by id must not outlive its round."""
    from ui.panel.rounds_view import TRACE_ROLE, RoundsView

    view = RoundsView()
    qtbot.addWidget(view)
    view.resize(300, 400)
    view.show()
    qtbot.waitExposed(view)
    width = view.viewport().width()
    one, fourteen = (Chip(3, "t", TARGET),), tuple(Chip(1, f"draft{i}", ACCEPTED) for i in range(14))

    # answer A: 300 rounds of one chip, each laid out (cached), then dropped as Regenerate does
    a = [RoundTrace(i, 4, "model", one, "", 1, at=0.1) for i in range(300)]
    view.set_rounds(a)
    short = view.delegate.layout(a[0], width)[1]
    for r in a:
        view.delegate.layout(r, width)
    freed = {id(r) for r in a}
    view.set_rounds([])
    del a, r
    gc.collect()
    # answer B: rounds of 14 accepted drafts, many of them made in A's freed memory, with A's ids
    # (148 of 300 here when the cache was keyed by id alone; how many depends on the allocator)
    b = [RoundTrace(i, 14, "model", fourteen, "", 0, at=0.1) for i in range(300)]
    assert freed  # A's ids, which B's rounds may reuse
    view.set_rounds(b)
    for row in range(len(b)):
        shown = view.model_.index(row).data(TRACE_ROLE)
        rects, height = view.delegate.layout(shown, width)
        assert [chip.text for _, chip in rects] == [c.text for c in fourteen], row
        assert height > short  # 14 chips wrap onto more lines than one
        assert view.sizeHintForRow(row) == height


def test_before_the_first_answer_the_panel_says_what_it_will_show(qtbot):
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    panel.resize(420, 700)
    panel.show()
    panel.show_trace(None)
    assert panel.empty_state.isVisible()
    text = panel.empty_state.text()
    assert "Each answer's rounds appear here" in text and "green" in text and "red" in text and "blue" in text
    assert not any(tile.isVisible() for tile in panel.tiles.values())  # no blank tiles
    assert not panel.graphs.isVisible()
    panel.show_trace(make_trace())
    assert not panel.empty_state.isVisible() and panel.tiles["speedup"].isVisible() and panel.graphs.isVisible()
    panel.begin(TurnTrace(baseline=BASELINE))  # a live answer starts: its figures fill in as it writes
    assert not panel.empty_state.isVisible() and panel.tiles["speedup"].isVisible()


def _drive_save_dialog(qtbot, choose: str | None) -> list[str]:
    """When the export's save dialog opens: note the folder it opened in, then choose `choose`
    (a path) and accept, or cancel. Returns the folders seen."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QFileDialog

    seen: list[str] = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            QTimer.singleShot(20, answer)
            return
        seen.append(dialog.directory().absolutePath())
        if choose is None:
            dialog.reject()
        else:
            dialog.selectFile(choose)
            dialog.accept()

    QTimer.singleShot(0, answer)
    return seen


def test_export_opens_in_documents_then_in_the_last_folder_used(qtbot, tmp_path, monkeypatch):
    from PySide6.QtCore import QSettings

    from ui.panel.draft_panel import DraftPanel

    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # the user's Documents, here a temporary one
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.chdir(tmp_path)  # the working directory is not where exports go
    settings = QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat)
    panel = DraftPanel(settings=settings)
    qtbot.addWidget(panel)
    panel.show_trace(make_trace())
    csv_action = panel.export_button.menu().actions()[0]

    out = tmp_path / "exports"
    out.mkdir()
    seen = _drive_save_dialog(qtbot, str(out / "rounds.csv"))
    csv_action.trigger()
    assert seen == [str(home / "Documents")]
    assert (out / "rounds.csv").read_bytes().decode("utf-8") == panel.trace.to_csv()

    seen = _drive_save_dialog(qtbot, None)  # the next export starts where the last one went
    csv_action.trigger()
    assert seen == [str(out)]
    again = DraftPanel(settings=settings)  # and so does the next session's
    qtbot.addWidget(again)
    again.show_trace(make_trace())
    seen = _drive_save_dialog(qtbot, None)
    again.export_button.menu().actions()[0].trigger()
    assert seen == [str(out)]


def test_an_answer_written_before_any_timing_says_it_has_no_baseline(qtbot):
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    panel.set_baseline(Timings.of(BASELINE))  # timed after that answer began
    panel.show_trace(make_trace(None))
    assert panel.tiles["speedup"].value.text() == "–"
    assert "before the target alone was timed" in panel.baseline_label.text()
    assert BASELINE.describe() in panel.baseline_label.text()  # and what it is now
