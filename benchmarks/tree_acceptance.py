"""Would a tree of prompt-lookup drafts beat the chain? Issue 48's first measurement.

For each suite prompt the target alone writes its answer at temperature 0; that answer is then
replayed against lookup's candidates (app/bench/tree_ranks.py): acceptance by depth and by rank
among siblings, and the target passes the answer takes with a chain of k or a tree of a given
shape. Passes at T=0 are exact counts (the engine's rounds, with lookup's plain rule: the edit
resync of app/engine/lookup.py is left out for chain and tree alike). The time is a prediction:
each pass costs what a pass of its width measured here (the target's own passes, timed in this
run), so it says what a tree could win before one is built, not what it wins.

    .venv/bin/python benchmarks/tree_acceptance.py            # the demo, the suite, 2 threads
    .venv/bin/python benchmarks/tree_acceptance.py --prompts 3 --max-tokens 64 --draft none

Since trees are verified (tree_torch.py), the same answers are also decoded for real with each
tree shape: passes, tok/s and the answer's exactness, measured, not predicted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"chain k=4": (1, 1, 1, 1), "chain k=8": (1,) * 8, "tree 2-1-1-1": (2, 1, 1, 1),
          "tree 3-1-1-1": (3, 1, 1, 1), "tree 2-2-1-1": (2, 2, 1, 1), "tree 2-1-1-1-1-1-1-1": (2,) + (1,) * 7,
          "tree 3-2-2-1-1-1": (3, 2, 2, 1, 1, 1)}
MAX_NGRAM, MIN_NGRAM = 4, 3  # chat lookup's (app/engine/drafters.chat_lookup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--prompts", type=int, default=None, help="the first N suite prompts")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--draft", default="self:int4",
                        help='a draft model to measure too (a folder, or "self:int4"); "none" for lookup alone')
    parser.add_argument("--no-measure", action="store_true", help="predictions only: no trees verified for real")
    args = parser.parse_args()

    from app.bench.costs import measure_target_costs
    from app.bench.suite import load_suite
    from app.bench.tree_ranks import count_passes, rank_table
    from app.draft_choice import NO_DRAFT
    from app.engine.events import Finished, Round
    from app.engine.speculative import generate
    from app.runner import Runner

    runner = Runner()
    loaded = runner.load(args.model, "torch", draft=NO_DRAFT, progress=lambda message: None)
    target, tok = runner.target, runner.tokenizer
    prompts = load_suite(prompts=args.prompts, max_tokens=args.max_tokens)
    answers = []
    for prompt in prompts:
        ids = tok.render_chat(list(prompt.messages))
        answer = []
        for event in generate(target, tok.decode, ids, drafter=None, stop_ids=tok.stop_ids,
                              max_tokens=prompt.max_tokens):
            if isinstance(event, Round):
                answer.extend(event.emitted)
            elif isinstance(event, Finished):
                break
        answers.append((prompt.name, ids, answer))
    widest = max(1 + len(w) * max(w) for w in SHAPES.values())
    first_name, first_ids, first_answer = answers[0]
    costs = measure_target_costs(target, first_ids + first_answer[: len(first_answer) // 2 or 1],
                                 range(1, min(widest, 24) + 1))

    def cost(width: int) -> float:
        return costs.get(width) or costs[max(costs)] * width / max(costs)  # past what was timed: linear

    print(f"{loaded.describe()}; lookup {MIN_NGRAM}-{MAX_NGRAM}-grams; pass ms by width: "
          + " ".join(f"{w}:{s * 1000:.1f}" for w, s in sorted(costs.items())))
    print(f"\n{'prompt':<12}{'tokens':>7}  " + "".join(f"{name:>22}" for name in SHAPES))
    totals = {name: [0, 0.0] for name in SHAPES}
    table = None
    per_prompt_ratio: dict[str, list[float]] = {name: [] for name in SHAPES}
    for name, ids, answer in answers:
        tokens = ids + answer
        cells = []
        chain_s = None
        for shape_name, widths in SHAPES.items():
            counted = count_passes(tokens, len(ids), widths, MAX_NGRAM, MIN_NGRAM)
            seconds = sum(cost(w) for w in counted.widths)
            totals[shape_name][0] += counted.passes
            totals[shape_name][1] += seconds
            chain_s = seconds if shape_name == "chain k=4" else chain_s
            per_prompt_ratio[shape_name].append(chain_s / seconds if seconds else 1.0)
            cells.append(f"{counted.passes:>5} p {seconds * 1000:>7.0f} ms")
        print(f"{name:<12}{len(answer):>7}  " + "".join(f"{c:>22}" for c in cells))
        prompt_table = rank_table(tokens, len(ids), 4, 3, MAX_NGRAM, MIN_NGRAM)
        table = prompt_table if table is None else [[a + b for a, b in zip(r, s, strict=True)]
                                                    for r, s in zip(table, prompt_table, strict=True)]
    print(f"{'all':<12}{sum(len(a) for _, _, a in answers):>7}  "
          + "".join(f"{f'{p:>5} p {s * 1000:>7.0f} ms':>22}" for p, s in totals.values()))
    print("\npredicted speed against chain k=4, median over prompts [min-max] (passes timed by width here):")
    for shape_name, ratios in per_prompt_ratio.items():
        print(f"  {shape_name:<24} {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
    print("\nthe target's token among lookup's candidates, by depth (after every earlier one accepted) and rank:")
    for depth, row in enumerate(table):
        reached = sum(row)
        if not reached:
            print(f"  depth {depth}: no candidates")
            continue
        shares = ", ".join(f"rank {r}: {n / reached:.1%}" for r, n in enumerate(row[:-2]))
        wrong_first = reached - row[0]
        saved = (wrong_first - row[-1]) / wrong_first if wrong_first else 0.0
        print(f"  depth {depth}: {reached} positions with candidates; {shares}, rank 3+: {row[-2] / reached:.1%}, "
              f"none: {row[-1] / reached:.1%}; where the first guess was wrong a sibling was right {saved:.0%}")
    if not args.no_measure:
        measured_section(target, answers)
    if args.draft != "none":
        draft_model_section(args.model, args.draft, answers)
    return 0


MEASURED_SHAPES = {"chain k=4": (1, 1, 1, 1), "tree 2-1-1-1": (2, 1, 1, 1), "tree 3-1-1-1": (3, 1, 1, 1),
                   "tree 2-2-1-1": (2, 2, 1, 1), "tree 3-2-2-1-1-1": (3, 2, 2, 1, 1, 1)}


def decode_with_trees(target, ids, n_tokens: int, widths) -> tuple[list[int], int, float]:
    """The answer at temperature 0 with lookup's tree of `widths` verified in one pass a round
    (app/engine/backends/tree_torch.py; a chain shape is a causal pass): (tokens, passes after the
    prefill, seconds of those passes and the drafting)."""
    import time

    from app.bench.tree_ranks import lookup_tree
    from app.engine.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    target.reset()
    out = [target.next_token(ids, greedy)]  # the prefill's token, as the engine's first
    history, passes = [*ids, *out], 0
    start = time.perf_counter()
    while len(out) < n_tokens:
        tree = lookup_tree(history, widths, MAX_NGRAM, MIN_NGRAM)
        if len(tree):
            emitted = target.verify_tree([history[-1]], tree, greedy).emitted(tree)
        else:
            emitted = [target.next_token([history[-1]], greedy)]
        passes += 1
        out += emitted
        history += emitted
    return out[:n_tokens], passes, time.perf_counter() - start


def measured_section(target, answers) -> None:
    """Trees verified for real on the target (not predicted): passes, seconds, and the answer
    checked token for token against the target alone."""
    print("\nmeasured: lookup's trees verified in one pass (tree_torch.py), each answer as long as the target "
          "alone's, the stop token ignored")
    print(f"{'prompt':<12}" + "".join(f"{name:>24}" for name in MEASURED_SHAPES))
    ratios: dict[str, list[float]] = {name: [] for name in MEASURED_SHAPES}
    same = True
    for name, ids, answer in answers:
        cells, chain_s = [], None
        for shape_name, widths in MEASURED_SHAPES.items():
            tokens, passes, seconds = decode_with_trees(target, ids, len(answer), widths)
            same &= tokens == answer
            chain_s = seconds if chain_s is None else chain_s
            ratios[shape_name].append(chain_s / seconds)
            cells.append(f"{passes:>5} p {len(tokens) / seconds:>7.1f} tok/s")
        print(f"{name:<12}" + "".join(f"{c:>24}" for c in cells))
    print("measured speed against chain k=4, median over prompts [min-max]:")
    for shape_name, values in ratios.items():
        print(f"  {shape_name:<24} {statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]")
    print(f"every answer {'identical to' if same else 'DIFFERENT FROM'} the target alone's")


MODEL_SHAPES = {"chain k=4": (1, 1, 1, 1), "tree 2-1-1-1": (2, 1, 1, 1), "tree 3-1-1-1": (3, 1, 1, 1),
                "tree 2-2-1-1": (2, 2, 1, 1), "tree 2-2-2-2": (2, 2, 2, 2)}


def draft_model_section(model: str, draft: str, answers) -> None:
    """A draft model's alternatives on the same answers: its top choices, teacher-forced. Passes
    are exact counts; no time is predicted (a tree's drafting costs draft passes of their own)."""
    import torch

    from app.bench.tree_ranks import by_confidence, model_ranks, ranked_passes
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    # the pair as the runner loads it (a self-draft of a GGUF target is its float32 import at that precision)
    from app.models.names import DEMO_REFERENCE

    # a self-draft copies float weights: of the demo, its float32 reference (the GGUF read at its
    # own precisions has none to copy)
    source = DEMO_REFERENCE if model == "demo" and draft.startswith("self:") else model
    paired = Runner()
    paired.load(source, "torch", draft=DraftChoice.parse(draft), progress=lambda message: None)
    backend = paired._draft_backend()
    choice = paired.loaded.draft
    print(f"\ndraft {choice.label} ({backend.dtype}), its top choices along the same answers:")
    print(f"{'prompt':<12}" + "".join(f"{name:>20}" for name in MODEL_SHAPES))
    all_ranks, all_top1 = [], []
    totals = {name: [0, 0] for name in MODEL_SHAPES}
    for name, ids, answer in answers:
        tokens = ids + answer
        with torch.inference_mode():
            logits = backend.model(torch.tensor([tokens])).logits[0].float().numpy()
        ranks, top1 = model_ranks(logits, len(ids), tokens)
        all_ranks += ranks[1:]
        all_top1 += top1[1:]
        cells = []
        for shape, widths in MODEL_SHAPES.items():
            counted = ranked_passes(ranks, widths)
            totals[shape][0] += counted.passes
            totals[shape][1] += counted.accepted
            cells.append(f"{counted.passes:>5} p {1 + counted.accepted / counted.passes:.2f} t/p"
                         if counted.passes else "-")
        print(f"{name:<12}" + "".join(f"{c:>20}" for c in cells))
    print(f"{'all':<12}" + "".join(f"{f'{p:>5} p {1 + a / p:.2f} t/p':>20}" for p, a in totals.values()))
    print("where the draft's first choice was wrong, by its own top-1 probability:")
    for band, n, wrong, saved in by_confidence(all_ranks, all_top1):
        print(f"  top-1 {band}: {n} positions, first choice wrong {wrong:.0%}, then second or third right {saved:.0%}")


if __name__ == "__main__":
    sys.exit(main())
