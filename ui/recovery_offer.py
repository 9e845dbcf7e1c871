"""Answers the history refused when Tandem last quit (a full disk), offered back in the window.

They were written to a recovery file (app/chat/recovery.py) and said only on stderr, so the
restarted window showed the answer empty and never named the file. Now a banner names it, with
Restore (the answers go into their chats, the chat opens, the file goes: the history holds them),
Open (the file in the program that opens JSON) and Dismiss (the file stays, and is not offered
again). One file at a time, the newest first; the next is offered once this one is handled.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from app.chat.history import HistoryError
from app.chat.recovery import find_recoveries, read_recovery, restore
from ui import window_state

TOPIC = "recovery"
SHOWN_MS = 8000


class RecoveryOffer:
    def __init__(self, window):
        self.window = window
        self.path: Path | None = None  # the file the banner offers
        self._passed: set[str] = set()  # this session: files offered and handled, or that failed

    def offer_next(self) -> None:
        """A banner for the newest recovery file not yet handled, if there is one."""
        store = self.window.store
        if str(store.path) == ":memory:":  # the history is not the one the files belong to
            return
        dismissed = set(self._dismissed())
        found = [p for p in find_recoveries(Path(store.path)) if p.name not in dismissed | self._passed]
        if not found:
            self.path = None
            return
        self.path = path = found[0]
        banner = self.window.banners.add(f"An answer that could not be saved when Tandem last quit (the disk was "
                                         f"full or the history locked) is in {path}.", "warning", TOPIC)
        banner.add_action("Restore", "Put the answer back into its chat, and open the chat", self.restore_now,
                          keep_open=True)
        banner.add_action("Open", "Open the file (JSON text)", self.open_file, keep_open=True)
        banner.close_button.setToolTip("Leave the file where it is; it is not offered again")
        banner.close_button.clicked.connect(lambda: self._dismiss(path))

    def restore_now(self) -> None:
        window, path = self.window, self.path
        if path is None:
            return
        if window.controller.busy:
            window.status.showMessage("Restore the answer once the one being written has finished.", SHOWN_MS)
            return
        try:
            answers = read_recovery(path)
            chats = restore(window.store, answers)
        except (OSError, ValueError, HistoryError) as exc:
            self._passed.add(path.name)
            window.banners.add(f"The answer in {path} could not be restored: {exc} The file is kept as it is.",
                               "error", TOPIC)
            return
        self._passed.add(path.name)
        try:
            path.unlink()  # the history holds it now
        except OSError:
            self._remember_dismissed(path.name)  # left there, but not offered again
        window.banners.remove(TOPIC)
        window._open(chats[0])
        window.refresh_conversations()
        count = f"{len(answers)} answers" if len(answers) > 1 else "The answer"
        window.status.showMessage(f"{count} from {path.name} restored into the chat history.", SHOWN_MS)
        self.offer_next()

    def open_file(self) -> None:
        if self.path is not None and not QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.path))):
            self.window.status.showMessage(f"No program here opens {self.path.name}; it is JSON text.", SHOWN_MS)

    def _dismiss(self, path: Path) -> None:
        self._passed.add(path.name)
        self._remember_dismissed(path.name)
        if self.path == path:
            self.offer_next()

    def _dismissed(self) -> list[str]:
        value = self.window.app_settings.value(window_state.DISMISSED_RECOVERIES, [])
        if isinstance(value, str):  # QSettings reads a list of one back as its item
            return [value]
        return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []

    def _remember_dismissed(self, name: str) -> None:
        names = [n for n in self._dismissed() if n != name][-49:] + [name]  # the latest 50 are plenty
        self.window.app_settings.setValue(window_state.DISMISSED_RECOVERIES, names)
