"""The theme's cases (tests/isolated/theme_choice_cases.py) in a process of their own: a theme is
the application's, and changing it restyles every widget alive in the process. In a test worker
that means windows other files left behind; restyling them, or closing them first, crashed CI
workers with a segfault. A fresh process holds only the windows these cases make."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

CASES = Path(__file__).resolve().parent / "isolated" / "theme_choice_cases.py"


def test_the_theme_cases_pass_in_a_process_of_their_own():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                          cwd=CASES.parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("3 passed"), summary  # every case ran, none skipped
