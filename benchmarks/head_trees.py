"""A draft head's trees against its chains (issue 48): the head alone, no prompt lookup beside it.

The head (by default the demo's shipped aligned head) drafts each round; with trees on, its
runner-up token goes beside each draft it was unsure of (drafters.runner_up_tree: probability
under 0.5, up to two a round), and one target pass verifies the tree. Rows, interleaved in each
repeat: the target alone, the head's chain and its tree at adaptive k, and at a fixed k. For each
row: tokens per target pass, tok/s (median over repeats per prompt, then the median over
prompts of the ratio to the chain), and whether every answer is the target's alone. Then how the
runner-ups fared: leaves offered, reached (the walk followed the chain down to their depth),
where the chain's own draft was wrong, and where the runner-up was the target's token.

    .venv/bin/python benchmarks/head_trees.py                  # the demo and its shipped head, 2 repeats
    .venv/bin/python benchmarks/head_trees.py --prompts 2 --max-tokens 32 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def leaf_fates(rounds) -> dict[str, int]:
    """Over tree rounds: runner-up leaves offered, reached (the walk followed the chain to their
    depth), reached where the chain's draft was wrong, and taken (the runner-up was right)."""
    from app.engine.tree import chain_length

    fates = {"offered": 0, "reached": 0, "chain wrong": 0, "taken": 0}
    for r in rounds:
        if r.tree is None:
            continue
        n = chain_length(r.tree)
        chain = r.tree.tokens[:n]
        followed = next((i for i in range(r.accepted) if r.drafted[i] != chain[i]), r.accepted)
        for leaf in range(n, len(r.tree)):
            depth = r.tree.depths[leaf]
            fates["offered"] += 1
            if followed < depth:
                continue
            fates["reached"] += 1
            if followed == depth:  # the walk left the chain here: its draft was not the target's
                fates["chain wrong"] += 1
                fates["taken"] += r.accepted > depth and r.drafted[depth] == r.tree.tokens[leaf]
    return fates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--draft", default=None, help="a draft head (head:<folder>, mtp, eagle3:<folder>); "
                                                      "default: the demo's shipped aligned head")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--k", type=int, default=3, help="the fixed k of the fixed rows")
    args = parser.parse_args()

    from app.bench.suite import load_suite
    from app.draft_choice import DraftChoice
    from app.engine.events import Finished, Round
    from app.engine.sampling import SamplingParams
    from app.engine.speculative import generate
    from app.models.demo import demo_head
    from app.runner import Runner

    runner = Runner()
    draft = DraftChoice.parse(args.draft) if args.draft else demo_head()
    loaded = runner.load(args.model, "torch", draft=draft, progress=lambda message: None)
    target, tok = runner.target, runner.tokenizer
    drafter = getattr(runner.drafter, "model", runner.drafter)  # the head alone, not lookup beside it
    if not drafter.drafts_trees or target.tree_note():
        print(f"no trees here: {target.tree_note() or 'the draft names no runner-ups'}")
        return 1
    rows = {"target alone": dict(drafter=None), "chain, adaptive k": dict(trees="off"),
            "tree, adaptive k": dict(trees="on"), f"chain, k={args.k}": dict(trees="off", draft_tokens=args.k),
            f"tree, k={args.k}": dict(trees="on", draft_tokens=args.k)}
    prompts = load_suite(prompts=args.prompts, max_tokens=args.max_tokens)
    runs: dict[tuple[str, str], list[tuple[float, int, int]]] = {}  # (row, prompt) -> (tok/s, tokens, passes)
    answers: dict[tuple[str, str], list[int]] = {}
    tree_rounds: dict[str, list] = {name: [] for name in rows}
    print(f"{loaded.describe()}; {drafter.name}, alone; {len(prompts)} prompts, {args.repeats} repeats, T=0")
    for repeat in range(args.repeats):
        for prompt in prompts:
            ids = tok.render_chat(list(prompt.messages))
            for name, options in rows.items():
                options = {"drafter": drafter, **options}
                rounds, stats = [], None
                for event in generate(target, tok.decode, ids, stop_ids=tok.stop_ids, max_tokens=prompt.max_tokens,
                                      params=SamplingParams(temperature=0.0), **options):
                    if isinstance(event, Round):
                        rounds.append(event)
                    elif isinstance(event, Finished):
                        stats = event.stats
                tokens = [t for r in rounds for t in r.emitted]
                runs.setdefault((name, prompt.name), []).append(
                    (stats.decode_tokens / stats.decode_s if stats.decode_s else 0.0, len(tokens), stats.rounds))
                answers[(name, prompt.name)] = tokens
                if repeat == 0:
                    tree_rounds[name] += rounds
    exact = all(answers[(name, p.name)] == answers[("target alone", p.name)] for name in rows for p in prompts)
    print(f"\n{'row':<20}{'tok/pass':>9}{'tok/s':>8}{'vs chain':>22}")
    for name in rows:
        chain = "chain, adaptive k" if "adaptive" in name or name == "target alone" else f"chain, k={args.k}"
        per = [(statistics.median(s for s, _, _ in runs[(name, p.name)]),
                statistics.median(s for s, _, _ in runs[(chain, p.name)])) for p in prompts]
        ratios = [ours / theirs for ours, theirs in per]
        tokens = sum(runs[(name, p.name)][0][1] for p in prompts)
        passes = sum(runs[(name, p.name)][0][2] for p in prompts)
        print(f"{name:<20}{tokens / passes:>9.2f}{statistics.median(s for s, _ in per):>8.1f}"
              f"{f'{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]':>22}")
    print("\nper prompt, median tok/s: " + " | ".join(rows))
    for p in prompts:
        print(f"  {p.name:<12}" + " | ".join(f"{statistics.median(s for s, _, _ in runs[(n, p.name)]):6.1f}"
                                            for n in rows))
    for name in rows:
        if name.startswith("tree"):
            fates = leaf_fates(tree_rounds[name])
            trees = sum(r.tree is not None for r in tree_rounds[name])
            print(f"\n{name}: {trees} tree rounds of {len(tree_rounds[name]) - len(prompts)}; runner-ups offered "
                  f"{fates['offered']}, reached {fates['reached']}, reached where the chain's draft was wrong "
                  f"{fates['chain wrong']}, the target's token {fates['taken']}"
                  + (f" ({fates['taken'] / fates['chain wrong']:.0%} of those)" if fates["chain wrong"] else ""))
    print(f"\nexactness (T=0): {'every answer the target alone' if exact else 'SOME ANSWERS DIFFER'}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
