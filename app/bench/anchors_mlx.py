"""mlx-lm's own generation on the very model objects Tandem loaded: `stream_generate` plain and
with `draft_model=` (its speculative decoding accepts a draft token when it equals the token the
target samples: token matching, not the ratio test)."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from app.bench.runs import RunResult, StreamClock
from app.engine.sampling import SamplingParams

NUM_DRAFT_TOKENS = 3  # mlx_lm.generate's command-line default


def mlx_generate(model, hf_tokenizer, prompt_ids: Sequence[int], max_tokens: int, params: SamplingParams,
                 stop_ids: frozenset[int], draft_model=None) -> RunResult:
    tokenizer = TokenizerWrapper(hf_tokenizer, eos_token_ids=set(stop_ids))
    sampler = make_sampler(temp=params.temperature, top_p=params.top_p if params.top_p < 1 else 0.0,
                           top_k=params.top_k)
    if params.seed is not None:
        mx.random.seed(params.seed)
    extra = {"draft_model": draft_model, "num_draft_tokens": NUM_DRAFT_TOKENS} if draft_model else {}
    # Timed from the first token, as mlx-lm's own generation_tps is: timing the prefill apart and
    # subtracting it made decode times vanish (even go negative) on long prompts.
    clock = StreamClock(None)
    tokens: list[int] = []
    from_draft = own = 0
    for response in stream_generate(model, tokenizer, mx.array(list(prompt_ids)), max_tokens=max_tokens,
                                    sampler=sampler, **extra):
        if response.finish_reason == "stop":
            break  # the closing response carries the stop token, which is not part of the answer
        clock.tick()
        tokens.append(int(response.token))
        if len(tokens) > 1:
            from_draft += bool(response.from_draft)
            own += not response.from_draft
    result = clock.result(tokens)
    if draft_model is not None and own:
        # each round drafts NUM_DRAFT_TOKENS (fewer only at the very end) and ends with one token
        # of the target's own: rounds = own tokens, drafted ~ rounds * NUM_DRAFT_TOKENS
        result.rounds, result.accepted = own, from_draft
        result.drafted = own * NUM_DRAFT_TOKENS
    return result
