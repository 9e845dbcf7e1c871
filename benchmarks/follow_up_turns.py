"""Time to first token on a late turn of a chat, with the caches kept from the turn before
(app/engine/reuse.py) and from empty caches, same runner, same process, interleaved.

A fixed conversation (the suite's prompts as user messages, the model's own answers at
temperature 0, 64 tokens at most each) is built turn by turn through `Runner.chat`, as the window
and the CLI use it. Then, repeatedly and alternating: turn N answered after turn N - 1 left its
caches (the follow-up a user makes), and turn N answered from empty caches (what Tandem did
before). Time to first token is wall clock from the request to the first token's event: rendering
the chat template, tokenizing and the prefill.

    python benchmarks/follow_up_turns.py --model demo --backend torch --turns 10 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suite.json"


def _answer(runner, messages, max_tokens):
    """(time to first token, the answer's text, its Finished event) of one request."""
    from app.engine.events import Finished, Round
    from app.engine.sampling import SamplingParams
    from app.runner import ChatRequest

    request = ChatRequest(tuple(messages), max_tokens=max_tokens, params=SamplingParams(temperature=0.0))
    start, first, finished = time.perf_counter(), None, None
    for event in runner.chat(request):
        if first is None and isinstance(event, Round) and event.emitted:
            first = time.perf_counter() - start
        if isinstance(event, Finished):
            finished = event
    return first, finished.text, finished


def _forget(runner) -> None:
    """Empty caches: what every turn started from before the caches were kept."""
    runner.target.reset()
    backend = getattr(runner.drafter, "backend", None)
    if backend is not None:
        backend.reset()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", choices=["mlx", "torch"], default=None)
    parser.add_argument("--turns", type=int, default=10, help="the turn whose first token is timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64, help="each earlier answer's length")
    args = parser.parse_args()

    from app.draft_choice import DraftChoice
    from app.runner import Runner

    prompts = [p["user"] for p in json.loads(SUITE.read_text())["prompts"]]
    runner = Runner()
    draft = DraftChoice.parse_loadable(args.draft)
    loaded = runner.load(args.model, args.backend, draft=draft, progress=lambda m: None)
    print(f"{loaded.describe()}")
    messages = []
    for turn in range(args.turns - 1):
        messages.append({"role": "user", "content": prompts[turn % len(prompts)]})
        _, text, _ = _answer(runner, messages, args.max_tokens)
        messages.append({"role": "assistant", "content": text})
    earlier, last = messages[:-2], messages[-2]
    follow_up = [*messages, {"role": "user", "content": "Thank you. Now say it again in one sentence."}]
    kept, empty, reused = [], [], 0
    for _ in range(args.repeats):
        _answer(runner, [*earlier, last], args.max_tokens)  # turn N - 1 again: its caches, as a user left them
        seconds, _, finished = _answer(runner, follow_up, 1)
        kept.append(seconds)
        reused = finished.stats.reused_tokens
        _forget(runner)
        seconds, _, finished = _answer(runner, follow_up, 1)
        empty.append(seconds)
    prompt = finished.stats.prompt_tokens
    k, e = statistics.median(kept), statistics.median(empty)
    print(f"turn {args.turns}: {prompt} prompt tokens, {reused} of them kept from turn {args.turns - 1}")
    print(f"time to first token, caches kept:  {k * 1000:.0f} ms [{min(kept) * 1000:.0f}-{max(kept) * 1000:.0f}]")
    print(f"time to first token, empty caches: {e * 1000:.0f} ms [{min(empty) * 1000:.0f}-{max(empty) * 1000:.0f}]")
    print(f"kept caches answer {e / k:.1f}x sooner")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
