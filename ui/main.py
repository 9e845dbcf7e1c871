"""`tandem`: the desktop window."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem")
    parser.add_argument("--model", default="demo", help='model folder, .gguf, or "demo"')
    parser.add_argument("--draft", default="auto",
                        help='draft model folder or .gguf, "self:int4" (the target\'s own weights in int4), '
                             '"ngram" (prompt lookup), "none", or "auto" (default: the demo\'s measured best '
                             'draft, else prompt lookup)')
    parser.add_argument("--backend", choices=["mlx", "torch"], default="")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="max new tokens for new chats (default 1024; each chat can change it)")
    parser.add_argument("--history", default=None, metavar="PATH",
                        help="the chat history database (default: history.sqlite3 in the user data folder)")
    args, qt_args = parser.parse_known_args(argv)

    from PySide6.QtWidgets import QApplication

    from ui.main_window import MainWindow

    app = QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    window = MainWindow(model=args.model, backend=args.backend, draft=args.draft, history_path=args.history,
                        max_tokens=args.max_tokens)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
