"""How an alignment job hears Cancel: `cancelled()` (the window's SIGTERM sets it in the child,
app/align/command.py) is checked between the job's small units of work (a generate step, a
sequence, a chunk, a training step) and ends the job with AlignCancelled within about a second.

A step that is one long library call has no place to check it (loading the teacher: 11 s for the
demo on a 2-core CPU, minutes for a large target; the pair trial's loads). `until_cancelled` runs
such a step on a helper thread while the job's thread watches `cancelled()`, and leaves it behind
on a cancel. That is safe because these steps write nothing that is not whole (the demo's
conversion is staged and renamed, and a stale staging folder is removed the next time). A thread
left behind still inside PyTorch aborts the interpreter as it tears down ("terminate called
without an active exception", app/exit_signals.py), so the command leaves without tearing down
while `steps_left_running()`.

Kept apart from job.py, so that the modules that do the work (teacher_torch, the trainers) can
raise the job's exception without importing the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

NOTHING_SAVED = "Alignment cancelled: nothing was saved."
POLL_S = 0.05  # how often the job's thread looks at `cancelled()` while a step runs beside it
STEP_THREAD = "align-step"  # the helper threads' name, by which the command finds one left running

T = TypeVar("T")


class AlignCancelled(Exception):
    """The job was cancelled; nothing was written (or, in the pair trial, the draft was kept)."""


def never() -> bool:
    return False


def stop_if_cancelled(cancelled: Callable[[], bool], message: str = NOTHING_SAVED) -> None:
    if cancelled():
        raise AlignCancelled(message)


def until_cancelled(call: Callable[[], T], cancelled: Callable[[], bool], message: str = NOTHING_SAVED) -> T:
    """`call()`'s result (or its exception), computed on a helper thread; AlignCancelled within
    POLL_S of `cancelled()` turning true, the step left running behind (see the module's note)."""
    stop_if_cancelled(cancelled, message)
    outcome: dict[str, object] = {}

    def step() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the job's thread, raised there
            outcome["error"] = exc

    helper = threading.Thread(target=step, name=STEP_THREAD, daemon=True)
    helper.start()
    while helper.is_alive():
        helper.join(POLL_S)
        if helper.is_alive():
            stop_if_cancelled(cancelled, message)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def steps_left_running() -> bool:
    """Whether a step `until_cancelled` left behind is still running in this process."""
    return any(thread.name == STEP_THREAD and thread.is_alive() for thread in threading.enumerate())
