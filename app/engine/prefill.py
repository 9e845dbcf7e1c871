"""A prompt read in chunks, with Stop checked between them.

One pass over a 6,500-token prompt runs for tens of seconds on a CPU, and nothing can interrupt a
pass: Stop, Ctrl+C or a quitting window waited for all of it (and a process that exited meanwhile
aborted inside the pass). Read in chunks of PREFILL_CHUNK positions, a prompt is cancelled within
one chunk, and a long prompt's activations (its attention scores above all) stay the size of one
chunk's. mlx-lm's generate_step reads prompts the same way (prefill_step_size).

Chunks change only how many positions a pass reads: the same tokens go into the same cache, and
the target alone reads its prompts the same way, so answers stay exactly the target's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from app.engine.backends.base import ModelBackend

PREFILL_CHUNK = 512  # positions per pass: ~0.5 s for the demo on 2 CPU threads


def chunks(ids: Sequence[int], size: int | None = None) -> Iterator[Sequence[int]]:
    size = size or PREFILL_CHUNK
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


def split_last(ids: Sequence[int], size: int | None = None) -> tuple[Sequence[int], Sequence[int]]:
    """(all but the last chunk, the last chunk): the last one's pass also gives the first token."""
    size = size or PREFILL_CHUNK
    head = (max(len(ids) - 1, 0) // size) * size
    return ids[:head], ids[head:]


def prefill_chunked(backend: ModelBackend, ids: Sequence[int], should_stop: Callable[[], bool],
                    rows: list | None = None) -> bool:
    """Read `ids` into `backend`'s cache chunk by chunk; False as soon as `should_stop()` turns
    true (the cache then holds a prefix of `ids`). `rows`: each chunk's hidden states appended,
    for a drafter that reads the target's states."""
    for chunk in chunks(ids):
        if should_stop():
            return False
        backend.prefill(chunk)
        if rows is not None:
            rows.append(backend.last_hidden())
    return True
