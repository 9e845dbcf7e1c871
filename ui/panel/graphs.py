"""Four small live graphs of one answer, drawn from its TurnTrace in a 2 x 2 grid (one column of
four when the panel is too narrow for two):

- Speedup: speedup so far against tokens written, with the target alone at 1.0 (dashed), and a
  band for its range over the target alone's timings; green or red only once the latest range
  clears 1 (app/chat/baseline.py), in the axes' colour until then;
- Tokens/s: speculative tokens/s so far against the target-alone rate (dashed);
- Acceptance (rolling): the share of drafts accepted, averaged over the last drafting rounds;
- Accepted per round: a histogram of how many drafts each drafting round accepted, 0 to k.

One pyqtgraph scene whose plots and items are made once: `show_trace` only sets data and ranges,
so it is cheap enough to call several times a second while an answer streams.

Exported as a PNG, the graphs come under a few lines that say what they are (`png_heading`): a
title naming the answer, the pair that wrote it, and its figures as the panel's tiles show them.
The same lines go into the PNG's text chunks, whole (drawn, a long question is elided).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import QVBoxLayout, QWidget

import pyqtgraph as pg
from app.chat.baseline import ABOUT, FASTER, SLOWER, speedup_verdict
from app.chat.trace import ACCEPTED, TurnTrace

ROLLING_ROUNDS = 8  # one round's acceptance is 0..k out of k, too jumpy alone; 8 still follows a change
TITLE_HEIGHT = 18  # pyqtgraph reserves 30 px for a title; a side panel cannot spare it
TICK_FONT_PT = 7.5
TOKENS_AXIS = "tokens written"
PLOT_MIN_W, PLOT_MIN_H = 185, 150
MARGIN, SPACING = 2, 4  # around and between the plots
HEADING_FONT_PT, HEADING_PADDING = 8.5, 6  # the lines above the graphs in their PNG


@dataclass(frozen=True)
class GraphColors:
    background: str
    foreground: str
    accepted: str  # speculative curves and accepted-draft bars
    rejected: str  # the bar of rounds that accepted nothing
    baseline: str  # the target alone, dashed


LIGHT = GraphColors("#ffffff", "#3b4048", "#2e9d5b", "#d64545", "#8a8f98")
DARK = GraphColors("#1e1f22", "#c9ced6", "#4cc47f", "#ff7b72", "#8a8f98")


class LiveGraphs(QWidget):
    columns_changed = Signal(int)  # its minimum height changed with them

    def __init__(self, parent=None):
        super().__init__(parent)
        self._view = pg.GraphicsLayoutWidget()
        self._view.ci.setContentsMargins(MARGIN, MARGIN, MARGIN, MARGIN)
        self._view.ci.setSpacing(SPACING)
        self.columns = 2
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._view)
        self._titles: dict[pg.PlotItem, str] = {}
        self._counts: list[int] = []
        self.verdict = ABOUT  # of the latest point: the speedup curve's colour

        self.speedup_plot = self._plot(0, 0, "Speedup", TOKENS_AXIS)
        self.tps_plot = self._plot(0, 1, "Tokens/s", TOKENS_AXIS)
        self.acceptance_plot = self._plot(1, 0, "Acceptance (rolling)", TOKENS_AXIS)
        self.histogram_plot = self._plot(1, 1, "Accepted per round", "drafts accepted")

        # the target alone is 1.0 by definition
        self.target_line = pg.InfiniteLine(pos=1.0, angle=0, label="target alone",
                                           labelOpts={"position": 0.98, "anchors": [(1, 1), (1, 1)]})
        self.target_line.label.setFont(_small_font())
        self.speedup_plot.addItem(self.target_line)
        self.speedup_curve = self.speedup_plot.plot()
        # the range over the target alone's timings: two invisible edges and the band between them
        self.speedup_low = self.speedup_plot.plot()
        self.speedup_high = self.speedup_plot.plot()
        self.speedup_band = pg.FillBetweenItem(self.speedup_low, self.speedup_high)
        self.speedup_plot.addItem(self.speedup_band)
        # top right, above the curves: the rate settles below the spike of the first rounds
        self.legend = self.tps_plot.addLegend(offset=(-2, 2), labelTextSize="7pt", verSpacing=-8)
        self.legend.layout.setContentsMargins(3, 1, 3, 1)  # pyqtgraph's 9 px made it a third of the plot
        self.tps_curve = self.tps_plot.plot(name="speculative")
        self.baseline_curve = self.tps_plot.plot(name="target alone")
        self.acceptance_curve = self.acceptance_plot.plot()
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8)
        self.histogram_plot.addItem(self.bars)
        self.set_dark(False)
        self._place(2)
        self.clear()

    # --- fitting the width --------------------------------------------------------------------

    def _place(self, columns: int) -> None:
        """The four plots in a grid `columns` wide; the minimum size follows."""
        self.columns = columns
        plots = (self.speedup_plot, self.tps_plot, self.acceptance_plot, self.histogram_plot)
        for plot in plots:
            if plot.scene() is not None and plot in self._view.ci.items:
                self._view.ci.removeItem(plot)
        for i, plot in enumerate(plots):
            self._view.ci.addItem(plot, row=i // columns, col=i % columns)
        rows = len(plots) // columns
        # the width a single column needs, whatever the columns now: the panel may narrow to it
        self._view.setMinimumSize(PLOT_MIN_W + 2 * MARGIN,
                                  rows * PLOT_MIN_H + (rows - 1) * SPACING + 2 * MARGIN)
        # the view sized its scene before the plots moved (it is resized before this widget hears
        # of it): size the scene to the view again
        self._view.setRange(self._view.range, padding=0, disableAutoPixel=False)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        columns = 2 if event.size().width() >= 2 * PLOT_MIN_W + SPACING + 2 * MARGIN else 1
        if columns != self.columns:
            self._place(columns)
            self.columns_changed.emit(columns)

    def _plot(self, row: int, col: int, title: str, x_label: str) -> pg.PlotItem:
        plot = self._view.addPlot(row=row, col=col)  # placed again by _place
        # a dashboard: nothing to pan, zoom or right-click
        plot.setMouseEnabled(x=False, y=False)
        plot.hideButtons()
        plot.setMenuEnabled(False)
        plot.enableAutoRange(enable=False)  # show_trace sets ranges that start at 0
        plot.setMinimumSize(PLOT_MIN_W, PLOT_MIN_H)
        for name in ("left", "bottom"):  # ticks inward: they take no room
            plot.getAxis(name).setStyle(tickFont=_small_font(), tickTextOffset=2, tickLength=-4)
        plot.getAxis("bottom").setLabel(x_label)
        plot.getAxis("bottom").enableAutoSIPrefix(False)  # counts, never "x0.001"
        # pyqtgraph keeps 18 px for tick labels that need 12 here: closer to the axis title
        plot.getAxis("bottom").setStyle(autoExpandTextSpace=False, tickTextHeight=12)
        self._titles[plot] = title
        return plot

    # --- data ---------------------------------------------------------------------------------

    def show_trace(self, trace: TurnTrace) -> None:
        series = trace.series()
        tokens = series["tokens"]
        x_top = max(tokens[-1] if tokens else 0, 10)  # whole tokens on the axis even at the start
        baseline = trace.baseline_s_per_token
        no_baseline = bool(tokens) and not baseline  # an empty trace is not "no baseline"

        self._set_title(self.speedup_plot, "Speedup (no baseline yet)" if no_baseline else "Speedup")
        self.target_line.setVisible(not no_baseline)
        speedup = series["speedup"] if baseline else []
        self.speedup_curve.setData(tokens if baseline else [], speedup)
        self.speedup_low.setData(tokens if baseline else [], series["speedup_low"] if baseline else [])
        high = series["speedup_high"] if baseline else []
        self.speedup_high.setData(tokens if baseline else [], high)
        self.speedup_plot.setRange(xRange=(0, x_top), yRange=(0, _top(high, 1.0)), padding=0)
        timings = len(trace.baseline.samples) if trace.baseline else 0
        verdict = speedup_verdict(series["speedup_low"][-1], high[-1], timings) if high else ABOUT
        if verdict != self.verdict:
            self.verdict = verdict
            self._color_speedup()

        tps = series["tokens_per_s"]
        baseline_tps = 1.0 / baseline if baseline else None
        self.tps_curve.setData(tokens, tps)
        if baseline_tps and tokens:
            self.baseline_curve.setData([0, x_top], [baseline_tps, baseline_tps])
        else:
            self.baseline_curve.setData([], [])
        # headroom for the legend, whose box takes about the top third of a small plot: a flat curve
        # near its maximum ran behind it, washed out
        y_top = _top(tps, baseline_tps or 1.0) * 1.4
        self.tps_plot.setRange(xRange=(0, x_top), yRange=(0, y_top), padding=0)

        xs, rolling = rolling_acceptance(tokens, series["acceptance"])
        self.acceptance_curve.setData(xs, rolling)
        self.acceptance_plot.setRange(xRange=(0, x_top), yRange=(0, 1.0), padding=0.02)

        self._counts = accepted_histogram(trace)
        self._draw_bars()

    def clear(self) -> None:
        self.show_trace(TurnTrace())

    def _draw_bars(self) -> None:
        c = self._colors
        # the 0 bin is the rounds that accepted nothing: red, as a rejected chip
        brushes = [c.rejected if i == 0 else c.accepted for i in range(len(self._counts))]
        self.bars.setOpts(x=list(range(len(self._counts))), height=self._counts, brushes=brushes, pen=None)
        bins = max(len(self._counts), 2)
        # one tick per bin (every other past 10): pyqtgraph's own would say 0.5 when k is 1
        self.histogram_plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(0, bins, 1 + (bins > 10))]])
        self.histogram_plot.setRange(xRange=(-0.6, bins - 0.4), yRange=(0, max(self._counts, default=1) * 1.1),
                                     padding=0)

    # --- look ---------------------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        c = self._colors = DARK if dark else LIGHT
        self._view.setBackground(c.background)
        for plot in self._titles:
            for name in ("left", "bottom"):
                axis = plot.getAxis(name)
                axis.setPen(c.foreground)
                axis.setTextPen(c.foreground)
            bottom = plot.getAxis("bottom")
            bottom.setLabel(bottom.labelText, **{"color": c.foreground, "font-size": f"{TICK_FONT_PT}pt"})
            self._set_title(plot, self._titles[plot], force=True)
        line = pg.mkPen(c.accepted, width=2)
        dashed = pg.mkPen(c.baseline, width=1.5, style=Qt.PenStyle.DashLine)
        self._color_speedup()
        self.tps_curve.setPen(line)
        self.acceptance_curve.setPen(line)
        self.target_line.setPen(dashed)
        self.target_line.label.setColor(c.foreground)
        self.baseline_curve.setPen(dashed)
        legend_background = QColor(c.background)
        legend_background.setAlpha(200)  # the curves stay visible through it
        self.legend.setBrush(legend_background)
        self.legend.setLabelTextColor(c.foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text)  # setLabelTextColor only applies to the next text
        self._draw_bars()

    def _color_speedup(self) -> None:
        """The speedup's curve and band: green where the latest range is above 1, red where it is
        below, the axes' colour while it still spans 1 (about as fast: no claim either way)."""
        c = self._colors
        color = {FASTER: c.accepted, SLOWER: c.rejected}.get(self.verdict, c.foreground)
        self.speedup_curve.setPen(pg.mkPen(color, width=2))
        band = QColor(color)
        band.setAlpha(55)
        self.speedup_band.setBrush(band)
        for edge in (self.speedup_low, self.speedup_high):
            edge.setPen(pg.mkPen(band, width=1))

    def _set_title(self, plot: pg.PlotItem, title: str, force: bool = False) -> None:
        if title == self._titles[plot] and not force:
            return
        self._titles[plot] = title
        plot.setTitle(title, color=self._colors.foreground, size="8.5pt", bold=True)
        plot.titleLabel.setMaximumHeight(TITLE_HEIGHT)
        plot.layout.setRowFixedHeight(0, TITLE_HEIGHT)

    def export_png(self, path, heading: dict[str, str] | None = None) -> None:
        """All four plots as one PNG, as they are on screen (offscreen too: grab() lays out a hidden
        widget), under `heading`'s lines ({PNG text keyword: line}; the first drawn bold, as a title),
        wrapped to the graphs' width."""
        graphs = self.grab()
        ratio = graphs.devicePixelRatio()
        heading = heading or {}
        title_font, font = QFont(self.font()), QFont(self.font())
        title_font.setPointSizeF(HEADING_FONT_PT + 1)
        title_font.setBold(True)
        font.setPointSizeF(HEADING_FONT_PT)
        width = round(graphs.width() / ratio)
        room = width - 2 * HEADING_PADDING
        lines = []  # (text as drawn, font, height): wrapped at words; a title of more than two lines elided
        for i, line in enumerate(heading.values()):
            f = title_font if i == 0 else font
            metrics = QFontMetrics(f)
            if i == 0:
                line = metrics.elidedText(line, Qt.TextElideMode.ElideRight, 2 * room - 4 * metrics.averageCharWidth())
            height = metrics.boundingRect(QRect(0, 0, room, 10_000), Qt.TextFlag.TextWordWrap, line).height()
            lines.append((line, f, height))
        top = sum(height for _, _, height in lines) + 2 * HEADING_PADDING if lines else 0
        image = QImage(graphs.width(), graphs.height() + round(top * ratio), QImage.Format.Format_ARGB32)
        image.setDevicePixelRatio(ratio)
        image.fill(QColor(self._colors.background))
        painter = QPainter(image)
        try:
            painter.setPen(QColor(self._colors.foreground))
            y = HEADING_PADDING
            for line, f, height in lines:
                painter.setFont(f)
                painter.drawText(QRect(HEADING_PADDING, y, room, height), Qt.TextFlag.TextWordWrap, line)
                y += height
            painter.drawPixmap(0, top, graphs)
        finally:
            painter.end()
        for key, line in heading.items():
            image.setText(key, line)  # whole, where the drawing elides
        if not image.save(str(path), "PNG"):
            raise OSError(f"Could not write the graphs to {path}: check that its folder exists and is writable.")


