"""Race mode: the same question answered by the target alone and speculatively, side by side,
with their times, the measured ratio, and at temperature 0 whether the texts are identical.

Both answers stream into their panes as they are written (the target alone first, then
speculation); closing the dialog cancels a race still running. A finished race is kept with the
chat and shown under its question (`race_notice`), with a link that opens it again as it ended
(`RaceDialog.kept`: both answers, their figures and the verdict, read back from the history)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QGridLayout, QLabel, QTextBrowser, QVBoxLayout, QWidget

from app.json_fields import is_number

SIDES = ("Target alone", "Speculative")
RECORD_SIDES = ("alone", "speculative")  # their keys in a race's record (ui.worker.RaceResult.to_dict)
RUNNING = "Racing… the target alone answers first, then speculation. Close cancels the race."
NO_TEXT = "(This race was kept before Tandem kept the answers' texts: only its figures are here.)"


class RaceDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, temperature: float | None = 0.0):
        super().__init__(parent)
        self.setWindowTitle("Race: the target alone against speculation")
        self.resize(980, 560)
        self.running = True
        self.temperature = temperature
        self.summary = QLabel(RUNNING)
        self.how = QLabel(temperature_words(temperature))
        self.how.setObjectName("mutedLabel")
        self.how.setWordWrap(True)
        self.summary.setObjectName("raceSummary")
        self.summary.setWordWrap(True)
        font = self.summary.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.summary.setFont(font)
        grid = QGridLayout()
        self.titles, self.texts, self.stats = [], [], []
        for column, title in enumerate(SIDES):
            label = QLabel(f"<b>{title}</b>")
            text = QTextBrowser()
            text.setObjectName("raceText")
            stats = QLabel("writing…" if column == 0 else "waits for the target alone")
            stats.setObjectName("mutedLabel")
            stats.setWordWrap(True)
            grid.addWidget(label, 0, column)
            grid.addWidget(text, 1, column)
            grid.addWidget(stats, 2, column)
            self.titles.append(label)
            self.texts.append(text)
            self.stats.append(stats)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.buttons.rejected.connect(self.reject)
        self.close_button = self.buttons.button(QDialogButtonBox.StandardButton.Close)
        self.close_button.setToolTip("Cancels the race if it is still running")
        self.rerun_button = None
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.how)
        layout.addLayout(grid, 1)
        layout.addWidget(self.buttons)

    def offer_rerun(self, temperature: float, rerun) -> None:
        """A button that races again at the chat's own temperature."""
        self.rerun_button = self.buttons.addButton(f"Race at the chat's temperature ({temperature:g})",
                                                   QDialogButtonBox.ButtonRole.ActionRole)
        self.rerun_button.setToolTip("Both sides sample at the chat's temperature: two different answers, "
                                     "so their speeds compare answers of different lengths")
        self.rerun_button.clicked.connect(rerun)

    def append_text(self, side: int, delta: str) -> None:
        """More of one side's answer, as it is written; the pane follows the end unless scrolled up."""
        pane = self.texts[side]
        bar = pane.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 4
        cursor = pane.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(delta)
        if follow:
            bar.setValue(bar.maximum())
        if side == 1 and self.stats[1].text() == "waits for the target alone":
            self.stats[1].setText("writing…")

    def side_done(self, side: int, finished) -> None:
        """One side has finished: its figures now, before the other side ends."""
        self.texts[side].setPlainText(finished.text)  # the answer as the engine ended it
        s = finished.stats
        self.stats[side].setText(side_line(s.tokens, s.decode_s, s.tokens_per_s, s.drafted, s.acceptance_rate,
                                           s.tokens_per_round))
        if side == 0:
            self.stats[1].setText("writing…")

    @classmethod
    def kept(cls, parent: QWidget | None, record: dict) -> RaceDialog:
        """A finished race as the history kept it (its record, read defensively: a damaged field
        leaves its part out and says so, the rest still shows)."""
        record = record if isinstance(record, dict) else {}
        temperature = record.get("temperature")
        if not is_number(temperature):
            temperature = 0.0 if record.get("greedy") is True else None
        dialog = cls(parent, temperature=temperature)
        dialog.setWindowTitle("Race kept with the chat: the target alone against speculation")
        dialog.running = False
        dialog.close_button.setToolTip("")
        for column, key in enumerate(RECORD_SIDES):
            side = record.get(key) if isinstance(record.get(key), dict) else {}
            text = side.get("text")
            dialog.texts[column].setPlainText(text if isinstance(text, str) else NO_TEXT)
            dialog.stats[column].setText(recorded_side_line(side))
        dialog.summary.setTextFormat(Qt.TextFormat.RichText)
        try:
            dialog.summary.setText(summary_html(record))
        except (KeyError, TypeError, ValueError, OverflowError):  # a stored 1e400 overflows its format
            dialog.summary.setText("This race's result could not be read back from the chat history.")
        return dialog

    def show_result(self, result) -> None:
        """`result`: ui.worker.RaceResult."""
        self.running = False
        for column, finished in enumerate((result.alone, result.speculative)):
            self.side_done(column, finished)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setText(summary_html(result.to_dict()))

    def show_error(self, message: str) -> None:
        self.running = False
        self.summary.setText(message)
        for stats in self.stats:
            if stats.text() in ("writing…", "waits for the target alone"):
                stats.setText("stopped")


