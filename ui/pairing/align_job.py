"""The alignment job as a child process: `tandem-cli align --json-progress` (app/align/command.py),
read line by line. A child process, not a thread: it trains with PyTorch threads of its own
(capped below the machine's cores) while the loaded pair's thread stays free for the chat, and
MLX work must own its process anyway (../shared/DESIGN.md, background jobs).

Cancel is SIGTERM on POSIX: the job stops within about a second in any step (app/align/cancel.py),
writes nothing and reports "cancelled"; one that has not ended CANCEL_KILL_MS later is stuck in a
native call and is killed, as everywhere on Windows, which has no SIGTERM a console program can
catch: a killed job leaves at most a partial folder, removed the next time a job starts. Pausing
(SIGSTOP/SIGCONT) is POSIX only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

STDERR_KEPT = 4096  # of the child's library noise: enough for its last line when it dies
QUIT_WAIT_MS = 3000  # at quit, for the child to finish its step before it is killed
CANCEL_KILL_MS = 5000  # after Cancel, for the child to end before it is killed (it takes about 1 s)
# the draft is being written or is written (a cancel in the trial keeps it): never killed there, where a
# kill would leave a draft the window is not told of
DRAFT_WRITTEN = ("saving", "trial")
CAN_PAUSE = hasattr(signal, "SIGSTOP")  # POSIX


@dataclass(frozen=True)
class AlignOptions:
    """What the window asks of the job beyond the pair: None leaves the job's own default (its
    12-minute budget decides how many answers and steps). Tests make it small."""

    minutes: float | None = None
    prompts: int | None = None
    steps: int | None = None
    max_tokens: int | None = None
    batch: int | None = None
    self_prompts: int | None = None  # asks the target writes itself (None: the job's rule)
    threads: int | None = None  # None: all cores but one
    trial: bool = True  # the pair trial before and after: what decides the auto-pairing


def job_threads(options: AlignOptions) -> int:
    return options.threads or max(1, (os.cpu_count() or 2) - 1)


def cli_program() -> list[str]:
    """How to run tandem-cli: the bundled program beside the window's in a frozen build
    (packaging/tandem.spec builds both into one folder), else this Python on app.cli."""
    if getattr(sys, "frozen", False):
        name = "tandem-cli.exe" if sys.platform == "win32" else "tandem-cli"
        return [str(Path(sys.executable).with_name(name))]
    return [sys.executable, "-m", "app.cli"]


def aligning_unavailable() -> str:
    """Why this installation cannot align ("" when it can): the job trains with PyTorch, which
    the macOS (MLX) build leaves out. Looked up, never imported (ui/ imports no array library)."""
    if importlib.util.find_spec("torch") is None:
        return "Aligning a draft trains it with PyTorch, which this build of Tandem does not include."
    if getattr(sys, "frozen", False) and not Path(cli_program()[0]).is_file():
        return f"This build of Tandem has no command-line program ({cli_program()[0]}) to align with."
    return ""


def align_arguments(target: str, draft: str, backend: str, original_draft: str, options: AlignOptions,
                    temperature: float = 0.0) -> list[str]:
    """The `tandem-cli align` arguments for a pair: `draft` is "head" or a draft model's folder."""
    args = ["align", "--target", target, "--draft", draft, "--backend", backend or "torch",
            "--original-draft", original_draft, "--threads", str(job_threads(options)),
            "--temperature", f"{temperature:g}", "--json-progress"]
    for flag, value in (("--minutes", options.minutes), ("--prompts", options.prompts),
                        ("--steps", options.steps), ("--max-tokens", options.max_tokens),
                        ("--batch", options.batch), ("--self-prompts", options.self_prompts)):
        if value is not None:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if not options.trial:
        args.append("--no-trial")
    return args


def job_target(spec: str, folder: Path) -> str:
    """The loaded target as `tandem-cli align --target` takes it: "demo", or a path (a file or folder
    as the user chose it, so "auto" finds the alignment under the same name; the loaded folder
    for other demo names)."""
    if spec == "demo" or Path(spec).expanduser().exists():
        return spec
    return str(folder)


def alignment_key(target: str) -> str:
    """The name the job records an alignment under (app/align/command.py): "demo" or the resolved path."""
    return target if target == "demo" else str(Path(target).expanduser().resolve())