def png_heading(trace: TurnTrace, tiles: dict[str, str]) -> dict[str, str]:
    """The lines above the graphs in their PNG: a title naming the answer, the pair that wrote it,
    and its figures as the panel draws them (`tiles`: the tiles' values, by the panel's names, with
    "speedup_range" and "speedup_verdict" the speedup tile's range and verdict, "" where it shows none)."""
    whose = trace.whose
    question = " ".join(whose.question.split())
    title = f"Tandem: the answer to “{question}”" if question else "Tandem: one answer, decoded speculatively"
    pair = (f"Target: {whose.target} · Draft: {whose.draft}" if whose.target
            else "Target and draft: not recorded with this answer")
    said = ", ".join(part for part in (tiles.get("speedup_range"), tiles.get("speedup_verdict")) if part)
    speedup = tiles["speedup"] + (f" ({said})" if said else "")
    figures = (f"{tiles['tokens_per_s']} tok/s · speedup {speedup} · {tiles['acceptance']} of drafts accepted"
               f" · {tiles['tokens_per_pass']} tokens/pass")
    return {"Title": title, "Pair": pair, "Figures": figures}


def rolling_acceptance(tokens: list[float], acceptance: list[float]) -> tuple[list[float], list[float]]:
    """(tokens written, mean acceptance of the last ROLLING_ROUNDS drafting rounds) per drafting
    round; plain rounds (NaN acceptance) neither count nor reset the window."""
    window: deque[float] = deque(maxlen=ROLLING_ROUNDS)
    xs, means = [], []
    for x, a in zip(tokens, acceptance, strict=True):
        if not math.isnan(a):
            window.append(a)
            xs.append(x)
            means.append(sum(window) / len(window))
    return xs, means


def accepted_histogram(trace: TurnTrace) -> list[int]:
    """counts[n] = drafting rounds that accepted n drafts, n from 0 to the largest k seen."""
    drafting = [r for r in trace.rounds if r.drafted]
    if not drafting:
        return []
    counts = [0] * (max(max(r.k, r.count(ACCEPTED)) for r in drafting) + 1)
    for r in drafting:
        counts[r.count(ACCEPTED)] += 1
    return counts


def _small_font() -> QFont:
    font = QFont()
    font.setPointSizeF(TICK_FONT_PT)
    return font


def _top(values: list[float], floor: float) -> float:
    """The top of a y range that starts at 0: a little above the highest value, at least `floor`."""
    return max([v for v in values if not math.isnan(v)] + [floor]) * 1.15
