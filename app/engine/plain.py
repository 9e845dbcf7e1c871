"""Plain decoding: the target alone, one token per forward pass. The baseline every speedup is
measured against, and the fallback when speculation cannot win."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from app.engine.backends.base import ModelBackend
from app.engine.detokenize import StreamingDetokenizer
from app.engine.events import Finished, GenerationStats, PromptTooLongError, Round
from app.engine.sampling import SamplingParams
from app.engine.stops import StopStrings


def check_prompt_fits(prompt_len: int, context_length: int) -> None:
    if prompt_len >= context_length:
        raise PromptTooLongError(
            f"The prompt is {prompt_len} tokens but the model's context holds {context_length}. "
            "Shorten the message or start a new conversation."
        )


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
    check_prompt_fits(len(prompt_ids), target.context_length)
    target.reset()
    detok = StreamingDetokenizer(decode, context=list(prompt_ids))
    stops = StopStrings(tuple(stop_strings))
    text_parts: list[str] = []
    start = time.perf_counter()
    token = target.next_token(prompt_ids, params)
    prefill_s = step_s = time.perf_counter() - start
    tokens = rounds = 0
    decode_s = 0.0
    finish = "length"
    while True:
        if token in stop_ids:
            finish = "stop"
            break
        tokens += 1
        shown, hit = stops.feed(detok.add(token))
        text_parts.append(shown)
        yield Round(index=rounds, drafted=(), accepted=0, emitted=(token,), text=shown,
                    verify_s=step_s)
        if hit:
            finish = "stop_string"
            break
        if tokens >= max_tokens:
            break
        if target.cache_len >= target.context_length:
            finish = "context"
            break
        if should_stop():
            finish = "cancelled"
            break
        t0 = time.perf_counter()
        token = target.next_token((token,), params)
        step_s = time.perf_counter() - t0
        decode_s += step_s
        rounds += 1
    if finish != "stop_string":
        tail, _ = stops.feed(detok.flush())
        tail += stops.flush()
        if tail:
            text_parts.append(tail)
            yield Round(index=rounds, drafted=(), accepted=0, emitted=(), text=tail)
    stats = GenerationStats(
        prompt_tokens=len(prompt_ids), tokens=tokens, rounds=rounds, decode_tokens=rounds, drafted=0, accepted=0,
        prefill_s=prefill_s, decode_s=decode_s, finish_reason=finish,
    )
    yield Finished(stats=stats, text="".join(text_parts))