def temperature_words(temperature: float | None) -> str:
    if temperature is None:  # a race kept before its temperature was
        return "Above temperature 0: the two answers are different samples, so the ratio is noisier."
    if temperature == 0:
        return ("At temperature 0: the exact comparison. Both sides must write the same text, so the ratio "
                "compares the same tokens written two ways.")
    return (f"At temperature {temperature:g}: the two answers are different samples, of different lengths, so "
            "the ratio is noisier than at temperature 0.")


def side_line(tokens: int, decode_s: float, tokens_per_s: float, drafted: int, acceptance: float,
              tokens_per_pass: float) -> str:
    """One side's figures, as the race ended or as its record keeps them."""
    line = f"{tokens} tokens in {decode_s:.2f} s after the first · {tokens_per_s:.1f} tok/s"
    if drafted:
        line += f" · {acceptance:.0%} of drafts accepted · {tokens_per_pass:.2f} tokens/pass"
    return line


def recorded_side_line(side: dict) -> str:
    """One side's line from a race's record (RaceResult.to_dict); a damaged record says so."""
    fields = ("tokens", "decode_s", "tokens_per_s", "drafted", "acceptance", "tokens_per_round")
    values = [side.get(name) for name in fields]
    if not all(is_number(value) for value in values):
        return "its figures could not be read back from the chat history"
    return side_line(*values)


def _verdict(record: dict) -> str:
    if not record.get("greedy"):
        return "Above temperature 0 the two answers are different samples of the same distribution."
    if record.get("identical"):
        return "The two answers are identical, token for token."
    return "The answers differ: at temperature 0 they should not — please report this."


def summary_html(record: dict) -> str:
    """The dialog's verdict, from a race's record (RaceResult.to_dict)."""
    return (f"Speculation ran <b>{record['ratio']:.2f}×</b> as fast as the target alone "
            f"({record['speculative']['tokens_per_s']:.1f} against {record['alone']['tokens_per_s']:.1f} "
            f"tokens/s). {_verdict(record)}")


def race_notice(record: dict) -> str:
    """The line kept under a raced question in the chat (plain text)."""
    try:
        pair = f" ({record['target']} with {record['draft']})" if record.get("target") else ""
        return (f"Race{pair}: speculation ran {record['ratio']:.2f}× as fast as the target alone "
                f"({record['speculative']['tokens_per_s']:.1f} against {record['alone']['tokens_per_s']:.1f} "
                f"tokens/s). {_verdict(record)}")
    except (KeyError, TypeError, ValueError, OverflowError):  # a stored 1e400 overflows its format
        return "Race: this question was raced, but its result could not be read."
