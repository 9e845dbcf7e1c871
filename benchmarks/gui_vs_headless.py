"""Does the window slow generation down? GUI tokens/s against headless tokens/s, same process.

Opens the real main window (offscreen unless a display is set), loads a pair, and then, after
one warm-up of each, alternates A B B A: an answer written through the window (streamed into
the chat view, rendered, side panel live) and the same request iterated headlessly from the
same runner, exactly as `tandem-cli generate` consumes it. Both read the engine's own decode
throughput (tokens after the first over the wall clock from the first token to the last), so
the ratio is of the consumers, on the same models, adaptive state and machine minute.

    python benchmarks/gui_vs_headless.py --model demo --backend torch --repeats 4

The headless half runs on the worker's own thread, as the window's answers do: driving torch
from a second thread gives it a second OpenMP pool, and two pools on two cores slow each other
down by a third, which would measure the threads instead of the window.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_window import add_window_arguments, open_window, wait  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_window_arguments(parser, max_tokens=256)
    parser.add_argument("--repeats", type=int, default=4, help="A B B A pairs after the warm-up")
    parser.add_argument("--panel", action="store_true", help="show the side panel (draft activity) while it runs")
    parser.add_argument("--shot", help="save a screenshot of the window after the last GUI answer")
    args = parser.parse_args()

    from PySide6.QtCore import QObject, Signal, Slot

    from app.engine.events import Finished
    from app.engine.sampling import SamplingParams
    from app.runner import ChatRequest

    app, window = open_window(args)
    if args.panel != window.side_panel_action.isChecked():
        window.side_panel_action.trigger()

    wait(lambda: window.composer.can_send())
    runner = window.worker.runner
    if runner.loaded is None:
        print("the model did not load", file=sys.stderr)
        return 1
    print(f"loaded {runner.loaded.describe()}", file=sys.stderr)

    def gui() -> float:
        window.new_chat()
        window.send(args.prompt)
        wait(lambda: not window.controller.busy)
        return window.store.messages(window.controller.current.id)[-1].stats["tokens_per_s"]

    def headless_here() -> float:
        request = ChatRequest(({"role": "user", "content": args.prompt},), max_tokens=args.max_tokens,
                              params=SamplingParams(temperature=0.0))
        # through the runner's service, as the CLI's requests go: the runner is the service thread's
        # alone (a call from here raced the window's background timing of the target alone)
        for event in window.worker.service.submit(request, client="headless").events():
            if isinstance(event, Finished):
                return event.stats.tokens_per_s
        raise RuntimeError("no Finished event")

    class HeadlessJob(QObject):
        """Runs headless_here() on the worker's thread."""

        start = Signal()

        def __init__(self):
            super().__init__()
            self.result: float | None = None

        @Slot()
        def run(self) -> None:
            self.result = headless_here()

    job = HeadlessJob()
    job.moveToThread(window.thread)
    job.start.connect(job.run)

    def headless() -> float:
        job.result = None
        job.start.emit()
        wait(lambda: job.result is not None)
        return job.result

    gui(), headless()  # warm-up: adaptive k settles, caches and allocators warm
    figures: dict[str, list[float]] = {"gui": [], "headless": []}
    for _ in range(args.repeats):
        for name, run in (("gui", gui), ("headless", headless), ("headless", headless), ("gui", gui)):
            figures[name].append(run())
            print(f"{name:9s} {figures[name][-1]:6.2f} tok/s", file=sys.stderr, flush=True)
    if args.shot:
        window.grab().save(args.shot)
    window.close()
    med = {name: statistics.median(values) for name, values in figures.items()}
    for name, values in figures.items():
        print(f"{name:9s} median {med[name]:6.2f} tok/s  [{min(values):.2f}-{max(values):.2f}]  n={len(values)}")
    print(f"GUI / headless: {med['gui'] / med['headless']:.3f} (medians); "
          f"worst GUI / best headless {min(figures['gui']) / max(figures['headless']):.3f}")
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
