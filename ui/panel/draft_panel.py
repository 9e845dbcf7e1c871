"""The side panel's content: live figures, the rounds as chips, the graphs, and the controls for
the inline tint, race mode and exports. Everything it shows comes from the engine's rounds
(app.chat.trace) and the measured target-alone baseline; nothing is assumed."""

from __future__ import annotations

import math
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QFrame, QGridLayout, QHBoxLayout, QLabel, QMenu,
                               QPushButton, QSplitter, QToolButton, QVBoxLayout, QWidget)

from app.chat.baseline import Baseline
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Figures, RoundTrace, TurnTrace
from ui.panel.colors import LABELS, chip_colors
from ui.panel.graphs import LiveGraphs
from ui.panel.rounds_view import RoundsView

# While an answer streams, new rounds, figures and graphs reach the screen twice a second: on 2
# cores every millisecond the GUI thread spends is taken from the engine (at 30 updates a second
# the panel cost 12% of tokens/s; see benchmarks/gui_vs_headless.py --panel).
REFRESH_MS = 500
GRAPH_EVERY = 2  # refreshes per graph redraw: the graphs' painting is the panel's largest cost


class FigureTile(QFrame):
    def __init__(self, caption: str, tip: str):
        super().__init__()
        self.setObjectName("figureTile")
        self.value = QLabel("–")
        self.value.setObjectName("figureValue")
        font = self.value.font()
        font.setPointSizeF(font.pointSizeF() * 1.35)
        font.setBold(True)
        self.value.setFont(font)
        self.caption = QLabel(caption)
        self.caption.setObjectName("figureCaption")
        self.setToolTip(tip)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.setSpacing(0)
        layout.addWidget(self.value)
        layout.addWidget(self.caption)


