"""Plain decoding: the target alone, one token per forward pass. The baseline every speedup is
measured against. It is the speculative loop with no drafter (k = 0 every round), so the two
paths share their stop, streaming and timing code."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from app.engine.backends.base import ModelBackend
from app.engine.events import Finished, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate


def generate_plain(
    target: ModelBackend,
    decode: Callable[[list[int]], str],
    prompt_ids: Sequence[int],
    *,
    stop_ids: frozenset[int] = frozenset(),
    max_tokens: int = 256,
    params: SamplingParams = SamplingParams(),
    stop_strings: Sequence[str] = (),
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Round | Finished]:
    return generate(target, decode, prompt_ids, drafter=None, stop_ids=stop_ids,
                    max_tokens=max_tokens, params=params, stop_strings=stop_strings,
                    should_stop=should_stop)

