"""Reading Tandem's own data files at start (pairs.json, Tandem.conf, the history's path) with a
bound, so that no file can keep the window from showing.

A named pipe (FIFO) where a file belongs blocks a plain read until something writes to it, which
may be never; a folder on a stalled network mount blocks even a stat. So a file is opened without
waiting (O_NONBLOCK: a FIFO opens at once), refused unless it is a regular file, read up to a
size, and all of it runs on a short-lived daemon thread that the caller waits for only so long.
A thread stuck in the kernel is left behind (daemon: it does not hold up quitting) and the caller
goes on as if the file could not be read, saying why.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Callable, TypeVar

WAIT_S = 3.0  # a local disk answers in milliseconds; a network folder that has not in 3 s is stalled
MAX_BYTES = 16 * 2**20  # far above what Tandem writes (pairs.json holds a few KB)
PROBE_BYTES = 4096

T = TypeVar("T")


class DataFileError(OSError):
    """A data file that cannot be read as one: the message says which file and why, in words."""


class NotAnswering(DataFileError):
    """The file (or the folder it is in) did not answer within the bound: nothing about it is known."""


def kind_words(mode: int) -> str:
    """What a non-regular file is, in a user's words."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO), not a file"
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return "not a regular file"


def within(seconds: float | None, work: Callable[[], T], what: str) -> T:
    """`work()`'s result, or NotAnswering when it has not returned within `seconds` (None:
    WAIT_S); an exception it raised is raised here. `what` names the file in the message."""
    seconds = WAIT_S if seconds is None else seconds
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller as it was)
            box["error"] = exc

    thread = threading.Thread(target=run, name="tandem-data-file", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise NotAnswering(f"{what} did not answer within {seconds:g} s (a stalled network folder?)")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _open_regular(path: Path) -> int:
    """A descriptor open for reading on `path`, or DataFileError where it is not a regular file.
    O_NONBLOCK lets a FIFO open without a writer; on a regular file it changes nothing."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DataFileError(f"{path} is {kind_words(mode)}")
    return fd


def _read_regular(path: Path, limit: int) -> bytes:
    fd = _open_regular(path)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise DataFileError(f"{path} is larger than {limit // 2**20} MB, far more than Tandem writes there")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(path: Path, limit: int = MAX_BYTES, seconds: float | None = None) -> bytes:
    """The file's bytes. FileNotFoundError where there is none; DataFileError where it is not a
    regular file, is too large, or does not answer in `seconds`; other OSErrors as they come."""
    return within(seconds, lambda: _read_regular(Path(path), limit), str(path))


def read_text(path: Path, limit: int = MAX_BYTES, seconds: float | None = None) -> str:
    """read_bytes, decoded as UTF-8 (UnicodeDecodeError where it is not)."""
    return read_bytes(path, limit, seconds).decode("utf-8")


def check(path: Path, seconds: float | None = None) -> DataFileError | None:
    """Why `path` cannot serve as a data file that another library opens (SQLite, QSettings), or
    None: it is a regular file that reads, or there is nothing there yet. NotAnswering is one of
    the reasons. A missing permission and the like are left to that library to say."""

    def probe() -> None:
        try:
            fd = _open_regular(Path(path))
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            os.read(fd, PROBE_BYTES)  # a file on a stalled mount may stat from a cache and hang here
        finally:
            os.close(fd)

    try:
        within(seconds, probe, str(path))
    except DataFileError as exc:
        return exc
    except OSError:
        return None
    return None
