"""The side panel's content: live figures, the rounds as chips, the graphs, and the controls for
the inline tint, race mode and exports. Everything it shows comes from the engine's rounds
(app.chat.trace) and the measured target-alone baseline; nothing is assumed.

It fits any width the window gives it: the figure tiles and the controls wrap onto more rows,
the graphs stack in one column, and what no longer fits the height scrolls.
"""

from __future__ import annotations

import math
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QSettings, QStandardPaths, Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QFrame, QGridLayout, QLabel, QMenu,
                               QPushButton, QScrollArea, QSizePolicy, QSplitter, QToolButton, QVBoxLayout,
                               QWidget)

from app.chat.baseline import METHOD, Baseline, Speedup, Timings
from app.chat.trace import ACCEPTED, REJECTED, TARGET, Figures, RoundTrace, TurnTrace
from ui.panel.colors import LABELS, THINKING_ROW, chip_colors, verdict_color
from ui.panel.graphs import LiveGraphs, png_heading
from ui.panel.rounds_view import RoundsView

# While an answer streams, new rounds, figures and graphs reach the screen twice a second: on 2
# cores every millisecond the GUI thread spends is taken from the engine (at 30 updates a second
# the panel cost 12% of tokens/s; see benchmarks/gui_vs_headless.py --panel).
REFRESH_MS = 500
GRAPH_EVERY = 2  # refreshes per graph redraw: the graphs' painting is the panel's largest cost
TILE_COLUMNS = 3  # at most; fewer when the panel is narrow
EXPORT_FOLDER_KEY = "panel/export_folder"
ROUNDS_MIN_HEIGHT = 90  # a few rows of chips, whatever the window's height


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
        # the speedup's range over the baseline's timings; hidden on the other tiles
        self.detail = QLabel()
        self.detail.setObjectName("figureCaption")
        self.detail.hide()
        self.caption = QLabel(caption)
        self.caption.setObjectName("figureCaption")
        self.setToolTip(tip)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.setSpacing(0)
        layout.addWidget(self.value)
        layout.addWidget(self.detail)
        layout.addWidget(self.caption)
        layout.addStretch(1)


class _ScrolledContent(QWidget):
    """The panel's content inside its scroll area. A scroll area gives a widget whose layout has
    height-for-width (the wrapped labels) the height it asks for, and a box layout asks for every
    item's preferred height: the panel scrolled at any window height. Asking for the minimum
    height at that width instead, the content fills the panel and scrolls only when it must."""

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt's name)
        layout = self.layout()
        return layout.minimumHeightForWidth(width) if layout is not None else -1


RACE_TIP = "Answer the last question twice, with the target alone and with speculation, and compare"


