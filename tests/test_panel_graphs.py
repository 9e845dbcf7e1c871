"""The side panel's live graphs on a hand-made trace: each plot shows the trace's own figures,
redrawing reuses the same items, clear() empties them, and the PNG export works offscreen."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QPointF  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from app.chat.baseline import Baseline  # noqa: E402
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Chip, RoundTrace, TurnTrace  # noqa: E402
from ui.panel.graphs import ROLLING_ROUNDS, LiveGraphs  # noqa: E402

K = 4
# accepted drafts per round; None is a plain round (the target alone, nothing drafted)
PATTERN = [4, 2, 0, 3, 4, None, 1, 0, 4, 2, 3, 4, 1]


def _round(index: int, accepted: int | None) -> RoundTrace:
    if accepted is None:
        chips = (Chip(9, "x", TARGET),)
    else:  # the drafts the target kept, the rest rejected, then the target's own token
        chips = tuple([Chip(1, "a", ACCEPTED)] * accepted + [Chip(2, "r", REJECTED)] * (K - accepted)
                      + [Chip(3, "t", TARGET)])
    return RoundTrace(index, K if accepted is not None else 0, "model" if accepted is not None else "", chips,
                      "", 1, at=0.06 * index)


def make_trace(baseline: float | None = 0.05, spread: tuple[float, ...] = ()) -> TurnTrace:
    """`baseline`: the target alone's median seconds per token; `spread`: its other timings."""
    prefill = RoundTrace(0, 0, "", (Chip(5, "Hi", TARGET),), "Hi", 2, at=0.0)
    timings = Baseline((baseline, *spread), 0, 32) if baseline else None
    return TurnTrace([prefill] + [_round(i, a) for i, a in enumerate(PATTERN, start=1)], timings)


def _points(item) -> tuple[list[float], list[float]]:
    x, y = item.getData()
    return ([] if x is None else list(x)), ([] if y is None else list(y))


@pytest.fixture
def graphs(qtbot):
    widget = LiveGraphs()
    qtbot.addWidget(widget)
    widget.resize(440, 360)
    return widget


def test_each_plot_shows_the_traces_figures(graphs):
    trace = make_trace()
    series = trace.series()
    graphs.show_trace(trace)

    x, y = _points(graphs.speedup_curve)
    assert x == series["tokens"] and y == pytest.approx(series["speedup"])
    assert graphs.target_line.isVisible() and graphs.target_line.value() == 1.0

    x, y = _points(graphs.tps_curve)
    assert y == pytest.approx(series["tokens_per_s"])
    _, baseline = _points(graphs.baseline_curve)
    assert baseline == pytest.approx([1 / 0.05, 1 / 0.05])  # the target alone: 20 tokens/s

    drafting = [a / K for a in PATTERN if a is not None]
    x, rolling = _points(graphs.acceptance_curve)
    assert len(rolling) == len(drafting)  # the plain round is skipped, not drawn as 0
    assert all(0.0 <= v <= 1.0 for v in rolling)
    assert rolling[0] == drafting[0]
    assert rolling[-1] == pytest.approx(sum(drafting[-ROLLING_ROUNDS:]) / ROLLING_ROUNDS)

    assert list(graphs.bars.opts["x"]) == list(range(K + 1))
    assert list(graphs.bars.opts["height"]) == [PATTERN.count(n) for n in range(K + 1)]


def test_speedup_band_spans_the_baselines_timings(graphs):
    trace = make_trace(0.05, spread=(0.04, 0.0625))  # the target alone at 20, 25 and 16 tokens/s
    series = trace.series()
    graphs.show_trace(trace)
    x, mid = _points(graphs.speedup_curve)
    _, low = _points(graphs.speedup_low)
    _, high = _points(graphs.speedup_high)
    assert low == pytest.approx([m * 0.04 / 0.05 for m in mid]) and high == pytest.approx([m * 1.25 for m in mid])
    assert mid == pytest.approx(series["speedup"])
    assert graphs.speedup_plot.viewRange()[1][1] >= max(high)  # the band fits in the plot
    graphs.show_trace(make_trace(baseline=None))
    assert _points(graphs.speedup_low) == ([], []) and _points(graphs.speedup_high) == ([], [])


