"""SIGTERM to the real app (`tandem`, offscreen, its own process): it quits as its Quit menu
does, within a generous bound, with the shell's exit code, no traceback, and its history whole.
(Ctrl+C mid-answer, storing exactly what was shown, is checked on the shared window in
tests/test_window.py, through the same handler.)"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.signals import kill_if_running, signal_and_wait

pytest.importorskip("pytestqt")

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 20  # a behaviour bound: the process ends


@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["SIGTERM"])  # SIGINT: tests/test_window.py's quit
def test_a_signal_quits_the_real_window_and_keeps_the_history(sig, demo, tmp_path):
    history = tmp_path / "history.sqlite3"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from ui.main import main; sys.exit(main())",
                             "--history", str(history), "--backend", "torch"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not history.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # polling a file another process makes: there is no event to wait on
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert history.exists(), "the window never opened its history"
    except BaseException:
        kill_if_running(proc)
        raise
    err, took = signal_and_wait(proc, sig, BOUND_S)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "terminate called" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert took < BOUND_S
    db = sqlite3.connect(history)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
