"""A draft head's vocabulary: the tokens its target writes most (FR-Spec, Zhao et al. 2025).

A draft head's own layer is cheap; what its draft costs is mostly the target's output head over
the whole vocabulary (on the demo, 5.3 of 8.8 ms a drafted token: 49,152 rows for a model that
writes a few thousand of them). Drafting over the tokens the target's answers actually use, and
scattering those logits into a vector that is -inf everywhere else, makes each step a matmul over
that subset. Verification is untouched: the draft's distribution is still a distribution over the
whole vocabulary (zero outside the subset), so the speculative rule stays exact at any
temperature; a token outside the subset is simply never drafted (the target still writes it).

The subset is counted from the answers the head was trained on (never the held-out ones, whose
coverage the manifest reports), plus the target's stop tokens, so an answer's end can be drafted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# The tokens a draft head drafts from, at most. On the demo's held-out answers the 4,096 most frequent
# tokens of 80,000 answer tokens covered 97% of the target's tokens and the head's measured
# acceptance did not move (see the README's "What it bought on the demo"); a larger target's
# vocabulary is larger too, and a subset of it costs the same.
DEFAULT_SIZE = 4096


def answer_counts(sequences: Iterable) -> Counter:
    """How often each token id occurs in the answers (app/align/teacher_torch.Sequence: from
    `answer_start` on; the prompts' tokens are the template's and the user's, not the target's)."""
    counts: Counter = Counter()
    for s in sequences:
        counts.update(int(t) for t in s.ids[s.answer_start:].tolist())
    return counts


def frequent(counts: Counter, size: int, always: Iterable[int] = ()) -> list[int]:
    """The `size` most frequent ids (ties by id, so the same counts give the same subset) with the
    `always` ids added, ascending."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = {token for token, _ in ranked[:size]}
    return sorted(chosen | {int(t) for t in always})


def coverage(ids: Iterable[int], counts: Counter) -> float:
    """The share of the counted tokens that fall inside `ids`."""
    inside = set(ids)
    total = sum(counts.values())
    return sum(n for token, n in counts.items() if token in inside) / total if total else 0.0


def write(folder: Path, ids: list[int]) -> None:
    """The subset as `draft_vocab.safetensors` (one int32 tensor "ids", ascending)."""
    import numpy as np
    from safetensors.numpy import save_file

    from app.models.aligned_head import DRAFT_VOCAB

    save_file({"ids": np.asarray(ids, dtype=np.int32)}, str(Path(folder) / DRAFT_VOCAB))
