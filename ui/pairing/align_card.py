"""The strip under the header where a draft is aligned: while the job runs, its bar, what it is
doing, the time left and Cancel; then the result card ("Aligned draft — agrees 0% → 48%; ...")
with Use aligned draft / Use original draft; or what went wrong, with the way out it offers."""

from __future__ import annotations

import math
import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QFrame, QGridLayout, QHBoxLayout, QLabel, QProgressBar, QPushButton,
                               QToolButton, QVBoxLayout, QWidget)

from app.models.pair_memory import TrialResult, read_trial

BAR_STEPS = 1000  # the bar's range: a fraction to a tenth of a percent


def eta_words(seconds: float | None) -> str:
    if seconds is None:
        return "estimating the time left…"
    if seconds < 60:
        return "less than a minute left"
    if seconds < 90 * 60:
        return f"about {max(1, round(seconds / 60))} min left"
    return f"about {seconds / 3600:.1f} h left"


def as_trial(value) -> TrialResult | None:
    """A trial as the job's JSON gives it (a dict), or as PairMemory does; None where it is not one."""
    if isinstance(value, TrialResult) or value is None:
        return value
    return read_trial(value)


def card_title(agreement, before: TrialResult | None, after: TrialResult | None) -> str:
    """"Aligned draft — agrees 0% → 48%; accepts 31% → 64%, 0.9x (0.85-0.95x) → 1.5x (1.40-1.60x) here",
    each speedup with its trial's range where the trial measured one."""
    line = "Aligned draft"
    # only two numbers are figures: a hand-edited pairs.json once put text here ("ab" formatted as a
    # percentage raised, and the card with it); app/models/pair_memory.py leaves such a value out too
    figures = list(agreement) if isinstance(agreement, (list, tuple)) else []
    if len(figures) == 2 and all(_figure(f) for f in figures):
        line += f" — agrees {figures[0]:.0%} → {figures[1]:.0%}"
    if before is not None and after is not None:
        # two decimals where one would show a difference as none ("1.0x → 1.0x", yet slower)
        digits = 2 if f"{before.speedup:.1f}" == f"{after.speedup:.1f}" and before.speedup != after.speedup else 1
        line += (f"; accepts {before.acceptance:.0%} → {after.acceptance:.0%}, "
                 f"{before.figure(digits)} → {after.figure(digits)} here")
    return line


