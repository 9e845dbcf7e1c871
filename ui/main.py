"""`tandem`: the desktop window."""

from __future__ import annotations

import argparse
import sys

from app.cli import MODEL, at_least_one, draft_choice, quiet_libraries


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()  # torchao's and torch's start-up lines are not the user's business (app/cli.py)
    parser = argparse.ArgumentParser(prog="tandem")
    # neither named: the pair used last loads again (its precision and context too), else the demo
    parser.add_argument("--model", default=None, type=MODEL,
                        help='model folder, .gguf, or "demo" (default: the pair used last, else the demo)')
    parser.add_argument("--draft", type=draft_choice, default=None,
                        help='draft model folder or .gguf, "self:int4" (the target\'s own weights in int4), '
                             '"mtp" (the checkpoint\'s own MTP layer), "assistant:<folder>" (a Gemma 4 assistant), '
                             '"eagle3:<folder or hub id>" (an EAGLE-3 head), "dflash:<folder or hub id>" (a DFlash '
                             'drafter), "ngram" (prompt lookup), "none", or "auto" (the measured best draft, else '
                             'prompt lookup; default: the pair used last, else "auto")')
    parser.add_argument("--backend", choices=["mlx", "torch"], default="")
    parser.add_argument("--max-tokens", type=at_least_one("new token"), default=None,
                        help="max new tokens for new chats (default 1024; each chat can change it)")
    parser.add_argument("--history", default=None, metavar="PATH",
                        help="the chat history database (default: history.sqlite3 in the user data folder)")
    parser.add_argument("--self-test", action="store_true",
                        help="load the demo pair, check that speculative decoding reproduces the target alone, "
                             "print one line and exit 0 (ok) or 1; needs no display")
    args, qt_args = parser.parse_known_args(argv)
    if args.self_test:
        from app.self_test import self_test

        if (problem := folders_problem()) is not None:
            print(f"tandem: {problem}", file=sys.stderr)
            return 1
        return self_test(backend=args.backend or None)

    from PySide6.QtWidgets import QApplication

    from PySide6.QtGui import QIcon

    from app.paths import asset

    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    app.setDesktopFileName("tandem")  # Wayland and docks match the window to tandem.desktop
    app.setWindowIcon(QIcon(str(asset("icons", "tandem-256.png"))))
    from ui.quit_signals import QuitOnSignals

    signals = QuitOnSignals(app)  # Ctrl+C and SIGTERM quit as the Quit menu does
    if (problem := folders_problem()) is not None:
        show_startup_error(problem)
        return 1

    from ui import window_state
    from ui.main_window import MainWindow

    window = MainWindow(model=args.model, backend=args.backend, draft=args.draft, history_path=args.history,
                        max_tokens=args.max_tokens, settings=window_state.open_settings())
    signals.window = window
    window.show()
    try:
        code = signals.exit_code(app.exec())
    finally:
        signals.uninstall()
    if not window.worker.engine_stopped:
        # the engine's thread is still inside a load: the history is closed and nothing is
        # pending, and an interpreter torn down around that thread could abort the process
        from app.exit_signals import leave_now

        leave_now(code, "tandem: quitting while a model was still loading; leaving it unfinished.")
    return code


def folders_problem() -> str | None:
    """Why Tandem's data or cache folder cannot be made, in words, or None. Checked before the
    window is built, so the user reads where and why instead of a traceback."""
    from app import paths

    try:
        paths.data_dir()
        paths.models_dir()
    except OSError as exc:  # paths.FolderError says where, why and what to do
        return str(exc)
    return None


def show_startup_error(message: str) -> None:
    """A dialog when Qt is up (a double-clicked app has no terminal), and stderr as well."""
    print(f"tandem: {message}", file=sys.stderr)
    from PySide6.QtWidgets import QApplication, QMessageBox

    if QApplication.instance() is not None:
        QMessageBox.critical(None, "Tandem cannot start", message)


if __name__ == "__main__":
    sys.exit(main())
