"""Does the side panel's speedup tell the truth? Its figure against a race of the same prompt.

Opens the real main window (offscreen unless a display is set) on a pair, asks a question
and reads the speedup the panel shows at the end of the answer (baseline seconds per token,
measured when the pair loaded, over the answer's); then races the same question (the target
alone, then speculatively) and reads the measured ratio. Repeats, alternating.

    python benchmarks/panel_vs_race.py --model demo --backend torch --repeats 3
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
    add_window_arguments(parser, max_tokens=160)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    app, window = open_window(args)

    panel = window.draft_panel
    wait(lambda: window.composer.can_send() and panel.baseline is not None)
    print(f"loaded {window.worker.runner.loaded.describe()}; target alone "
          f"{1 / panel.baseline[0]:.1f} tok/s at {panel.baseline[1]} tokens of context", file=sys.stderr)
    results: dict[str, list[float]] = {"panel": [], "race": []}
    window.new_chat()
    window.send(args.prompt)  # warm-up: adaptive k settles as it would in a chat
    wait(lambda: not window.controller.busy)
    for _ in range(args.repeats):
        window.new_chat()
        if not window.send(args.prompt):
            raise RuntimeError("the window did not take the question")
        wait(lambda: not window.controller.busy)
        results["panel"].append(panel.trace.figures().speedup)
        shown = panel.tiles["speedup"].value.text()
        window.start_race()
        wait(lambda: not window.controller.busy)
        summary = window.race_dialog.summary.text()
        ratio = float(summary.split("<b>")[1].split("×")[0])
        results["race"].append(ratio)
        f = panel.trace.figures()
        race = window.race_dialog.stats[0].text(), window.race_dialog.stats[1].text()
        print(f"panel shows {shown} (baseline {1 / panel.trace.baseline_s_per_token:.1f} tok/s, answer "
              f"{f.tokens_per_s:.1f} tok/s) · race measured {ratio:.2f}x ({race[0].split(' · ')[1]} alone, "
              f"{race[1].split(' · ')[1]} speculative) · "
              f"{'identical' if 'identical' in summary else 'DIFFERENT'}", file=sys.stderr, flush=True)
        window.race_dialog.close()
    window.close()
    panel_med, race_med = statistics.median(results["panel"]), statistics.median(results["race"])
    print(f"panel speedup median {panel_med:.2f}x {sorted(round(x, 2) for x in results['panel'])}; "
          f"race median {race_med:.2f}x {sorted(round(x, 2) for x in results['race'])}; "
          f"panel / race {panel_med / race_med:.3f}")
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
