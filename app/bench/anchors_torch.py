"""transformers' own decoding on the very model objects Tandem loaded (same weights, same
precision): plain `generate`, assisted generation (`assistant_model=`) and prompt lookup
(`prompt_lookup_num_tokens=`), each with the library's defaults for the schedule."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from app.bench.runs import RunResult, StreamClock
from app.engine.sampling import SamplingParams

PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example value
# assisted generation passes its own settings to the assistant's generate(), which then warns
# about its own call on every round
logging.getLogger("transformers.generation.utils").setLevel(logging.ERROR)


class _ClockStreamer(BaseStreamer):
    def __init__(self, clock: StreamClock):
        self.clock = clock
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() pushes the prompt first
            self._prompt_seen = True
            return
        self.clock.tick(int(value.numel()))

    def end(self) -> None:
        pass


def _prefill_seconds(model, input_ids: torch.Tensor) -> float:
    start = time.perf_counter()
    model(input_ids=input_ids, past_key_values=DynamicCache(config=model.config), use_cache=True,
          logits_to_keep=1).logits.argmax(-1).tolist()
    return time.perf_counter() - start


@torch.inference_mode()
def transformers_generate(model, prompt_ids: Sequence[int], max_tokens: int, params: SamplingParams,
                          stop_ids: frozenset[int], assistant=None, prompt_lookup: bool = False) -> RunResult:
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    stop = sorted(stop_ids)
    config = GenerationConfig(
        max_new_tokens=max_tokens, do_sample=not params.greedy, eos_token_id=stop or None,
        pad_token_id=stop[0] if stop else 0,
        **({} if params.greedy else {"temperature": params.temperature, "top_p": params.top_p,
                                     "top_k": params.top_k or None}),
    )
    if params.seed is not None:
        torch.manual_seed(params.seed)
    prefill_s = _prefill_seconds(model, input_ids)
    if assistant is not None:
        prefill_s += _prefill_seconds(assistant, input_ids)
    streamer = _ClockStreamer(StreamClock(prefill_s))
    extra = {"assistant_model": assistant} if assistant is not None else {}
    if prompt_lookup:
        config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
    out = model.generate(input_ids, generation_config=config, streamer=streamer, **extra)
    tokens = [t for t in out[0, input_ids.shape[1]:].tolist() if t not in stop_ids]
    return streamer.clock.result(tokens)