def test_narrow_graphs_stack_in_one_column(graphs, qtbot):
    graphs.show()
    qtbot.waitExposed(graphs)
    assert graphs.columns == 2
    graphs.resize(260, 700)
    qtbot.waitUntil(lambda: graphs.columns == 1)
    assert graphs.minimumSizeHint().width() <= 260
    plots = (graphs.speedup_plot, graphs.tps_plot, graphs.acceptance_plot, graphs.histogram_plot)
    for plot in plots:  # each plot lies within the widget, one under the other
        rect = plot.mapRectToScene(plot.boundingRect())
        assert rect.left() >= 0 and rect.right() <= graphs.width() + 1, plot
    tops = [plot.mapRectToScene(plot.boundingRect()).top() for plot in plots]
    assert tops == sorted(tops) and len(set(tops)) == 4
    graphs.resize(440, 360)
    qtbot.waitUntil(lambda: graphs.columns == 2)


def test_redrawing_reuses_the_plots_items(graphs):
    trace = make_trace()
    graphs.show_trace(TurnTrace(trace.rounds[:4], trace.baseline))  # mid-answer
    plots = (graphs.speedup_plot, graphs.tps_plot, graphs.acceptance_plot, graphs.histogram_plot)
    items = [len(p.listDataItems()) for p in plots]
    curve = graphs.speedup_curve
    graphs.show_trace(trace)
    assert graphs.speedup_curve is curve
    assert [len(p.listDataItems()) for p in plots] == items
    assert len(_points(curve)[0]) == len(PATTERN)


def test_clear_empties_every_plot(graphs):
    graphs.show_trace(make_trace())
    graphs.clear()
    for curve in (graphs.speedup_curve, graphs.tps_curve, graphs.baseline_curve, graphs.acceptance_curve):
        assert _points(curve) == ([], [])
    assert len(graphs.bars.opts["height"]) == 0


def test_no_baseline_leaves_the_speedup_plot_empty(graphs):
    graphs.show_trace(make_trace(baseline=None))
    assert _points(graphs.speedup_curve) == ([], [])
    assert not graphs.target_line.isVisible()
    assert "no baseline yet" in graphs.speedup_plot.titleLabel.text
    assert _points(graphs.baseline_curve) == ([], [])
    assert not any(math.isnan(v) for v in _points(graphs.tps_curve)[1])  # the rest still draws
    graphs.show_trace(make_trace())  # the baseline arrives
    assert graphs.speedup_plot.titleLabel.text == "Speedup" and graphs.target_line.isVisible()


@pytest.mark.parametrize("dark", [False, True])
def test_export_png_writes_all_four_plots(graphs, tmp_path, dark):
    graphs.set_dark(dark)
    graphs.show_trace(make_trace())
    path = tmp_path / "graphs.png"
    graphs.export_png(path)
    image = QImage(str(path))
    assert not image.isNull() and image.width() >= 400 and image.height() >= 300
    background = image.pixelColor(2, 2).name()  # a corner is background in either theme
    assert background == ("#1e1f22" if dark else "#ffffff")


def test_export_png_to_a_missing_folder_says_where(graphs, tmp_path):
    with pytest.raises(OSError, match="missing"):
        graphs.export_png(tmp_path / "missing" / "graphs.png")


def test_the_tokens_per_second_curve_stays_clear_of_its_legend(graphs, qtbot):
    """A steady rate sits near the plot's top: it ran behind the legend's box, washed out."""
    prefill = RoundTrace(0, 0, "", (Chip(5, "Hi", TARGET),), "Hi", 2, at=0.0)
    steady = [RoundTrace(i, K, "model", (Chip(1, "a", ACCEPTED), Chip(3, "t", TARGET)), "", 1, at=0.05 * i)
              for i in range(1, 40)]
    graphs.show()
    qtbot.waitExposed(graphs)
    graphs.show_trace(TurnTrace([prefill] + steady, None))
    qtbot.wait(50)
    legend = graphs.legend.mapRectToScene(graphs.legend.boundingRect())
    view = graphs.tps_plot.getViewBox()
    top_of_curve = max(_points(graphs.tps_curve)[1])
    y = view.mapViewToScene(QPointF(0, top_of_curve)).y()
    assert y > legend.bottom()  # scene y grows downwards: the curve is below the legend's box
