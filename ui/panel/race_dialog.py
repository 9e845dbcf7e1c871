"""Race mode: the same question answered by the target alone and speculatively, side by side,
with their times, the measured ratio, and at temperature 0 whether the texts are identical."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QGridLayout, QLabel, QTextBrowser, QVBoxLayout, QWidget


class RaceDialog(QDialog):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Race: the target alone against speculation")
        self.resize(980, 560)
        self.summary = QLabel("Racing… the target alone answers first, then speculation.")
        self.summary.setObjectName("raceSummary")
        self.summary.setWordWrap(True)
        font = self.summary.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.summary.setFont(font)
        grid = QGridLayout()
        self.titles, self.texts, self.stats = [], [], []
        for column, title in enumerate(("Target alone", "Speculative")):
            label = QLabel(f"<b>{title}</b>")
            text = QTextBrowser()
            text.setObjectName("raceText")
            stats = QLabel("…")
            stats.setObjectName("mutedLabel")
            grid.addWidget(label, 0, column)
            grid.addWidget(text, 1, column)
            grid.addWidget(stats, 2, column)
            self.titles.append(label)
            self.texts.append(text)
            self.stats.append(stats)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addLayout(grid, 1)
        layout.addWidget(buttons)

    def show_result(self, result) -> None:
        """`result`: ui.worker.RaceResult."""
        for column, finished in enumerate((result.alone, result.speculative)):
            s = finished.stats
            self.texts[column].setPlainText(finished.text)
            line = f"{s.tokens} tokens in {s.decode_s:.2f} s after the first · {s.tokens_per_s:.1f} tok/s"
            if s.drafted:
                line += f" · {s.acceptance_rate:.0%} of drafts accepted · {s.tokens_per_round:.2f} tokens/pass"
            self.stats[column].setText(line)
        verdict = ""
        if result.greedy:
            verdict = (" The two answers are identical, token for token." if result.identical
                       else " The answers differ: at temperature 0 they should not — please report this.")
        else:
            verdict = " Above temperature 0 the two answers are different samples of the same distribution."
        self.summary.setText(f"Speculation ran <b>{result.ratio:.2f}×</b> as fast as the target alone "
                             f"({result.speculative.stats.tokens_per_s:.1f} against "
                             f"{result.alone.stats.tokens_per_s:.1f} tokens/s).{verdict}")
        self.summary.setTextFormat(Qt.TextFormat.RichText)

    def show_error(self, message: str) -> None:
        self.summary.setText(message)
