"""The window's start, as a user sees it: from launch to the window shown, to the model loaded, and
to the first token of a prompt on screen, with every loading line the window showed and when.

    python benchmarks/window_first_token.py [--model demo] [--shots DIR]

Offscreen unless a display is set, on a fresh history and settings (bench_window.py). Times are
wall seconds from the start of this process (the interpreter's own start before it, ~0.1 s, is not
counted). --shots saves the window while it loads (3 s after it is shown) and after the answer.
The first token comes after the window has timed the target alone once (its speedup's baseline).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_window import add_window_arguments, open_window, wait  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_window_arguments(parser, max_tokens=16)
    parser.add_argument("--shots", help="a folder for screenshots while loading and after the answer")
    args = parser.parse_args()
    shots = Path(args.shots) if args.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    at = lambda: time.perf_counter() - START  # noqa: E731
    app, window = open_window(args)
    shown = at()
    lines: list[tuple[float, str]] = []
    first_token: list[float] = []
    # (the load starts as the window opens: lines it said before this connection are not listed)
    window.worker.progress.connect(lambda message: lines.append((at(), message)))
    window.worker.text.connect(lambda text: first_token or first_token.append(at()))
    if shots:  # the window while it loads, 3 s after it is shown
        wait(lambda: window.composer.can_send() or at() - shown > 3.0, 600)
        if not window.composer.can_send():
            window.grab().save(str(shots / "loading.png"))
    wait(lambda: window.composer.can_send(), 900)
    loaded = at()
    runner = window.worker.runner
    if runner.loaded is None:
        print("the model did not load", file=sys.stderr)
        return 1
    window.send(args.prompt)
    wait(lambda: bool(first_token) or not window.controller.busy, 300)
    wait(lambda: not window.controller.busy, 300)
    if shots:
        window.grab().save(str(shots / "answered.png"))
    for when, message in lines:
        print(f"{when:6.2f} s  {message}")
    print(f"window shown {shown:.2f} s, model loaded {loaded:.2f} s, first token shown "
          f"{first_token[0] if first_token else float('nan'):.2f} s ({runner.loaded.describe()})")
    window.close()
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
