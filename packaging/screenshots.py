"""The README's screenshots: the real Tandem window on the offline demo, with an answer and the side panel.

Not a measurement: it opens MainWindow on the demo pair (PyTorch, the GGUF with prompt lookup, as
`make run` does), waits until the pair has loaded, the target alone has been timed and the pair
trial has ended, asks two short questions (so the target alone is timed after each answer too),
then the bench suite's poem prompt at temperature 0, and saves the whole window once that answer
is done.

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/screenshots.py [--dark]

writes docs/images/window.png (1400x900, the light theme) and, with --dark, also
docs/images/window-dark.png (a second process: the theme is read once per application). The demo
model is read from the user cache (`make run` or `tandem-cli demo` provisions it); everything the
window writes (history, settings, pairs.json, Qt's and platformdirs' folders) goes to a temporary
folder, never the user's own. Its figures are whatever this machine measures while it runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.align_screenshots import wait_until  # noqa: E402 (the same event-loop wait)

# the poem prompt of benchmarks/suite.json: the demo copies it, so prompt lookup drafts long runs
# that the target accepts, beside rejected drafts and tokens of the target's own
PROMPT = """Repeat this poem exactly, then give it a title:

The rain falls soft on the quiet town,
the lamps are lit as the sun goes down,
the children run through the puddles home,
and the old cat sleeps by the garden stone.

The baker shuts his yellow door,
the sweeper finishes the floor,
the last bus hums along the hill,
and all the busy streets are still.

The river carries the evening light
past the bridge and into the night,
and somewhere a window, warm and wide,
keeps a lamp for the ones outside."""
# short questions asked first: chats in the list, and the target alone timed after each answer, so
# the speedup is against a median of several timings, not the first one (taken while the freshly
# loaded model is still cold)
WARM_UP = ("What is the capital of France?", "Why is the sky blue? Explain it to a curious twelve-year-old.")


def private_folders() -> Path:
    """Every user folder the window or a library might write to points into a scratch folder; the
    model cache stays the user's, so the demo converted once is found."""
    from app.paths import cache_dir

    os.environ.setdefault("TANDEM_CACHE", str(cache_dir()))
    scratch = Path(tempfile.mkdtemp(prefix="tandem-screenshots-"))
    os.environ["TANDEM_HOME"] = str(scratch / "home")
    for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "HF_HOME"):
        os.environ[name] = str(scratch / name.lower())
    os.environ.pop("HF_TOKEN", None)
    return scratch


def settle(app, seconds: float) -> None:
    wait_until(app, lambda: False, seconds)


def ask(app, window, text: str, finished: list | None = None) -> str | None:
    """`text` in a new chat; None once its answer has finished, else why not."""
    finished = [] if finished is None else finished
    window.new_chat()
    window.controller.answer_finished.connect(finished.append)
    try:
        if not window.send(text):
            return f"“{text[:40]}” was not sent"
        if not wait_until(app, lambda: bool(finished), 600):
            return f"the answer to “{text[:40]}” did not finish"
    finally:
        window.controller.answer_finished.disconnect(finished.append)
    return None


def shoot(app, scratch: Path, out: Path, size: tuple[int, int], model: str, max_tokens: int) -> str | None:
    """One window, one answer, one PNG; None when it was saved, else why not."""
    from PySide6.QtCore import QSettings

    from app.chat.settings import ChatSettings
    from app.draft_choice import AUTO_DRAFT
    from ui.main_window import MainWindow

    folder = Path(tempfile.mkdtemp(dir=scratch))
    window = MainWindow(model=model, backend="torch", draft=AUTO_DRAFT, history_path=folder / "history.sqlite3",
                        settings=QSettings(str(folder / "tandem.ini"), QSettings.Format.IniFormat),
                        chat_defaults=ChatSettings(temperature=0.0, max_tokens=max_tokens))
    try:
        window.resize(*size)
        window.show()
        window.side_panel_action.setChecked(True)
        window.side_panel_host.setVisible(True)
        if not wait_until(app, window.composer.can_send, 300):
            return "the pair did not load"
        # the speedup needs the target alone's timing; the trial's figure shows under the draft's name
        if not wait_until(app, lambda: window.draft_panel.baseline is not None, 300):
            return "the target alone was never timed"
        wait_until(app, lambda: not window.pairing.trial_running, 300)
        settle(app, 1.0)
        for question in WARM_UP:
            timed = len(window.draft_panel.baseline.samples)
            if (problem := ask(app, window, question)) is not None:
                return problem
            # the timing after an answer gives way to the next message: let it finish first
            wait_until(app, lambda timed=timed: len(window.draft_panel.baseline.samples) > timed, 120)
        finished = []
        if (problem := ask(app, window, PROMPT, finished)) is not None:
            return problem
        settle(app, 2.0)  # the panel's last rounds and graphs
        out.parent.mkdir(parents=True, exist_ok=True)
        image = window.grab().toImage()
        if not image.save(str(out)):
            return f"could not write {out}"
        stats = finished[0]
        print(f"{out}: {image.width()}x{image.height()}, {stats.tokens} tokens, "
              f"{stats.tokens_per_s:.1f} tok/s")
        return None
    finally:
        window.close()
        settle(app, 0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder for the PNGs")
    parser.add_argument("--model", default="demo", help='the target (default "demo")')
    parser.add_argument("--size", default="1400x900", help="the window's size")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--theme", choices=["light", "dark"], default="light", help="the theme (default light)")
    parser.add_argument("--name", default="", help="the PNG's name (default window.png, window-dark.png in dark)")
    parser.add_argument("--dark", action="store_true", help="also window-dark.png, in the dark theme")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x"))
    name = args.name or ("window-dark.png" if args.theme == "dark" else "window.png")

    scratch = private_folders()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["TANDEM_THEME"] = args.theme  # read once per application: a second theme is a second process
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    try:
        problem = shoot(app, scratch, args.out / name, size, args.model, args.max_tokens)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if problem is not None:
        print(f"{name}: {problem}", file=sys.stderr)
        return 1
    if args.dark and args.theme != "dark":
        import subprocess

        return subprocess.call([sys.executable, __file__, "--out", str(args.out), "--model", args.model,
                                "--size", args.size, "--max-tokens", str(args.max_tokens), "--theme", "dark"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
