"""A prompt read in chunks, with Stop checked between them.

One pass over a 6,500-token prompt runs for tens of seconds on a CPU, and nothing can interrupt a
pass: Stop, Ctrl+C or a quitting window waited for all of it (and a process that exited meanwhile
aborted inside the pass). Read in chunks of PREFILL_CHUNK positions, a prompt is cancelled within
one chunk, and a long prompt's activations (its attention scores above all) stay the size of one
chunk's. mlx-lm's generate_step reads prompts the same way (prefill_step_size).

Chunks change only how many positions a pass reads: the same tokens go into the same cache, and
the target alone reads its prompts the same way, so answers stay exactly the target's.

Where a long prompt's time goes: the passes themselves. Each chunk multiplies the decoder layers'
weights by 512 positions (2 x weights x tokens in all: 1.6 TFLOP for the demo's 106 million at
7,600 tokens) and attends from each position to every one before it (the part that grows with
the square of the length: 2.0 TFLOP more there, as much again). On one CPU thread shared with
other work that is a minute or more, and nothing around the passes comes close (the prompt
lookup index is built once, in linear time, at the first round: app/engine/lookup.py). So a long
read says how far it has gone, chunk by chunk (`prefill_steps`, events.PrefillProgress), and the
window can show it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence

from app.engine.backends.base import ModelBackend
from app.engine.events import PrefillProgress

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
    steps = prefill_steps(backend, ids, should_stop, rows, after=0)
    try:
        while True:
            next(steps)
    except StopIteration as end:
        return end.value


def chunk_count(n: int) -> int:
    """The chunks `n` positions are read in."""
    return -(-n // PREFILL_CHUNK)


def prefill_steps(backend: ModelBackend, ids: Sequence[int], should_stop: Callable[[], bool],
                  rows: list | None = None, after: int = 1) -> Generator[PrefillProgress, None, bool]:
    """prefill_chunked, saying how far it has gone: where the whole read spans more than one chunk
    (those of `ids` and `after` more, read by the caller: the last one, whose pass gives the first
    token), a PrefillProgress after each of `ids`'s chunks. Its value (`yield from`) is
    prefill_chunked's."""
    total = chunk_count(len(ids)) + after
    for done, chunk in enumerate(chunks(ids), 1):
        if should_stop():
            return False
        backend.prefill(chunk)
        if rows is not None:
            rows.append(backend.last_hidden())
        if total > 1:
            yield PrefillProgress(done, total)
    return True
