"""Ctrl+C (SIGINT) and SIGTERM to `tandem-cli generate` (app/exit_signals.py): in the middle of
a long prompt's prefill (6,000 tokens, where a signal once aborted the process after 10 s) the
command ends within a generous bound, with the shell's exit code and no traceback or abort. One
process per signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.signals import kill_if_running, signal_and_wait

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 20  # a behaviour bound (the process ends), not a speed figure

ABORTS = ("Traceback", "terminate called", "Event loop is closed", "Fatal Python error")


def _start(args: list[str], env_extra: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, **env_extra, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, needle: str, limit_s: float = 120) -> list[str]:
    """stderr lines up to the one holding `needle` (the process keeps running)."""
    lines, end = [], time.monotonic() + limit_s
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never printed {needle!r}: {''.join(lines)[-2000:]}")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_long_prefill_ends_the_command_cleanly(sig, code, demo):
    # ~6,000 prompt tokens: a dozen prefill chunks of the demo, several seconds on this CPU
    prompt = " ".join(f"w{i % 97}" for i in range(1800))
    proc = _start(["generate", "--backend", "torch", "--model", "demo", "--draft", "none", "--prompt", prompt,
                   "--max-tokens", "1000", "--context", "8192"], {"TANDEM_HOME": os.environ["TANDEM_HOME"]})
    try:
        _wait_for_line(proc, "Loaded ")
        time.sleep(0.5)  # the prefill is under way (it takes seconds); the signal lands inside it
    except BaseException:
        kill_if_running(proc)
        raise
    err, took = signal_and_wait(proc, sig, BOUND_S)
    assert proc.returncode == code, err[-2000:]
    assert not any(a in err for a in ABORTS), err[-2000:]
    assert took < BOUND_S
