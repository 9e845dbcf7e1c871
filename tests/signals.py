"""Signalling a process under test: the signal, the wait for its end within a bound, and no
process left behind when the wait (or anything before it) fails."""

from __future__ import annotations

import subprocess
import time


def signal_and_wait(proc: subprocess.Popen, sig: int, bound_s: float) -> tuple[str, float]:
    """Send `sig` and wait at most `bound_s` for the process to end: (its stderr, seconds taken).
    subprocess.TimeoutExpired when it does not end; the process is killed then."""
    sent = time.monotonic()
    try:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=bound_s)
        return err, time.monotonic() - sent
    finally:
        kill_if_running(proc)


def kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
