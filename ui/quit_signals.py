"""Ctrl+C (SIGINT) and SIGTERM quit the window as its Quit menu does.

Qt's event loop runs in C++, so a Python signal handler runs only when Python code next runs:
SIGINT to an idle window waited for ever, and with an answer streaming it surfaced as a
KeyboardInterrupt traceback in some slot while the window went on; SIGTERM's default ended the
process at once and the streamed answer was lost. `signal.set_wakeup_fd` writes a byte to a
socket when a signal arrives; a QSocketNotifier on the other end wakes the loop, Python runs the
handler there, and the handler closes the window, which stops the answer, stores what was shown
(marked interrupted) and quits (MainWindow.closeEvent).
"""

from __future__ import annotations

import signal
import socket

from PySide6.QtCore import QCoreApplication, QObject, QSocketNotifier, QTimer


class QuitOnSignals(QObject):
    """Installed from the application's start (a signal while the window is being built quits as
    soon as the loop runs); `window` is what a signal closes once it exists; `received` is the
    signal that ended the app (None: none did)."""

    SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)

    def __init__(self, app, window=None):
        super().__init__(app)
        self.window = window
        self.received: int | None = None
        self._reader, self._writer = socket.socketpair()
        for end in (self._reader, self._writer):
            end.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno())
        self._notifier = QSocketNotifier(self._reader.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _drain(self) -> None:
        try:
            while self._reader.recv(64):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
            QTimer.singleShot(0, self._quit)  # in the loop, not inside whatever was running

    def _quit(self) -> None:
        if self.window is not None:
            self.window.close()  # MainWindow.closeEvent: the answer stopped and stored, then the app quits
        else:
            QCoreApplication.quit()

    def exit_code(self, code: int) -> int:
        """The shell's 128 + signal number when a signal closed the window, else `code`."""
        return 128 + int(self.received) if self.received is not None else code

    def uninstall(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        signal.set_wakeup_fd(self._previous_fd)
        self._notifier.setEnabled(False)
        self._reader.close()
        self._writer.close()