def _figure(value) -> bool:
    """A number a percentage can be formatted from (math.isfinite raises on an int beyond a float)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**63
    return isinstance(value, float) and math.isfinite(value)


def measured_faster(before: TrialResult | None, after: TrialResult | None) -> bool:
    return before is not None and after is not None and after.speedup >= before.speedup


def _label(name: str = "", wrap: bool = False) -> QLabel:
    label = QLabel()
    if name:
        label.setObjectName(name)
    label.setWordWrap(wrap)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class AlignStrip(QFrame):
    """States: hidden; "running" (bar, Cancel); "result" (the card); "error" (a message)."""

    cancel_requested = Signal()
    use_aligned = Signal()
    use_original = Signal()
    unload_and_retry = Signal()
    pause_toggled = Signal(bool)

    def __init__(self, slow_machine: bool = False, can_pause: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("alignStrip")
        self.state = "hidden"
        self._eta: tuple[float, float] | None = None  # (seconds left, when the job said so)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 8)
        layout.setSpacing(4)
        layout.addWidget(self._build_running(slow_machine, can_pause))
        layout.addWidget(self._build_card())
        self.running_box.hide()
        self.card_box.hide()
        self.hide()

    def _build_running(self, slow_machine: bool, can_pause: bool) -> QWidget:
        self.running_box = QWidget()
        self.title = _label("slotName", wrap=True)
        self.bar = QProgressBar()
        self.bar.setRange(0, BAR_STEPS)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        self.phase_label = _label("mutedLabel", wrap=True)
        self.eta_label = _label("mutedLabel")
        self.eta_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop after the current step; nothing is saved")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.slow_label = _label("mutedLabel", wrap=True)
        self.slow_label.setText("This computer has few cores: chat answers come more slowly while the draft "
                                "trains.")
        self.pause_box = QCheckBox("Pause while an answer streams")
        self.pause_box.setToolTip("Stop the training while an answer is written, and go on once it is done")
        self.pause_box.setChecked(True)
        self.pause_box.toggled.connect(self.pause_toggled)
        grid = QGridLayout(self.running_box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        grid.addWidget(self.title, 0, 0, 1, 2)
        grid.addWidget(self.cancel_button, 0, 2, 2, 1, Qt.AlignmentFlag.AlignVCenter)
        grid.addWidget(self.bar, 1, 0, 1, 2)
        grid.addWidget(self.phase_label, 2, 0)
        grid.addWidget(self.eta_label, 2, 1)
        grid.addWidget(self.slow_label, 3, 0)
        grid.addWidget(self.pause_box, 3, 1, 1, 2, Qt.AlignmentFlag.AlignRight)
        grid.setColumnStretch(0, 1)
        self.slow_label.setVisible(slow_machine)
        self.pause_box.setVisible(slow_machine and can_pause)
        return self.running_box

    def _build_card(self) -> QWidget:
        self.card_box = QWidget()
        self.card_title = _label("slotName", wrap=True)
        self.card_note = _label("alignNote", wrap=True)  # muted; in the error colour for an error
        self.aligned_button = QPushButton("Use aligned draft")
        self.aligned_button.setObjectName("primaryButton")
        self.aligned_button.clicked.connect(self.use_aligned)
        self.original_button = QPushButton("Use original draft")
        self.original_button.clicked.connect(self.use_original)
        self.retry_button = QPushButton("Unload the pair and retry")
        self.retry_button.setToolTip("Free the memory the loaded pair holds while the draft trains; the pair "
                                     "loads again when the job ends")
        self.retry_button.clicked.connect(self.unload_and_retry)
        self.close_button = QToolButton()
        self.close_button.setText("Dismiss")
        self.close_button.setObjectName("messageAction")
        self.close_button.setToolTip("Hide this card (it shows again when this target is loaded)")
        self.close_button.clicked.connect(self.dismiss)
        buttons = QHBoxLayout()
        buttons.setSpacing(8)
        for button in (self.aligned_button, self.original_button, self.retry_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        grid = QGridLayout(self.card_box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(4)
        grid.addWidget(self.card_title, 0, 0)
        grid.addWidget(self.close_button, 0, 1, Qt.AlignmentFlag.AlignTop)
        grid.addWidget(self.card_note, 1, 0, 1, 2)
        grid.addLayout(buttons, 2, 0, 1, 2)
        grid.setColumnStretch(0, 1)
        return self.card_box

    # States

    def _show(self, state: str) -> None:
        self.state = state
        self.running_box.setVisible(state == "running")
        self.card_box.setVisible(state in ("result", "error"))
        self.card_note.setProperty("kind", "error" if state == "error" else "")
        self.card_note.style().unpolish(self.card_note)
        self.card_note.style().polish(self.card_note)
        self.setVisible(state != "hidden")

    def begin(self, title: str) -> None:
        self.title.setText(title)
        self.bar.setValue(0)
        self.phase_label.setText("Starting…")
        self.eta_label.setText(eta_words(None))
        self._eta = None
        self.cancel_button.setEnabled(True)
        self.cancel_button.setText("Cancel")
        self._show("running")

    def update_progress(self, event: dict) -> None:
        fraction = float(event.get("fraction") or 0.0)
        self.bar.setValue(max(self.bar.value(), round(min(max(fraction, 0.0), 1.0) * BAR_STEPS)))
        self.phase_label.setText(str(event.get("message") or event.get("phase") or "").replace(" ...", "…"))
        eta = event.get("eta_s")
        if isinstance(eta, (int, float)):
            self._eta = (float(eta), time.monotonic())
        self.refresh_eta()

    def refresh_eta(self) -> None:
        # between phases the job has no estimate yet: the last one, less the time since
        left = None if self._eta is None else max(0.0, self._eta[0] - (time.monotonic() - self._eta[1]))
        self.eta_label.setText(eta_words(left))

    def cancelling(self) -> None:
        self.cancel_button.setEnabled(False)
        self.cancel_button.setText("Cancelling…")
        self.phase_label.setText("Cancelling: the job stops and removes anything half-written…")

    def show_card(self, title: str, note: str, aligned_in_use: bool | None) -> None:
        """The result: `aligned_in_use` True/False marks which draft the pair uses (its button is
        off), None when neither is loaded now."""
        self.card_title.setText(title)
        self.card_note.setText(note)
        self.card_note.setVisible(bool(note))
        for button, which, in_use in ((self.aligned_button, "aligned", aligned_in_use is True),
                                      (self.original_button, "original", aligned_in_use is False)):
            button.show()
            button.setEnabled(not in_use)
            button.setText(f"{which.capitalize()} draft in use" if in_use else f"Use {which} draft")
            button.setToolTip("The pair drafts with this now" if in_use else f"Load the pair with the {which} draft")
        self.retry_button.hide()
        self._show("result")

    def show_error(self, title: str, message: str, offer_unload: bool = False) -> None:
        self.card_title.setText(title)
        self.card_note.setText(message)
        self.card_note.show()
        self.aligned_button.hide()
        self.original_button.hide()
        self.retry_button.setVisible(offer_unload)
        self.retry_button.setEnabled(True)
        self._show("error")

    def dismiss(self) -> None:
        self._show("hidden")
