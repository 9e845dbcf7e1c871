"""Byte progress and cancel for huggingface-hub downloads. hf_hub_download reports bytes
through the progress-bar class it is given (`tqdm_class`); ours counts them into the plan's
totals and raises DownloadCancelled from inside the transfer when asked, which leaves the
.incomplete file in the cache for the next attempt to resume from."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

REPORT_EVERY_S = 0.1  # at most ~10 reports a second, whatever the chunk rate


class DownloadCancelled(Exception):
    """The user cancelled; what was fetched stays in the cache and resumes next time."""


@dataclass(frozen=True)
class DownloadProgress:
    file: str
    file_done: int
    file_total: int
    done: int  # over every file of the plan; files already in the cache count as done
    total: int
    files_done: int
    files_total: int


class ProgressCounter:
    def __init__(self, plan, report: Callable[[DownloadProgress], None], cancel: threading.Event):
        self.sizes = {f.name: f.size for f in plan}
        self.total = sum(self.sizes.values())
        self.report, self.cancel = report, cancel
        self.finished_bytes = 0  # of files completed (or skipped)
        self.files_done = 0
        self.file, self.file_done, self.file_total = "", 0, 0
        self._last = 0.0

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= REPORT_EVERY_S:
            self._last = now
            self.report(DownloadProgress(self.file, self.file_done, self.file_total,
                                         self.finished_bytes + self.file_done, self.total,
                                         self.files_done, len(self.sizes)))

    def skip(self, item) -> None:
        self.file, self.file_done, self.file_total = item.name, item.size, item.size
        self.end(item)

    def begin(self, item) -> None:
        self.file, self.file_done, self.file_total = item.name, 0, item.size
        self._emit(force=True)

    def end(self, item) -> None:
        self.finished_bytes += self.sizes[item.name]
        self.files_done += 1
        self.file_done = 0
        self._emit(force=True)

    def bytes(self, n: int) -> None:
        self.file_done = max(0, self.file_done + n)
        if self.cancel.is_set():
            raise DownloadCancelled()
        self._emit()

    def tqdm_class(self):
        counter = self

        class Bar:
            """The part of tqdm's interface huggingface-hub's downloader uses."""

            def __init__(self, *args, total=None, initial=0, **kwargs):
                self.n = initial or 0
                self.total = total
                counter.file_done = self.n  # a resumed file starts where its partial part ends
                if total:
                    counter.file_total = total
                counter._emit(force=True)

            def update(self, n=1):
                self.n += n
                counter.bytes(n)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def close(self):
                pass

            def set_description(self, *args, **kwargs):
                pass

            # hf_xet's reporter (huggingface_hub.utils._xet_progress_reporting) also calls these;
            # update_transfer exists so it reports through `update` alone
            def update_transfer(self, n=1):
                pass

            def set_postfix_str(self, *args, **kwargs):
                pass

            def set_transfer_postfix_str(self, *args, **kwargs):
                pass

            def refresh(self, *args, **kwargs):
                pass

        return Bar
