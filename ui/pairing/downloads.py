"""Hub downloads off the GUI and engine threads: a job fetches one or more models in turn with
app.models.hub, and a strip under the header shows each file's progress and the total, with
Cancel. A cancelled or interrupted download resumes from its partial file next time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QProgressBar, QPushButton, QWidget

from app.models import hub


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class _ConfigFetched(Exception):
    """Stops a first pass once a model's config and tokenizer are in (see DownloadJob._run)."""


class DownloadJob(QObject):
    """Fetches `refs` one after another on a thread of its own. Signals arrive on the GUI thread.

    With a `precheck`, a first pass fetches only each model's config and tokenizer files, and
    precheck([(folder, weight bytes) or None per ref]) runs before any weights are fetched: it
    raises to refuse the pair (the exception reaches `failed`) or returns a warning."""

    progress = Signal(int, int, object)  # index of the model, how many, hub.DownloadProgress
    done = Signal(list)  # the local paths, in the order of refs
    failed = Signal(object)  # the hub.HubError (NeedsToken, NoNetwork, ...) or another exception
    cancelled = Signal()
    warning = Signal(str)  # the precheck's: the pair fits only tightly

    def __init__(self, refs: list[hub.HubRef], token: str | None = None, endpoint: str | None = None,
                 precheck=None, parent: QObject | None = None):
        super().__init__(parent)
        self.refs, self.token, self.endpoint, self.precheck = refs, token, endpoint, precheck
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-download", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        paths: list[Path] = []
        try:
            if self.precheck is not None:
                found = [self._config_of(index, ref) for index, ref in enumerate(self.refs)]
                if warning := self.precheck(found):
                    self.warning.emit(warning)
            for index, ref in enumerate(self.refs):
                def report(p, index=index):
                    self.progress.emit(index, len(self.refs), p)
                paths.append(hub.download(ref, report, self._cancel, token=self.token, endpoint=self.endpoint))
        except hub.DownloadCancelled:
            self.cancelled.emit()
            return
        except Exception as exc:  # every failure reaches the window as a message
            self.failed.emit(exc)
            return
        self.done.emit(paths)

    def _config_of(self, index: int, ref: hub.HubRef) -> tuple[Path, int] | None:
        found: list[tuple[Path, int]] = []

        def stop(folder: Path, weight_bytes: int) -> None:
            found.append((folder, weight_bytes))
            raise _ConfigFetched()

        try:
            hub.download(ref, lambda p: self.progress.emit(index, len(self.refs), p), self._cancel,
                         token=self.token, endpoint=self.endpoint, before_weights=stop)
        except _ConfigFetched:
            pass
        return found[0] if found else None  # None: a single .gguf, checked once it is here


class DownloadStrip(QFrame):
    """One line per download: what is being fetched, this file's bar, the total bar, Cancel."""

    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("downloadStrip")
        self.title = QLabel("")
        self.title.setObjectName("slotName")
        self.file_label = QLabel("")
        self.file_label.setObjectName("mutedLabel")
        self.total_label = QLabel("")
        self.total_label.setObjectName("mutedLabel")
        self.file_bar, self.total_bar = QProgressBar(), QProgressBar()
        for bar in (self.file_bar, self.total_bar):
            bar.setTextVisible(False)
            bar.setMaximumHeight(8)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_requested)
        grid = QGridLayout(self)
        grid.setContentsMargins(14, 8, 14, 8)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(3)
        grid.addWidget(self.title, 0, 0, 1, 2)
        grid.addWidget(self.cancel_button, 0, 2, 3, 1, Qt.AlignmentFlag.AlignVCenter)
        grid.addWidget(self.file_label, 1, 0)
        grid.addWidget(self.file_bar, 1, 1)
        grid.addWidget(self.total_label, 2, 0)
        grid.addWidget(self.total_bar, 2, 1)
        grid.setColumnStretch(1, 1)
        self._started = 0.0
        self._start_done = 0
        self.hide()

    def begin(self, what: str) -> None:
        self.title.setText(f"Downloading {what}")
        self.file_label.setText("Asking the hub for the file list…")
        self.total_label.setText("")
        for bar in (self.file_bar, self.total_bar):
            bar.setRange(0, 0)  # busy until the sizes are known
        self._started, self._start_done = time.monotonic(), -1
        self.cancel_button.setEnabled(True)
        self.show()

    def update_progress(self, index: int, count: int, p) -> None:
        if self._start_done < 0:  # bytes already on disk (cache, resumed part) do not count in the speed
            self._started, self._start_done = time.monotonic(), p.done
        model = f"model {index + 1} of {count}, " if count > 1 else ""
        self.file_label.setText(f"{p.file} ({model}file {min(p.files_done + 1, p.files_total)} of {p.files_total}): "
                                f"{_mb(p.file_done)} of {_mb(p.file_total)}")
        elapsed = time.monotonic() - self._started
        rate = (p.done - self._start_done) / elapsed if elapsed > 0.5 else 0.0
        speed = f" · {rate / 1e6:.1f} MB/s" if rate > 0 else ""
        self.total_label.setText(f"{_mb(p.done)} of {_mb(p.total)}{speed}")
        for bar, done, total in ((self.file_bar, p.file_done, p.file_total), (self.total_bar, p.done, p.total)):
            scale = max(total, 1) / 1_000_000 if total > 2**31 - 1 else 1  # QProgressBar takes ints
            bar.setRange(0, int(total / scale))
            bar.setValue(int(done / scale))

    def end(self) -> None:
        self.hide()