class AlignJob(QObject):
    """One run of `tandem-cli align`. Exactly one of done/failed/cancelled ends it."""

    progress = Signal(dict)  # {"phase", "fraction", "eta_s", "message"}
    done = Signal(dict)  # the job's summary: folder, draft, kind, agreement, trial_before/after, card
    failed = Signal(str)  # its error message, or why it stopped
    cancelled = Signal(str)

    def __init__(self, args: list[str], threads: int, parent: QObject | None = None):
        super().__init__(parent)
        self.args, self.threads = args, threads
        self.process = QProcess(self)
        self._stdout = b""
        self._stderr = b""
        self._last: dict | None = None  # the last done/cancelled/error event
        self._cancel_asked = False
        self._ended = False
        self._phase = ""  # the last progress line's
        self._stuck = QTimer(self)  # started by Cancel: a child still running when it fires is killed
        self._stuck.setSingleShot(True)
        self._stuck.timeout.connect(self._kill_if_stuck)
        self.paused = False
        self.process.readyReadStandardOutput.connect(self._read_stdout)
        self.process.readyReadStandardError.connect(self._read_stderr)
        self.process.finished.connect(self._finished)
        self.process.errorOccurred.connect(self._error)

    def start(self) -> None:
        program, *first = cli_program()
        environment = QProcessEnvironment.systemEnvironment()  # TANDEM_HOME and the rest, as they are now
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            environment.insert(name, str(self.threads))
        environment.insert("PYTHONUNBUFFERED", "1")
        self.process.setProcessEnvironment(environment)
        if not getattr(sys, "frozen", False):  # `-m app.cli` finds the package from its folder
            import app

            self.process.setWorkingDirectory(str(Path(app.__file__).resolve().parent.parent))
        self.process.start(program, [*first, *self.args])

    @property
    def running(self) -> bool:
        return not self._ended

    def cancel(self) -> None:
        if self._ended or self._cancel_asked:
            return
        self._cancel_asked = True
        if sys.platform == "win32":
            self.process.kill()  # nothing to catch a SIGTERM with; the next job removes the partial folder
            return
        self.process.terminate()
        self.pause(False)  # a stopped child holds its SIGTERM until it runs again
        self._stuck.start(CANCEL_KILL_MS)

    def _kill_if_stuck(self) -> None:
        if not self._ended and self._phase not in DRAFT_WRITTEN:
            self.process.kill()  # finished follows, and says "cancelled" (it was asked for)

    def pause(self, paused: bool) -> None:
        """Stop (True) or continue the child, POSIX only: an answer streams at full speed meanwhile."""
        pid = self.process.processId()
        if not CAN_PAUSE or self._ended or not pid or paused == self.paused:
            return
        if paused and self._cancel_asked:  # it is cleaning up after SIGTERM: let it finish
            return
        try:
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except OSError:  # it has just ended: finished comes next
            return
        self.paused = paused

    def stop_at_quit(self) -> None:
        """Tandem is quitting: cancel, give the child a moment, then kill it."""
        if self._ended:
            return
        self.cancel()
        if not self.process.waitForFinished(QUIT_WAIT_MS):
            self.process.kill()
            self.process.waitForFinished(QUIT_WAIT_MS)

    # The child's output

    def _read_stdout(self) -> None:
        self._stdout += bytes(self.process.readAllStandardOutput().data())
        *lines, self._stdout = self._stdout.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            event = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            return  # a library printed to stdout: not one of the job's events
        if not isinstance(event, dict):
            return
        if event.get("event") == "progress":
            self._phase = str(event.get("phase", ""))
            if not self._cancel_asked:  # the strip says "Cancelling" until the job ends, not a step's progress
                self.progress.emit(event)
        elif event.get("event") in ("done", "cancelled", "error"):
            self._last = event

    def _read_stderr(self) -> None:
        self._stderr = (self._stderr + bytes(self.process.readAllStandardError().data()))[-STDERR_KEPT:]

    def last_stderr_line(self) -> str:
        text = self._stderr.decode("utf-8", "replace").replace("\r", "\n")
        lines = [line.strip() for line in text.split("\n") if line.strip()]
        return lines[-1] if lines else ""

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read_stdout()
        if self._stdout.strip():
            self._line(self._stdout)
            self._stdout = b""
        self._read_stderr()
        event = self._last or {}
        kind = event.get("event")
        if kind == "done" and code == 0 and status == QProcess.ExitStatus.NormalExit:
            self._end(self.done, event)
        elif kind == "cancelled" or (self._cancel_asked and kind != "error"):
            self._end(self.cancelled, event.get("message") or "Alignment cancelled: nothing was saved.")
        elif kind == "error":
            self._end(self.failed, event.get("message") or "The alignment failed.")
        else:
            how = "crashed" if status == QProcess.ExitStatus.CrashExit else f"stopped (exit code {code})"
            last = self.last_stderr_line()
            self._end(self.failed, f"The alignment {how} before it finished; nothing was saved."
                      + (f" Its last words: {last}" if last else ""))

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._end(self.failed, f"Could not start the alignment ({cli_program()[0]}): "
                      f"{self.process.errorString()}")

    def _end(self, signal_, value) -> None:
        if self._ended:
            return
        self._ended = True
        self.paused = False
        self._stuck.stop()
        signal_.emit(value)
