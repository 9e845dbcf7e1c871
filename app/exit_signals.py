"""Ctrl+C and SIGTERM for the command line: both end a command the same way.

Python turns Ctrl+C into KeyboardInterrupt in the main thread, but SIGTERM (what `kill`, a
service manager or a closing terminal sends) ends the process at once by default: an answer cut
mid-token, a server's streams cut with no error and no `[DONE]`. Here SIGTERM raises `Terminated`
(a KeyboardInterrupt, so every path that handles Ctrl+C handles it) in the main thread.

Both then cancel the request, and the engine's thread is joined before the interpreter exits: a
thread still inside a PyTorch or MLX pass while the interpreter tears down aborts the process
("terminate called without an active exception"). The engine hears a cancel between rounds and
between prompt chunks (app/engine/prefill.py); where it does not within the wait (a load, one
long chunk on a slow machine), the process leaves without tearing down (`leave_now`).
"""

from __future__ import annotations

import os
import signal
import sys

SIGINT_EXIT = 130  # the shell's 128 + signal number
SIGTERM_EXIT = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl+C's KeyboardInterrupt would be."""


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in the main thread (a no-op elsewhere)."""
    def terminated(signum, frame):
        raise Terminated()

    try:
        signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread (a test calling main() from a worker): leave it
        pass


def exit_code(exc: BaseException | None) -> int:
    if isinstance(exc, Terminated):
        return SIGTERM_EXIT
    return SIGINT_EXIT if isinstance(exc, KeyboardInterrupt) else 1


def close_engine(service, timeout: float = 10.0) -> None:
    """Close the service; if its thread is still in a pass after `timeout`, leave the process now
    (with the exit code of the exception being handled), before the interpreter tears down."""
    if service.close(timeout):
        return
    leave_now(exit_code(sys.exc_info()[1]),
              f"tandem-cli: the engine was still busy {timeout:.0f} s after it was asked to stop "
              "(a model loading, or one long pass); leaving without waiting for it.")


def leave_now(code: int, message: str = "") -> None:
    """End the process at once, without the interpreter's teardown (which can wait on, or abort
    beside, a thread still inside PyTorch), the streams flushed first."""
    if message:
        print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
