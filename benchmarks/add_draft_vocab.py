"""Give an aligned draft head a draft vocabulary (FR-Spec; app/align/draft_vocab.py) after the fact:
a head made before the job chose one (the shipped demo head) drafts over the whole vocabulary.

The target answers the built-in asks alignment trains on (never the held-out ones), on this
machine, greedy, as the job would; their most frequent tokens and the stop tokens become the
head's `draft_vocab.safetensors`. Then the held-out asks are answered, and for each size the
script prints what the subset covers of those answers and the head's agreement when it drafts
from it (teacher-forced first drafts, as the job measures), beside its agreement over the whole
vocabulary. The chosen size is written, with those figures, into the head's manifest.

    python benchmarks/add_draft_vocab.py                                  # the shipped demo head
    python benchmarks/add_draft_vocab.py --head FOLDER --target FOLDER --size 4096 --asks 400
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = (1024, 2048, 4096, 8192, 16384)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, default=ROOT / "resources" / "aligned" / "smollm2-135m-instruct-q4_1")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--size", type=int, default=None, help="tokens to keep (default: the job's default)")
    parser.add_argument("--asks", type=int, default=400, help="built-in training asks to answer and count")
    parser.add_argument("--held-out", type=int, default=64, help="held-out asks to measure on")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dry-run", action="store_true", help="print the figures, write nothing")
    parser.add_argument("--cache", type=Path, default=None,
                        help="keep the answers' counts and held-out states in this file and reuse them")
    args = parser.parse_args()

    from safetensors.torch import load_file

    from app.align import draft_vocab
    from app.align.head_train_torch import HeadTrainer
    from app.align.job import resolve_target
    from app.align.prompts import builtin_prompts, held_out
    from app.align.teacher_torch import Teacher, collect, stop_ids
    from app.engine.backends.mtp_torch import to_layer_name
    from app.models.aligned_head import MANIFEST, WEIGHTS

    size = args.size or draft_vocab.DEFAULT_SIZE
    started = time.perf_counter()
    teacher = Teacher(resolve_target(args.target))
    tokenizer = teacher.tokenizer()
    asks = builtin_prompts(0)
    train = [p for p in asks if not held_out(p)][: args.asks]
    held = [p for p in asks if held_out(p)][: args.held_out]
    if args.cache and args.cache.is_file():
        answered, counts, held_seqs = _load_cache(args.cache)
    else:
        trained = collect(teacher, tokenizer, train, 128, args.batch, 0.0)
        held_seqs = collect(teacher, tokenizer, held, 128, args.batch, 0.0)
        answered, counts = len(trained), draft_vocab.answer_counts(trained)
        if args.cache:
            _save_cache(args.cache, answered, counts, held_seqs)
    held_counts = draft_vocab.answer_counts(held_seqs)
    print(f"{answered} answers ({sum(counts.values()):,} tokens, {len(counts):,} distinct) counted; "
          f"{len(held_seqs)} held-out answers ({sum(held_counts.values()):,} tokens); "
          f"{time.perf_counter() - started:.0f} s")

    trainer = HeadTrainer(teacher)
    state = {to_layer_name(k[len("mtp."):]): v.float() for k, v in load_file(str(args.head / WEIGHTS)).items()}
    trainer.layer.load_state_dict(state, strict=True)
    whole, positions = trainer.agreement(held_seqs)
    print(f"held-out agreement over the whole vocabulary: {whole / positions:.4f} ({positions:,} positions)")
    stops, vocab_size = stop_ids(tokenizer), int(teacher.head_weight.shape[0])
    chosen = {}
    for n in sorted({*SIZES, size}):
        vocab = draft_vocab.frequent(counts, n, vocab_size, stops)
        agreed = trainer.agreement(held_seqs, vocab)[0]
        figures = {"size": len(vocab), "held_out_coverage": round(draft_vocab.coverage(vocab, held_counts), 4),
                   "held_out_coverage_in_context": round(draft_vocab.coverage_in_context(vocab, held_seqs), 4),
                   "agreement": round(agreed / positions, 4)}
        print(f"  {n:>6}: {figures['size']:>6} tokens, covers {figures['held_out_coverage']:.2%} of held-out "
              f"answer tokens ({figures['held_out_coverage_in_context']:.2%} with the conversation's), "
              f"agreement {figures['agreement']:.4f}")
        if n == size:
            chosen = (vocab, figures)
    if args.dry_run:
        return 0
    vocab, figures = chosen
    draft_vocab.write(args.head, vocab)
    config_path = args.head / "config.json"
    config = json.loads(config_path.read_text())
    config["draft_vocab"] = len(vocab)
    config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    manifest_path = args.head / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["draft_vocab"] = {
        "size": figures["size"], "held_out_coverage": figures["held_out_coverage"],
        "held_out_coverage_in_context": figures["held_out_coverage_in_context"],
        "from": f"the most frequent tokens of the target's answers to {answered} built-in training asks "
                f"({sum(counts.values()):,} tokens, made here after the head), then the lowest ids, "
                "and the stop tokens",
        # on other held-out answers than the manifest's agreement (those of the job that made the head)
        "held_out_agreement": {"asks": len(held_seqs), "positions": positions,
                               "whole_vocabulary": round(whole / positions, 4), "draft_vocab": figures["agreement"]},
        "made_by": "benchmarks/add_draft_vocab.py " + " ".join(sys.argv[1:])}
    manifest_path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    print(f"wrote {args.head / 'draft_vocab.safetensors'} ({len(vocab)} tokens)")
    return 0


def _save_cache(path: Path, answered: int, counts, held_seqs) -> None:
    """safetensors (never a pickle): each held-out answer's ids and states; the counts in the metadata."""
    from safetensors.torch import save_file

    tensors = {}
    for i, s in enumerate(held_seqs):
        tensors[f"{i}.ids"], tensors[f"{i}.hidden"] = s.ids.contiguous(), s.hidden.contiguous()
    meta = {"answered": str(answered), "counts": json.dumps(dict(counts)),
            "starts": json.dumps([s.answer_start for s in held_seqs])}
    save_file(tensors, str(path), metadata=meta)


def _load_cache(path: Path):
    from collections import Counter

    from safetensors import safe_open

    from app.align.teacher_torch import Sequence

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        starts = json.loads(meta["starts"])
        held = [Sequence(f.get_tensor(f"{i}.ids"), f.get_tensor(f"{i}.hidden"), start)
                for i, start in enumerate(starts)]
    counts = Counter({int(k): v for k, v in json.loads(meta["counts"]).items()})
    return int(meta["answered"]), counts, held


if __name__ == "__main__":
    sys.exit(main())