class DraftPanel(QWidget):
    tint_toggled = Signal(bool)
    race_requested = Signal()

    def __init__(self, parent: QWidget | None = None, dark: bool = False, settings: QSettings | None = None):
        super().__init__(parent)
        self.trace = TurnTrace()
        self.timings = Timings()  # the target alone's timings, by settings and context
        self.baseline: Baseline | None = None  # the latest of them, shown while no answer is
        self.settings = settings  # remembers the export folder; None: for this session only
        self._export_folder = ""
        self._graph_timer = QTimer(self)
        self._graph_timer.setSingleShot(True)
        self._graph_timer.setInterval(REFRESH_MS)
        self._unshown: list[RoundTrace] = []  # rounds added since the last refresh
        self._refreshes = 0
        self._graph_timer.timeout.connect(self._refresh)

        self.tiles = {
            "tokens_per_s": FigureTile("tokens/s", "Decode speed of this answer (after its first token)"),
            "speedup": FigureTile("speedup", METHOD),
            "acceptance": FigureTile("accepted", "Share of drafted tokens the target accepted"),
            "tokens_per_pass": FigureTile("tokens/pass", "Tokens committed per forward pass of the target"),
            "k": FigureTile("draft k", "Draft length of the latest round (adaptive unless the chat's settings "
                                       "fix it)"),
        }
        # "speedup, about as fast" goes onto two lines in a narrow tile rather than widen every tile
        self.tiles["speedup"].caption.setWordWrap(True)
        self.tiles["speedup"].detail.setWordWrap(True)  # "1 timing: no range yet" likewise, in a narrow panel
        self._tile_grid = QGridLayout()
        self._tile_grid.setSpacing(6)
        self._tile_columns = 0
        self.source_label = QLabel("")  # whose answer is shown when it is not the chat's (an API request)
        self.source_label.setObjectName("mutedLabel")
        self.source_label.setWordWrap(True)  # "the answer to “…”" of a long question: never wider than the panel
        self.source_label.hide()
        self.reported_label = QLabel("")  # a remote engine's own count, where it sends no rounds
        self.reported_label.setObjectName("mutedLabel")
        self.reported_label.setWordWrap(True)
        self.reported_label.hide()
        self.baseline_label = QLabel("Target alone: not measured yet")
        self.baseline_label.setObjectName("mutedLabel")
        self.baseline_label.setWordWrap(True)
        self.baseline_label.setToolTip(METHOD)

        self.tint_box = QCheckBox("Tint answers by origin")
        self.tint_box.setToolTip("Tint the chat's answers: green where the draft's tokens were accepted, "
                                 "blue where the target wrote its own")
        self.tint_box.toggled.connect(self.tint_toggled)
        self.race_button = QPushButton("Race…")
        self.race_unavailable = ""  # why there is no Race with the pair loaded ("" where there is)
        self.race_button.setToolTip(RACE_TIP)
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
        self._controls = QGridLayout()
        self._controls.setSpacing(6)
        self._controls_wrapped: bool | None = None

        self.empty_state = QLabel()
        self.empty_state.setObjectName("mutedLabel")
        self.empty_state.setWordWrap(True)
        self.empty_state.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.legend = QLabel()
        self.legend.setObjectName("mutedLabel")
        self.legend.setWordWrap(True)  # at a narrow width its three keys go onto more lines
        self.rounds_view = RoundsView(dark=dark)
        self.rounds_view.setMinimumHeight(ROUNDS_MIN_HEIGHT)
        self.graphs = LiveGraphs()
        self.graphs.columns_changed.connect(self._content_resized)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setChildrenCollapsible(False)
        self.split.addWidget(self.rounds_view)
        self.split.addWidget(self.graphs)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 4)

        # What the panel shows of an answer: hidden (the empty state instead) until there is one.
        self.body = QWidget()
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(6)
        body.addLayout(self._tile_grid)
        body.addWidget(self.legend)
        body.addWidget(self.split, 1)

        content = _ScrolledContent()
        content.setObjectName("draftPanelContent")
        column = QVBoxLayout(content)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        column.addWidget(self.source_label)
        column.addWidget(self.baseline_label)
        column.addWidget(self.reported_label)
        column.addLayout(self._controls)
        column.addWidget(self.empty_state)
        column.addWidget(self.body, 1)
        column.addStretch(0)
        # A narrow or short window scrolls the panel instead of cutting it off at the edge.
        self.scroll = QScrollArea()
        self.scroll.setWidget(content)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.viewport().setAutoFillBackground(False)
        content.setAutoFillBackground(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.scroll)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self._reflow(force=True)
        self.set_dark(dark)
        self.set_available(False)
        self._set_empty(True)

    # --- fitting the width ---------------------------------------------------------------

    def minimumSizeHint(self):  # noqa: N802 (Qt's name)
        """As narrow as the graphs in one column allow (everything else wraps), and a few rows
        high: the rest scrolls."""
        hint = super().minimumSizeHint()
        hint.setWidth(self.graphs.minimumSizeHint().width() + self.scroll.verticalScrollBar().sizeHint().width())
        hint.setHeight(self.fontMetrics().height() * 8)
        return hint

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._reflow()

    def _content_resized(self) -> None:
        """The content's minimum height changed during a layout pass (the graphs went to one
        column or back): the scroll area sizes it again once that pass is over (it is told of
        layout changes of its own, not of the content's, which lives in its viewport)."""
        QCoreApplication.postEvent(self.scroll, QEvent(QEvent.Type.LayoutRequest))

    def _reflow(self, force: bool = False) -> None:
        """Tiles in as many columns as fit (at most TILE_COLUMNS); the controls on one row, or the
        buttons under the check box when they do not fit beside it."""
        width = self.scroll.viewport().width() if self.isVisible() else self.width()
        tile = max(t.minimumSizeHint().width() for t in self.tiles.values())
        spacing = self._tile_grid.spacing()
        columns = max(1, min(TILE_COLUMNS, (width + spacing) // (tile + spacing)))
        if force or columns != self._tile_columns:
            self._tile_columns = columns
            for tile_widget in self.tiles.values():
                self._tile_grid.removeWidget(tile_widget)
            for i, tile_widget in enumerate(self.tiles.values()):
                self._tile_grid.addWidget(tile_widget, i // columns, i % columns)
            for c in range(TILE_COLUMNS):
                self._tile_grid.setColumnStretch(c, 1 if c < columns else 0)
            self._content_resized()
        one_row = sum(w.sizeHint().width() for w in (self.tint_box, self.race_button, self.export_button)) \
            + 2 * self._controls.spacing()
        wrapped = width < one_row
        if force or wrapped != self._controls_wrapped:
            self._controls_wrapped = wrapped
            for w in (self.tint_box, self.race_button, self.export_button):
                self._controls.removeWidget(w)
            if wrapped:
                self._controls.addWidget(self.tint_box, 0, 0, 1, 3)
                self._controls.addWidget(self.race_button, 1, 0)
                self._controls.addWidget(self.export_button, 1, 1)
            else:
                self._controls.addWidget(self.tint_box, 0, 0)
                self._controls.addWidget(self.race_button, 0, 1)
                self._controls.addWidget(self.export_button, 0, 2)
            self._controls.setColumnStretch(0, 0 if wrapped else 1)
            self._controls.setColumnStretch(2, 1 if wrapped else 0)
            self._content_resized()

    # --- what is shown -------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        self.rounds_view.delegate.set_dark(dark)
        self.rounds_view.viewport().update()
        self.graphs.set_dark(dark)
        colors = chip_colors(dark)

        def key(kind: str, text: str) -> str:
            c = colors[kind]
            return f'<span style="background-color:{c.background}; color:{c.text};">&nbsp;{text}&nbsp;</span>'

        self._dark = dark
        self._show_speedup(self.trace.figures().speedup)  # the verdict's hue in this theme
        self._legend_keys = " ".join(key(kind, LABELS[kind].replace(" ", "&nbsp;"))
                                     for kind in (ACCEPTED, REJECTED, TARGET))
        self._show_legend()
        self.empty_state.setText(
            "Each answer's rounds appear here: one row per pass of the target, one chip per token, "
            f"{key(ACCEPTED, 'green')} = draft accepted, {key(REJECTED, 'red')} = draft rejected, "
            f"{key(TARGET, 'blue')} = written by the target itself.<br><br>"
            "Above the rounds come the answer's figures: tokens per second, the speedup against the "
            "target alone (timed on this machine, with its range), the share of drafts accepted and the "
            "tokens per pass; below them, graphs of each while the answer is written. Send a message to "
            "begin.")

    def set_available(self, loaded: bool) -> None:
        """Race mode needs a loaded pair, an idle engine, and a target alone to race: a server that
        fixes its speculation at start has none (`race_unavailable` says so)."""
        self.race_button.setEnabled(loaded and not self.race_unavailable)
        self.race_button.setToolTip(self.race_unavailable or RACE_TIP)

    def set_baseline(self, timings: Timings) -> None:
        """The target alone's timings so far: the latest setting's are shown while no answer is."""
        self.timings = timings
        self.baseline = timings.latest()
        self._show_baseline()

    def _show_baseline(self) -> None:
        """The timings the figures shown are measured against: a stored answer's own, else the latest."""
        if self.trace.rounds and self.trace.baseline is None:  # no timing like this answer's conditions
            why = self.trace.unmeasured or "it began before the target alone was timed"
            now = f" Now: {self.baseline.describe()}." if self.baseline and not self.trace.unmeasured else ""
            self.baseline_label.setText(f"No speedup for this answer: {why}.{now}")
            return
        baseline = self.trace.baseline if self.trace.rounds else self.baseline
        self.baseline_label.setText(baseline.describe() if baseline else "Target alone: not measured yet")

    def _set_empty(self, empty: bool) -> None:
        self.empty_state.setVisible(empty)
        self.body.setVisible(not empty)
        self.export_button.setEnabled(not empty)

    def _show_legend(self) -> None:
        """The chips' keys, and the thinking rounds' band when the answer shown has any."""
        text = self._legend_keys
        if any(r.thinking for r in self.trace.rounds):
            text += (f' <span style="background-color:{THINKING_ROW[self._dark]};">&nbsp;thinking&nbsp;rounds'
                     '&nbsp;</span>')
        self.legend.setText(text)

    def _show_source(self, source: str) -> None:
        self.source_label.setText(f"Showing {source}")
        self.source_label.setVisible(bool(source))

    def begin(self, trace: TurnTrace, source: str = "") -> None:
        """A new answer begins; its owner (the chat controller, or the server switch for an API
        request: `source` names it) adds rounds to `trace`."""
        self._show_source(source)
        self._graph_timer.stop()
        self._unshown = []
        self.trace = trace
        self._show_legend()
        self._set_empty(False)
        self.rounds_view.set_rounds(trace.rounds)
        self.graphs.clear()
        self._show_figures(self.trace.figures())
        self._show_baseline()

    def rounds_added(self, rounds: list[RoundTrace]) -> None:
        """`rounds` were just added to the trace shown."""
        self._unshown.extend(rounds)
        if not self._graph_timer.isActive():
            self._graph_timer.start()

    def _refresh(self, graphs: bool = False) -> None:
        """New rows, figures and graphs of the live answer (figures and graphs walk every round)."""
        rounds, self._unshown = self._unshown, []
        self.rounds_view.append(rounds)
        if any(r.thinking for r in rounds):
            self._show_legend()
        self._show_figures(self.trace.figures())
        self._show_baseline()  # the timings the answer is measured against come just before its rounds
        self._refreshes += 1
        if graphs or self._refreshes % GRAPH_EVERY == 0:
            self.graphs.show_trace(self.trace)

    def finish_answer(self) -> None:
        self._graph_timer.stop()
        self._refresh(graphs=True)
        self._show_baseline()

    def show_trace(self, trace: TurnTrace | None, source: str = "") -> None:
        """An answer from the history (or none): its rounds, figures and graphs as they ended,
        against the baseline it was measured with; `source` names it when it is not the chat's
        latest answer (one clicked further up)."""
        self._show_source(source)
        self._graph_timer.stop()
        self._unshown = []
        self.trace = trace or TurnTrace(baseline=self.baseline)
        self._show_legend()
        self._set_empty(not self.trace.rounds)
        self.rounds_view.set_rounds(self.trace.rounds)
        self.graphs.show_trace(self.trace) if trace else self.graphs.clear()
        self._show_figures(self.trace.figures())
        self._show_baseline()

    def _show_figures(self, f: Figures) -> None:
        t = self.tiles
        reported = self.trace.reported
        self.reported_label.setText(reported.words() if reported is not None else "")
        self.reported_label.setVisible(reported is not None)
        # a server that sends text only has no rounds to draw: no empty chips and graphs either
        drawn = reported is None or any(r.chips for r in self.trace.rounds)
        self.rounds_view.setVisible(drawn)
        self.graphs.setVisible(drawn)
        t["tokens_per_s"].value.setText(f"{f.tokens_per_s:.1f}" if f.tokens_per_s else "–")
        self._show_speedup(f.speedup)
        t["acceptance"].value.setText(f"{f.acceptance:.0%}" if f.drafted else "–")
        t["tokens_per_pass"].value.setText(f"{f.tokens_per_pass:.2f}" if f.rounds else "–")
        t["k"].value.setText(str(f.k) if f.k else "–")  # "–": the latest pass drafted nothing

    def _show_speedup(self, s: Speedup | None) -> None:
        tile = self.tiles["speedup"]
        shown = s is not None and math.isfinite(s.median)
        tile.value.setText(f"{s.median:.2f}×" if shown else "–")
        # faster or slower only once the range clears 1 (app/chat/baseline.py); until then "about
        # as fast" in the text's own colour: a red 0.82x over a range up to 1.2 claimed too much
        verdict = s.verdict() if shown else ""
        color = verdict_color(verdict, self._dark)
        tile.value.setStyleSheet(f"color: {color};" if color else "")
        tile.caption.setText(f"speedup, {verdict}" if shown and verdict else "speedup")
        # the range over the target alone's timings: a median alone hides how noisy they were, and
        # one timing has no range, so no verdict either
        tile.detail.setText("" if not shown else "1 timing: no range yet" if s.timings == 1
                            else f"{s.low:.2f}-{s.high:.2f}")
        tile.detail.setVisible(shown)

    # --- exports -------------------------------------------------------------------------

    def export_csv(self, path: str | Path) -> None:
        Path(path).write_text(self.trace.to_csv(), encoding="utf-8")

    def export_json(self, path: str | Path) -> None:
        Path(path).write_text(self.trace.to_json(), encoding="utf-8")

    def export_png(self, path: str | Path) -> None:
        self.graphs.show_trace(self.trace)
        tiles = {name: tile.value.text() for name, tile in self.tiles.items()}
        speedup = self.tiles["speedup"]
        tiles["speedup_range"] = speedup.detail.text()
        tiles["speedup_verdict"] = speedup.caption.text().removeprefix("speedup").removeprefix(", ")
        self.graphs.export_png(str(path), png_heading(self.trace, tiles))

    def export_folder(self) -> str:
        """Where the export dialog opens: the folder last exported to, else the user's Documents
        (never the working directory, which for a double-clicked app is anywhere)."""
        last = self.settings.value(EXPORT_FOLDER_KEY, "", str) if self.settings is not None else self._export_folder
        for folder in (last, QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation),
                       QStandardPaths.writableLocation(QStandardPaths.StandardLocation.HomeLocation)):
            if folder and Path(folder).is_dir():
                return folder
        return ""

    def remember_folder(self, folder: str) -> None:
        self._export_folder = folder
        if self.settings is not None:
            self.settings.setValue(EXPORT_FOLDER_KEY, folder)

    def _export(self, filter_: str, suffix: str, write) -> None:
        start = str(Path(self.export_folder()) / f"tandem-answer{suffix}")
        path, _ = QFileDialog.getSaveFileName(self, "Export", start, filter_)
        if path:
            path = path if path.endswith(suffix) else path + suffix
            try:
                write(path)
            except OSError as exc:
                self.baseline_label.setText(f"The export to {path} failed: {exc.strerror or exc}. "
                                            "Choose another folder.")
                return
            self.remember_folder(str(Path(path).parent))