class DraftPanel(QWidget):
    tint_toggled = Signal(bool)
    race_requested = Signal()

    def __init__(self, parent: QWidget | None = None, dark: bool = False):
        super().__init__(parent)
        self.trace = TurnTrace()
        self.baseline: Baseline | None = None  # the target alone's timings
        self._graph_timer = QTimer(self)
        self._graph_timer.setSingleShot(True)
        self._graph_timer.setInterval(REFRESH_MS)
        self._unshown: list[RoundTrace] = []  # rounds added since the last refresh
        self._refreshes = 0
        self._graph_timer.timeout.connect(self._refresh)

        self.tiles = {
            "tokens_per_s": FigureTile("tokens/s", "Decode speed of this answer (after its first token)"),
            "speedup": FigureTile("speedup", "Our seconds per token against the target alone's, measured "
                                             "on this machine when the pair loaded"),
            "acceptance": FigureTile("accepted", "Share of drafted tokens the target accepted"),
            "tokens_per_pass": FigureTile("tokens/pass", "Tokens committed per forward pass of the target"),
            "k": FigureTile("draft k", "Draft length of the latest round (adaptive unless the chat's settings "
                                       "fix it)"),
        }
        tiles = QGridLayout()
        tiles.setSpacing(6)
        for i, tile in enumerate(self.tiles.values()):
            tiles.addWidget(tile, i // 3, i % 3)
        self.baseline_label = QLabel("Target alone: not measured yet")
        self.baseline_label.setObjectName("mutedLabel")
        self.baseline_label.setWordWrap(True)

        self.tint_box = QCheckBox("Tint answers by origin")
        self.tint_box.setToolTip("Tint the chat's answers: green where the draft's tokens were accepted, "
                                 "blue where the target wrote its own")
        self.tint_box.toggled.connect(self.tint_toggled)
        self.race_button = QPushButton("Race…")
        self.race_button.setToolTip("Answer the last question twice, with the target alone and with "
                                    "speculation, and compare")
        self.race_button.clicked.connect(self.race_requested)
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.export_button)
        menu.addAction("Rounds as CSV…", lambda: self._export("CSV files (*.csv)", ".csv", self.export_csv))
        menu.addAction("Rounds and figures as JSON…", lambda: self._export("JSON files (*.json)", ".json",
                                                                           self.export_json))
        menu.addAction("Graphs as PNG…", lambda: self._export("PNG images (*.png)", ".png", self.export_png))
        self.export_button.setMenu(menu)
        controls = QHBoxLayout()
        controls.addWidget(self.tint_box, 1)
        controls.addWidget(self.race_button)
        controls.addWidget(self.export_button)

        self.legend = QLabel()
        self.legend.setObjectName("mutedLabel")
        self.rounds_view = RoundsView(dark=dark)
        self.graphs = LiveGraphs()
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        split.addWidget(self.rounds_view)
        split.addWidget(self.graphs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 4)

        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 58)  # the tiles, controls and graphs
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addLayout(tiles)
        layout.addWidget(self.baseline_label)
        layout.addLayout(controls)
        layout.addWidget(self.legend)
        layout.addWidget(split, 1)
        self.set_dark(dark)
        self.set_available(False)

    # --- what is shown -------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        self.rounds_view.delegate.set_dark(dark)
        self.rounds_view.viewport().update()
        self.graphs.set_dark(dark)
        colors = chip_colors(dark)
        self.legend.setText("  ".join(
            f'<span style="background-color:{colors[kind].background}; color:{colors[kind].text};">'
            f'&nbsp;{LABELS[kind]}&nbsp;</span>' for kind in (ACCEPTED, REJECTED, TARGET)))

    def set_available(self, loaded: bool) -> None:
        """Race mode needs a loaded pair and an idle engine."""
        self.race_button.setEnabled(loaded)

    def set_baseline(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.baseline_label.setText(baseline.describe())

    def begin(self, trace: TurnTrace) -> None:
        """A new answer begins; its owner (the chat controller) adds rounds to `trace`."""
        self._graph_timer.stop()
        self._unshown = []
        self.trace = trace
        self.rounds_view.set_rounds(trace.rounds)
        self.graphs.clear()
        self._show_figures(self.trace.figures())

    def rounds_added(self, rounds: list[RoundTrace]) -> None:
        """`rounds` were just added to the trace shown."""
        self._unshown.extend(rounds)
        if not self._graph_timer.isActive():
            self._graph_timer.start()

    def _refresh(self, graphs: bool = False) -> None:
        """New rows, figures and graphs of the live answer (figures and graphs walk every round)."""
        rounds, self._unshown = self._unshown, []
        self.rounds_view.append(rounds)
        self._show_figures(self.trace.figures())
        self._refreshes += 1
        if graphs or self._refreshes % GRAPH_EVERY == 0:
            self.graphs.show_trace(self.trace)

    def finish_answer(self) -> None:
        self._graph_timer.stop()
        self._refresh(graphs=True)

    def show_trace(self, trace: TurnTrace | None) -> None:
        """An answer from the history (or none): its rounds, figures and graphs as they ended."""
        self._graph_timer.stop()
        self._unshown = []
        self.trace = trace or TurnTrace(baseline_s_per_token=self.baseline.median if self.baseline else None)
        self.rounds_view.set_rounds(self.trace.rounds)
        self.graphs.show_trace(self.trace) if trace else self.graphs.clear()
        self._show_figures(self.trace.figures())

    def _show_figures(self, f: Figures) -> None:
        t = self.tiles
        t["tokens_per_s"].value.setText(f"{f.tokens_per_s:.1f}" if f.tokens_per_s else "–")
        t["speedup"].value.setText(f"{f.speedup:.2f}×" if f.speedup and math.isfinite(f.speedup) else "–")
        good = f.speedup is not None and f.speedup >= 1.0
        t["speedup"].value.setStyleSheet(f"color: {QColor('#2e9d5b' if good else '#c0392b').name()};"
                                         if f.speedup else "")
        t["acceptance"].value.setText(f"{f.acceptance:.0%}" if f.drafted else "–")
        t["tokens_per_pass"].value.setText(f"{f.tokens_per_pass:.2f}" if f.rounds else "–")
        t["k"].value.setText(str(f.k) if f.drafted else "–")

    # --- exports -------------------------------------------------------------------------

    def export_csv(self, path: str | Path) -> None:
        Path(path).write_text(self.trace.to_csv(), encoding="utf-8")

    def export_json(self, path: str | Path) -> None:
        Path(path).write_text(self.trace.to_json(), encoding="utf-8")

    def export_png(self, path: str | Path) -> None:
        self.graphs.show_trace(self.trace)
        self.graphs.export_png(str(path))

    def _export(self, filter_: str, suffix: str, write) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export", f"tandem-answer{suffix}", filter_)
        if path:
            try:
                write(path if path.endswith(suffix) else path + suffix)
            except OSError as exc:
                self.baseline_label.setText(f"The export failed: {exc.strerror or exc}. Choose another folder.")
