"""A/B in one process: what the cache protocol's checkpoint/rewind costs a plain (attention-only)
pair, against the rollback it replaced (a bare trim of both caches after each round).

The engine now takes a checkpoint of the target's cache before every verify pass and rewinds
to it after (app/engine/cache.py), and a draft model does the same around every proposal; on
attention-only caches both come down to a trim, as before. B swaps in the path from before the
protocol (the target trimmed to base + 1 + accepted, the draft to its committed prefix), on the
same runner and the same prompts, alternating A B B A, so that only the rollback differs.

    python benchmarks/state_path_ab.py --model demo --backend torch --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time


@contextlib.contextmanager
def trim_only_rollback():
    """The rollback as it was before the cache protocol: trims, no checkpoints."""
    from app.engine import drafters, speculative
    from app.engine.speculative import Verified

    def verify_round(target, committed, proposal, params, want_state=False):
        base = target.cache_len
        verdict = None
        start = time.perf_counter()
        try:
            verdict = target.verify([committed[-1], *proposal.ids], proposal, params)
        finally:
            target.truncate(base + 1 + verdict.accepted if verdict is not None else base)
        return Verified(verdict, time.perf_counter() - start, 0.0, 0)

    def propose(self, committed, k, params, should_stop=None):
        start = time.perf_counter()
        ids, p, probs, ids_array = self.backend.draft(list(committed[self.backend.cache_len:]), k, params, should_stop)
        return drafters.Proposal(ids, p, probs, ids_array, time.perf_counter() - start, "model")

    def accepted(self, committed, proposal, n_accepted, state=None):
        self.backend.truncate(min(self.backend.cache_len, len(committed) - 1))

    saved = (speculative.verify_round, drafters.ModelDrafter.propose, drafters.ModelDrafter.accepted)
    speculative.verify_round = verify_round
    drafters.ModelDrafter.propose, drafters.ModelDrafter.accepted = propose, accepted
    try:
        yield
    finally:
        speculative.verify_round, drafters.ModelDrafter.propose, drafters.ModelDrafter.accepted = saved


def _decode(runner, prompt_ids, max_tokens):
    """(tokens, decode tokens/s, rollback seconds per round) of one answer."""
    from app.engine.events import Finished, Round
    from app.engine.speculative import generate

    tokens, rollback = [], 0.0
    for event in generate(runner.target, runner.tokenizer.decode, prompt_ids, drafter=runner.drafter,
                          stop_ids=runner.tokenizer.stop_ids, max_tokens=max_tokens):
        if isinstance(event, Round):
            tokens.extend(event.emitted)
            rollback += event.rollback_s
        elif isinstance(event, Finished):
            s = event.stats
            return tokens, s.decode_tokens / s.decode_s, rollback / max(s.rounds, 1)
    raise RuntimeError("the answer did not finish")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", choices=["mlx", "torch"], default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from app.bench.suite import load_suite
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    runner = Runner()
    loaded = runner.load(args.model, args.backend, draft=DraftChoice.parse_loadable(args.draft), progress=print)
    print(f"target {loaded.folder.name} ({loaded.dtype}), draft {runner.drafter.name if runner.drafter else 'none'}")
    prompts = [runner.tokenizer.render_chat(list(p.messages)) for p in load_suite(prompts=args.prompts)]
    _decode(runner, prompts[0], 8)  # warm-up
    with trim_only_rollback():
        _decode(runner, prompts[0], 8)
    rates = {"A": [], "B": []}
    rollback_ms = []
    for repeat in range(args.repeats):
        for order in (("A", "B"), ("B", "A")):
            for which in order:
                tokens_all, seconds_all = 0, 0.0
                for ids in prompts:
                    with trim_only_rollback() if which == "B" else contextlib.nullcontext():
                        tokens, rate, rollback = _decode(runner, ids, args.max_tokens)
                    tokens_all += len(tokens) - 1
                    seconds_all += (len(tokens) - 1) / rate if rate else 0.0
                    if which == "A":
                        rollback_ms.append(rollback * 1000)
                rates[which].append(tokens_all / seconds_all)
                print(f"repeat {repeat + 1} {which}: {rates[which][-1]:.1f} tok/s")
    ratios = [a / b for a, b in zip(rates["A"], rates["B"], strict=True)]
    print(f"\nA (checkpoint/rewind) {statistics.median(rates['A']):.1f} tok/s, "
          f"B (trim only) {statistics.median(rates['B']):.1f} tok/s; "
          f"A/B {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} pairs; "
          f"A's rollback {statistics.median(rollback_ms):.3f} ms per round (median over answers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
