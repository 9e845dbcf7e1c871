"""Screenshots of Align draft in the window: the job in progress, then its result card.

Not a measurement: it loads a pair, runs a short real alignment of its target (a few answers, a
few steps, one thread) and saves the whole window twice as PNG.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/align_screenshots.py /tmp/shots
    xvfb-run -a .venv/bin/python benchmarks/align_screenshots.py /tmp/shots --model <folder>

writes align_prompting.png (the target writing its own asks), align_progress.png (during
training) and align_card.png (the card) into the folder given.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def wait_until(app, predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    return predicate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for align_progress.png and align_card.png")
    parser.add_argument("--model", default="demo", help='the target (default "demo")')
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--self-prompts", type=int, default=8, help="asks the target writes itself first")
    parser.add_argument("--size", default="1280x800", help="the window's size")
    args = parser.parse_args()

    import os

    from app.paths import cache_dir

    scratch = Path(tempfile.mkdtemp(prefix="tandem-shots-"))
    # the models already converted stay where they are; what the job writes (the aligned draft,
    # pairs.json) goes to a scratch folder, never the user's own
    os.environ["TANDEM_CACHE"] = str(cache_dir())
    os.environ["TANDEM_HOME"] = str(scratch)

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.draft_choice import AUTO_DRAFT
    from ui.main_window import MainWindow
    from ui.pairing.align_job import AlignOptions

    app = QApplication.instance() or QApplication(sys.argv)
    window = MainWindow(model=args.model, backend="torch", draft=AUTO_DRAFT, history_path=scratch / "history.sqlite3",
                        settings=QSettings(str(scratch / "tandem.ini"), QSettings.Format.IniFormat))
    width, height = (int(n) for n in args.size.split("x"))
    window.resize(width, height)
    window.show()
    if not wait_until(app, window.composer.can_send, 300):
        print("the pair did not load", file=sys.stderr)
        return 1
    window.aligner.options = AlignOptions(prompts=args.prompts, steps=args.steps, max_tokens=args.max_tokens,
                                          batch=8, threads=1, self_prompts=args.self_prompts)
    phases = []
    window.aligner.start("head")
    window.aligner.job.progress.connect(lambda event: phases.append(event["phase"]))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.self_prompts and wait_until(app, lambda: "prompting" in phases or not window.aligner.running, 300):
        wait_until(app, lambda: False, 1.0)
        window.grab().save(str(args.out / "align_prompting.png"))
    if not wait_until(app, lambda: "training" in phases or not window.aligner.running, 600):
        print("the job did not reach training", file=sys.stderr)
        return 1
    wait_until(app, lambda: False, 1.0)  # a later step's figures and the time left
    window.grab().save(str(args.out / "align_progress.png"))
    if not wait_until(app, lambda: not window.aligner.running, 900):
        print("the job did not finish", file=sys.stderr)
        return 1
    # a draft that measured faster is paired at once: the card is taken once that pair has loaded
    wait_until(app, lambda: window.header.target_slot.name.text() != "Loading…" and window.composer.can_send()
               and not window.pairing.trial_running, 300)
    wait_until(app, lambda: False, 0.5)
    window.grab().save(str(args.out / "align_card.png"))
    print(f"{window.align_strip.card_title.text()}\n{window.align_strip.card_note.text()}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
