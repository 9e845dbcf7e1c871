"""How often a draft head's first draft is taken, in the engine: the demo (or another target) with
the head at k = 1, greedy, on the bench suite's prompts and on the built-in asks alignment holds
out (app/align/prompts.held_out), counted over the rounds the head drafted (prompt lookup beside it
drafts the others). Not a timing: acceptance does not depend on the clock.

    python benchmarks/head_acceptance.py                       # the shipped demo head
    python benchmarks/head_acceptance.py --head /path/to/aligned-head --asks 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--head", type=Path, default=None, help="an aligned head's folder (default: the demo's)")
    parser.add_argument("--asks", type=int, default=8, help="held-out built-in asks to answer")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    from app.align.prompts import builtin_prompts, held_out
    from app.draft_choice import DraftChoice
    from app.engine.events import Round
    from app.engine.sampling import SamplingParams
    from app.models.demo import demo_head
    from app.runner import ChatRequest, Runner

    head = DraftChoice.head(str(args.head)) if args.head else demo_head()
    suite = [p["user"] for p in json.loads((ROOT / "benchmarks" / "suite.json").read_text())["prompts"]]
    asks = [p for p in builtin_prompts() if held_out(p)][: args.asks]
    runner = Runner()
    runner.load(args.model, "torch", draft=head, progress=lambda message: None)
    for name, prompts in (("bench suite", suite), ("held-out built-in asks", asks)):
        drafted = taken = 0
        for prompt in prompts:
            request = ChatRequest(({"role": "user", "content": prompt},), max_tokens=args.max_tokens,
                                  params=SamplingParams(temperature=0.0), draft_tokens=1)
            for event in runner.chat(request):
                if isinstance(event, Round) and event.source == "mtp":
                    drafted += 1
                    taken += event.accepted >= 1
        print(f"{name}: {len(prompts)} prompts, the head's first draft taken {taken} of {drafted} "
              f"({taken / max(drafted, 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
