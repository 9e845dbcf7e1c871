"""A/B in one process: what the cache protocol's checkpoint/rewind costs a plain (attention-only)
pair, against the rollback it replaced (a bare trim of both caches after each round).

The engine now takes a checkpoint of the target's cache before every verify pass and rewinds
to it after (app/engine/cache.py), and a draft model does the same around every proposal; on
attention-only caches both come down to a trim, as before. B swaps in the path from before the
protocol (the target trimmed to base + 1 + accepted, the draft to its committed prefix), on the
same runner and the same prompts, alternating A B B A, so that only the rollback differs.

    python benchmarks/state_path_ab.py --model demo --backend torch --repeats 3

With --b model-replay, on a hybrid target on PyTorch, B is the whole-model replay instead: A
rebuilds recurrent state after a rollback with the recurrent layers alone (state_replay "layers",
the default), B passes the kept tokens through the whole model again (state_replay "model"), for
the target and a draft model alike (issue 18: keep the faster):

    python benchmarks/make_hybrid_target.py /tmp/hybrid
    python benchmarks/state_path_ab.py --model /tmp/hybrid --backend torch --draft self:int4 --b model-replay
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
    from app.engine.verified import Verified

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


def _replaying_backends(runner) -> list:
    """The target and the draft model (also inside lookup + model) that choose a state replay."""
    drafter = runner.drafter
    drafters = [drafter, getattr(drafter, "model", None)]
    found = [runner.target, *(getattr(d, "backend", None) for d in drafters)]
    return [backend for backend in found if hasattr(backend, "state_replay")]


@contextlib.contextmanager
def whole_model_replay(runner):
    """Recurrent state rebuilt by passing the kept tokens through the whole model (PyTorch's
    state_replay "model"), for this block only."""
    backends = _replaying_backends(runner)
    saved = [backend.state_replay for backend in backends]
    for backend in backends:
        backend.state_replay = "model"
    try:
        yield
    finally:
        for backend, mode in zip(backends, saved, strict=True):
            backend.state_replay = mode


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
    parser.add_argument("--b", choices=["trim", "model-replay"], default="trim",
                        help="what B is: the trim-only rollback (attention-only pairs), or the whole-model "
                             "replay of recurrent state against A's layer replay (hybrid targets, PyTorch)")
    args = parser.parse_args()

    from app.bench.suite import load_suite
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    runner = Runner()
    loaded = runner.load(args.model, args.backend, draft=DraftChoice.parse_loadable(args.draft), progress=print)
    print(f"target {loaded.folder.name} ({loaded.dtype}), draft {runner.drafter.name if runner.drafter else 'none'}")
    prompts = [runner.tokenizer.render_chat(list(p.messages)) for p in load_suite(prompts=args.prompts)]
    if args.b == "model-replay":
        backends = _replaying_backends(runner)
        if not any(backend.cache.replays_layers for backend in backends):
            parser.error("--b model-replay needs a hybrid model on PyTorch, uncompiled (no layer replay here)")
        print("A: layer replay; B: whole-model replay, on " +
              ", ".join(f"{b.folder.name}{'' if b.cache.replays_layers else ' (no recurrent layers)'}"
                        for b in backends))
        variant, names = (lambda: whole_model_replay(runner)), ("layer replay", "whole-model replay")
    else:
        variant, names = trim_only_rollback, ("checkpoint/rewind", "trim only")
    _decode(runner, prompts[0], 8)  # warm-up
    with variant():
        _decode(runner, prompts[0], 8)
    rates = {"A": [], "B": []}
    rollback_ms = {"A": [], "B": []}
    for repeat in range(args.repeats):
        for order in (("A", "B"), ("B", "A")):
            for which in order:
                tokens_all, seconds_all = 0, 0.0
                for ids in prompts:
                    with variant() if which == "B" else contextlib.nullcontext():
                        tokens, rate, rollback = _decode(runner, ids, args.max_tokens)
                    tokens_all += len(tokens) - 1
                    seconds_all += (len(tokens) - 1) / rate if rate else 0.0
                    rollback_ms[which].append(rollback * 1000)
                rates[which].append(tokens_all / seconds_all)
                print(f"repeat {repeat + 1} {which}: {rates[which][-1]:.1f} tok/s")
    ratios = [a / b for a, b in zip(rates["A"], rates["B"], strict=True)]
    print(f"\nA ({names[0]}) {statistics.median(rates['A']):.1f} tok/s, "
          f"B ({names[1]}) {statistics.median(rates['B']):.1f} tok/s; "
          f"A/B {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} pairs; "
          f"rollback per round (median over answers): A {statistics.median(rollback_ms['A']):.3f} ms, "
          f"B {statistics.median(rollback_ms['B']):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
