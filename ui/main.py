"""`tandem`: the desktop window."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem")
    parser.add_argument("--model", default="demo", help='model folder, .gguf, or "demo"')
    parser.add_argument("--backend", choices=["mlx", "torch"], default="")
    parser.add_argument("--max-tokens", type=int, default=256)
    args, qt_args = parser.parse_known_args(argv)

    from PySide6.QtWidgets import QApplication

    from ui.main_window import MainWindow

    app = QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    window = MainWindow(model=args.model, backend=args.backend, max_tokens=args.max_tokens)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
