"""A screenshot of the window answering from a model on a server (docs/remote.md).

Not a measurement: it opens the window on the demo, switches the target to the server's model
(as the Target slot's "Model on a server…" does), asks a copying question at temperature 0 and
saves the whole window as PNG once the answer is in.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/remote_screenshot.py http://127.0.0.1:8000 /tmp/vllm.png
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.align_screenshots import wait_until  # noqa: E402 - the path first

QUESTION = ("Repeat this list exactly, twice: apples, pears, plums, cherries, grapes, lemons, limes, oranges, "
            "peaches, apricots.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="the server's address, as the dialog takes it")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--model", default=None, help="which of the server's models (default: its only one)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--size", default="1400x900", help="the window's size")
    args = parser.parse_args()

    from app.paths import cache_dir

    os.environ["TANDEM_CACHE"] = str(cache_dir())  # the demo as converted already; the rest in scratch
    os.environ["TANDEM_HOME"] = tempfile.mkdtemp(prefix="tandem-shot-")

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.chat.settings import ChatSettings
    from app.remote.client import RemoteClient
    from app.remote.endpoint import parse_endpoint
    from ui.main_window import MainWindow
    from ui.pairing.remote_dialog import RemoteChoice

    app = QApplication.instance() or QApplication(sys.argv)
    home = Path(os.environ["TANDEM_HOME"])
    window = MainWindow(model="demo", history_path=home / "history.sqlite3",
                        settings=QSettings(str(home / "tandem.ini"), QSettings.Format.IniFormat))
    width, height = (int(n) for n in args.size.split("x"))
    window.resize(width, height)
    window.show()
    if not wait_until(app, window.composer.can_send, 300):
        print("the demo did not load", file=sys.stderr)
        return 1
    endpoint = parse_endpoint(args.address)
    model = args.model or RemoteClient(endpoint).models()[0].id
    window.pairing.choose_remote(RemoteChoice(endpoint.base, model))
    if not wait_until(app, lambda: window.controller.model is not None and window.controller.model.remote
                      and window.composer.can_send(), 120):
        print("the server's model did not load: " + " / ".join(window.banners.texts()), file=sys.stderr)
        return 1
    window.new_chat()
    window.controller.settings = ChatSettings(temperature=0.0, max_tokens=args.max_tokens)
    finished = []
    window.controller.answer_finished.connect(finished.append)
    window.send(QUESTION)
    if not wait_until(app, lambda: bool(finished), 600):
        print("no answer came", file=sys.stderr)
        return 1
    wait_until(app, lambda: False, 1.0)  # the panel's last refresh
    window.grab().save(str(args.out))
    print(f"{args.out}: {finished[0].summary()}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
