"""The real main window for the benchmark scripts: offscreen unless a display is set, on a
fresh history, settings and recent pairs (the user's own are never written), greedy, and a way
to wait while its event loop runs."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

DEFAULT_PROMPT = ("Write a Python function that checks whether a string is a palindrome, "
                  "with a docstring and two examples.")


def add_window_arguments(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    parser.add_argument("--model", default="demo")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=max_tokens)


def open_window(args: argparse.Namespace):
    """(application, window) with the pair of `args` loading; greedy answers of --max-tokens."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.chat.settings import ChatSettings
    from app.draft_choice import DraftChoice

    app = QApplication.instance() or QApplication([])
    from ui.main_window import MainWindow

    root = tempfile.mkdtemp(prefix="tandem-bench-")
    # the user's data (recent pairs, history) stays untouched; the models come from their cache
    from app.paths import cache_dir

    os.environ.setdefault("TANDEM_CACHE", str(cache_dir()))
    os.environ["TANDEM_HOME"] = root
    window = MainWindow(model=args.model, backend=args.backend, draft=DraftChoice.parse_loadable(args.draft),
                        history_path=Path(root) / "history.sqlite3",
                        settings=QSettings(f"{root}/settings.ini", QSettings.Format.IniFormat),
                        chat_defaults=ChatSettings(temperature=0.0, max_tokens=args.max_tokens))
    window.resize(1440, 900)
    window.show()
    return app, window


def wait(predicate, timeout_s: float = 900.0) -> None:
    """Run the event loop until `predicate()` holds (or the timeout passes)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop, end = QEventLoop(), time.monotonic() + timeout_s
    timer = QTimer()
    timer.timeout.connect(lambda: (predicate() or time.monotonic() > end) and loop.quit())
    timer.start(20)
    if not predicate():
        loop.exec()
    timer.stop()
