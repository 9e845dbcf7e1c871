"""A draft head's vocabulary: the tokens its target writes most (FR-Spec, Zhao et al. 2025).

A draft head's own layer is cheap; what its draft costs is mostly the target's output head over
the whole vocabulary (on the demo, 5.3 of 8.8 ms a drafted token: 49,152 rows for a model that
writes a few thousand of them). Drafting over the tokens the target's answers actually use, and
scattering those logits into a vector that is -inf everywhere else, makes each step a matmul over
that subset. Verification is untouched: the draft's distribution is still a distribution over the
whole vocabulary (zero outside the subset), so the speculative rule stays exact at any
temperature; a token outside the subset is simply never drafted (the target still writes it).

The subset's fixed part is counted from the answers the head was trained on (never the held-out
ones, whose coverage the manifest reports), filled up with the lowest ids, plus the target's stop
tokens, so an answer's end can be drafted. While drafting, the conversation's own tokens join it
(app/engine/backends/subset_head_torch.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# The fixed part of a draft head's vocabulary. The demo's shipped head, on 64 held-out asks' answers
# (benchmarks/add_draft_vocab.py; counts from 400 answers): teacher-forced agreement 0.639 over all
# 49,152 tokens; from 1,024 / 4,096 / 8,192 / 16,384 with the conversation's tokens, 0.610 / 0.628 /
# 0.630 / 0.636; a one-token draft costs 9.0 ms over all, about 4 ms from 8,192 (the head's layer is
# most of what is left). Larger subsets cost more rows and win little.
DEFAULT_SIZE = 8192


def answer_counts(sequences: Iterable) -> Counter:
    """How often each token id occurs in the answers (app/align/teacher_torch.Sequence: from
    `answer_start` on; the prompts' tokens are the template's and the user's, not the target's)."""
    counts: Counter = Counter()
    for s in sequences:
        counts.update(int(t) for t in s.ids[s.answer_start:].tolist())
    return counts


def frequent(counts: Counter, size: int, vocab_size: int, always: Iterable[int] = ()) -> list[int]:
    """The `size` most frequent ids (ties by id, so the same counts give the same subset), filled up
    to `size` with the lowest ids not counted, and the `always` ids added; ascending, all below
    `vocab_size`. The fill is a prior: a byte-level BPE numbers its tokens in merge order, most
    frequent first in the text it was built on (SmolLM2's id 260 is " the", 49,000 " Antim"), and a
    few hundred answers leave out many tokens the next answer uses (on the demo 400 answers used
    3,785 distinct tokens, which covered 86.5% of held-out answers' tokens)."""
    ranked = sorted((item for item in counts.items() if 0 <= item[0] < vocab_size),
                    key=lambda item: (-item[1], item[0]))
    chosen = {token for token, _ in ranked[:size]}
    token = 0
    while len(chosen) < min(size, vocab_size):
        chosen.add(token)
        token += 1
    return sorted(chosen | {int(t) for t in always if 0 <= int(t) < vocab_size})


def coverage(ids: Iterable[int], counts: Counter) -> float:
    """The share of the counted tokens that fall inside `ids`."""
    inside = set(ids)
    total = sum(counts.values())
    return sum(n for token, n in counts.items() if token in inside) / total if total else 0.0


def coverage_in_context(ids: Iterable[int], sequences: Iterable) -> float:
    """The share of the answers' tokens inside `ids` or earlier in their own sequence (the prompt
    and the answer so far), which the drafter adds as a conversation goes (subset_head_torch.py)."""
    fixed = set(ids)
    inside = total = 0
    for s in sequences:
        tokens = s.ids.tolist()
        seen = fixed | set(tokens[1: s.answer_start])  # the drafter reads from the second token on
        for token in tokens[s.answer_start:]:
            inside += token in seen
            total += 1
            seen.add(token)
    return inside / total if total else 0.0


def write(folder: Path, ids: list[int]) -> None:
    """The subset as `draft_vocab.safetensors` (one int32 tensor "ids", ascending)."""
    import numpy as np
    from safetensors.numpy import save_file

    from app.models.aligned_head import DRAFT_VOCAB

    save_file({"ids": np.asarray(ids, dtype=np.int32)}, str(Path(folder) / DRAFT_VOCAB))
