"""Prompts the target writes itself (Magpie, Xu et al. 2024): an instruction-tuned model given its
chat template up to where a user's message begins writes a user's message, since that is what
followed there in its tuning. Sampled at temperature 1, these asks are as varied as the chats it was
tuned on, with no dataset to download and nothing of the user's read.

Why: a head trained on the built-in asks alone (twelve templates about sixty subjects) agreed 0.52
with the demo on trained asks, 0.36 on held-out subjects and 0.23 on the bench's prompts: what
it lacked was variety of asks, which no fixed list supplies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from app.align.teacher_torch import Teacher, _Cancelled, stop_ids
from transformers import StoppingCriteriaList

MARK = "\u2063\u2063ASK\u2063\u2063"  # a text no template writes, to find where the user's message goes
MIN_WORDS = 3


def user_prefix(tokenizer) -> list[int]:
    """The token ids of the chat template up to where a user's (first) message begins: its system
    turn, if it writes one by default, and the user turn's header."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=False)
    if MARK not in text:
        raise ValueError("the chat template does not write the user's message")
    return tokenizer(text[: text.index(MARK)], add_special_tokens=False).input_ids


def self_prompts(teacher: Teacher, tokenizer, count: int, batch: int, seed: int = 0, max_tokens: int = 64,
                 cancelled: Callable[[], bool] = lambda: False, enough: Callable[[], bool] = lambda: False,
                 progress: Callable[[int, int], None] = lambda done, total: None,
                 exclude: frozenset[str] = frozenset()) -> list[str]:
    """Up to `count` distinct asks the target writes, `batch` at a time (seeded). An ask cut off
    at `max_tokens`, shorter than MIN_WORDS words, repeated, or in `exclude` (prompts that measure
    the result) is dropped. Stops early once `enough()` or `cancelled()`."""
    prefix = user_prefix(tokenizer)
    stops = set(stop_ids(tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    asks: dict[str, None] = {}  # ordered and distinct
    tries = 0
    try:
        while len(asks) < count and tries < 4 * count and not (cancelled() or enough()):
            rows = min(batch, 4 * count - tries)
            ids = torch.tensor([prefix] * rows, device=teacher.device)
            with torch.inference_mode():
                out = teacher.model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=True,
                    temperature=1.0, top_p=None, top_k=None, pad_token_id=pad, eos_token_id=sorted(stops) or None,
                    stopping_criteria=StoppingCriteriaList([_Cancelled(cancelled)]))
            tries += rows
            for row in out[:, len(prefix):].tolist():
                end = next((j for j, t in enumerate(row) if t in stops), None)
                if end is None:
                    continue  # cut off: not a whole ask
                text = tokenizer.decode(row[:end], skip_special_tokens=True).strip()
                if len(text.split()) >= MIN_WORDS and text not in exclude:
                    asks.setdefault(text)
            progress(min(len(asks), count), count)
    finally:
        torch.random.set_rng_state(generator_state)
    return list(asks)[:count]
