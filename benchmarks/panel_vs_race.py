"""Does the side panel's speedup tell the truth? Its figure against a race of the same prompt.

Opens the real main window (offscreen unless a display is set) on a pair and, for each prompt
(the welcome screen's starters unless --prompt is given), sends it in a new chat and reads the
speedup card at the end of the answer: the median and range over the timings of the target alone
at the answer's settings and context (app/chat/baseline.py). Then races the same question (the
target alone, then speculatively) and reads the measured ratio. Each line splits the difference
into its two halves: the target alone (the card's timings against the race's first side) and the
speculative answer (the chat's answer against the race's second side).

    python benchmarks/panel_vs_race.py --model demo --backend torch --repeats 2 --max-tokens 96

Never run it beside another timing: on 2 cores two busy programs slow each other several times over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_window import add_window_arguments, open_window, wait  # noqa: E402


def shoot(app, window, stem: Path) -> None:
    """The window at 1400x900 and 900x600 with its card, and the race dialog over it."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    size = window.size()
    for width, height in ((1400, 900), (900, 600)):
        window.resize(width, height)
        wait(lambda: False, 0.3)
        window.grab().save(f"{stem}-window-{width}.png")
    window.race_dialog.grab().save(f"{stem}-race.png")
    window.resize(size)
    app.processEvents()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_window_arguments(parser, max_tokens=96)
    parser.add_argument("--repeats", type=int, default=2, help="answers and races of each prompt")
    parser.add_argument("--pause", type=float, default=4.0,
                        help="seconds after each answer and race, as a reader takes (the target alone is timed then)")
    parser.add_argument("--shots", type=Path, help="a folder for renders of the window and the race after each race")
    parser.set_defaults(prompt=None)
    args = parser.parse_args()

    from ui.chat.starters import STARTERS

    prompts = [(args.prompt[:24], args.prompt)] if args.prompt else list(STARTERS)
    app, window = open_window(args)
    panel = window.draft_panel
    wait(lambda: window.composer.can_send() and panel.baseline is not None)
    print(f"loaded {window.worker.runner.loaded.describe()}; {panel.baseline.describe()}", file=sys.stderr)

    rows = []  # (card median, low, high, race ratio, alone: card / race, answer / race speculative)
    for title, prompt in prompts:
        window.new_chat()
        window.send_starter(prompt)  # warm-up, as the user's first answer: adaptive k learns its costs
        wait(lambda: not window.controller.busy)
        wait(lambda: False, args.pause)
        for _ in range(args.repeats):
            window.new_chat()
            if not window.send_starter(prompt):
                raise RuntimeError("the window did not take the question")
            wait(lambda: not window.controller.busy)
            wait(lambda: False, args.pause)
            trace = panel.trace
            figures = trace.figures()
            card, answer_tps = figures.speedup, figures.tokens_per_s
            if card is None:
                print(f"{title}: no speedup ({trace.unmeasured})", file=sys.stderr)
                continue
            races = []
            window.worker.race_done.connect(races.append)
            window.start_race()
            wait(lambda races=races: bool(races) and not window.controller.busy)
            window.worker.race_done.disconnect(races.append)
            if args.shots:
                shoot(app, window, args.shots / f"{len(rows)}-{title.split()[0].lower()}")
            window.race_dialog.close()
            wait(lambda: False, args.pause)
            race = races[0]
            alone_tps, spec_tps = race.alone.stats.tokens_per_s, race.speculative.stats.tokens_per_s
            card_alone, low_alone, high_alone = trace.baseline.tokens_per_s
            inside = card.low <= race.ratio <= card.high
            rows.append((card.median, card.low, card.high, race.ratio, card_alone / alone_tps, answer_tps / spec_tps))
            print(f"{title}: card {card.median:.2f}x [{card.low:.2f}-{card.high:.2f}] over {card.timings} timings, "
                  f"race {race.ratio:.2f}x ({'inside' if inside else 'outside'} the card's range, "
                  f"{'identical' if race.identical else 'DIFFERENT'}) | alone: card {card_alone:.1f} tok/s "
                  f"[{low_alone:.1f}-{high_alone:.1f}], race {alone_tps:.1f} | speculative: answer "
                  f"{answer_tps:.1f} tok/s ({figures.tokens_per_pass:.2f} tokens a pass), race {spec_tps:.1f} "
                  f"({race.speculative.stats.tokens_per_round:.2f})", file=sys.stderr, flush=True)
    window.close()
    app.processEvents()
    if not rows:
        print("no answer had a speedup to compare")
        return 1
    inside = sum(low <= ratio <= high for _, low, high, ratio, _, _ in rows)
    ratio = statistics.median(card / race for card, _, _, race, _, _ in rows)
    print(f"{len(rows)} answers: the race inside the card's range {inside} times; card / race median {ratio:.3f} "
          f"(alone: card / race {statistics.median(r[4] for r in rows):.3f}, speculative: answer / race "
          f"{statistics.median(r[5] for r in rows):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
