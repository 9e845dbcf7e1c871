"""A speedup is called faster (green) or slower (red) only once its measured range clears 1 (the
design's interval rule); until then it reads "about as fast" in the text's own colour, and on a
single timing of the target alone, which has no range, it gives no verdict at all and says why
(issue 46: "0.38x · 1 timing · about as fast"). The side panel's tile and its speedup graph both follow it; the
pair trial's words do too (tests/test_pairing_sources.py pins them)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtGui import QColor  # noqa: E402

from app.chat.baseline import ABOUT, FASTER, SLOWER, Baseline, speedup_verdict  # noqa: E402
from tests.test_panel_figures import make_trace  # noqa: E402

# make_trace writes 65 tokens/s; the target alone timed three times at these seconds per token
CLEARLY_FASTER = Baseline((0.1, 0.125, 0.08), context=120, tokens=32)  # 6.5x [5.2-8.1]
SPANS_ONE = Baseline((1 / 50, 1 / 65, 1 / 80), context=120, tokens=32)  # 1.0x [0.81-1.30]
CLEARLY_SLOWER = Baseline((1 / 100, 1 / 120, 1 / 90), context=120, tokens=32)  # 0.65x [0.54-0.72]
ONE_TIMING = Baseline.first(0.1, context=120, tokens=32)  # 6.5x, but no range at all


def test_the_verdict_needs_the_whole_range_on_one_side_of_one():
    assert speedup_verdict(1.02, 1.4, timings=3) == FASTER
    assert speedup_verdict(0.5, 0.98, timings=3) == SLOWER
    assert speedup_verdict(0.9, 1.1, timings=3) == ABOUT
    assert speedup_verdict(0.7, 1.0, timings=3) == ABOUT  # touching 1 is not clearing it
    assert speedup_verdict(2.4, 2.4, timings=1) == ""  # one timing has no range: no verdict
    assert speedup_verdict(float("nan"), float("nan"), timings=3) == ABOUT
    for baseline, verdict in ((CLEARLY_FASTER, FASTER), (SPANS_ONE, ABOUT), (CLEARLY_SLOWER, SLOWER),
                              (ONE_TIMING, "")):
        assert make_trace(baseline).figures().speedup.verdict() == verdict


@pytest.mark.parametrize("baseline, verdict, colour", [
    (CLEARLY_FASTER, "faster", "#2e9d5b"),
    (SPANS_ONE, "about as fast", None),
    (CLEARLY_SLOWER, "slower", "#c0392b"),
    (ONE_TIMING, "", None),
])
def test_the_panels_speedup_tile_is_coloured_only_where_its_range_clears_one(qtbot, baseline, verdict, colour):
    """A 1.00x over a range of 0.81-1.30 showed red (its median was below 1.0 by a hair) or green,
    claiming what the timings could not tell."""
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    panel.show_trace(make_trace(baseline))
    tile = panel.tiles["speedup"]
    caption = f"speedup, {verdict}" if verdict else "speedup"
    assert tile.caption.text() == caption
    if not verdict:
        assert tile.detail.text() == "1 timing: no range yet"
    if colour is None:
        assert tile.value.styleSheet() == ""  # the theme's own text colour
    else:
        assert QColor(colour).name() in tile.value.styleSheet()
    panel.set_dark(True)  # the dark theme's hue of the same verdict, or still none
    assert (tile.value.styleSheet() == "") == (colour is None)
    assert tile.caption.text() == caption


def test_the_speedup_graph_is_coloured_by_the_same_rule(qtbot):
    from ui.panel.graphs import LIGHT, LiveGraphs

    graphs = LiveGraphs()
    qtbot.addWidget(graphs)
    for baseline, verdict, colour in ((CLEARLY_FASTER, FASTER, LIGHT.accepted), (SPANS_ONE, ABOUT, LIGHT.foreground),
                                      (CLEARLY_SLOWER, SLOWER, LIGHT.rejected), (ONE_TIMING, "", LIGHT.foreground)):
        graphs.show_trace(make_trace(baseline))
        assert graphs.verdict == verdict
        assert graphs.speedup_curve.opts["pen"].color().name() == QColor(colour).name()
        assert graphs.speedup_band.brush().color().name() == QColor(colour).name()
