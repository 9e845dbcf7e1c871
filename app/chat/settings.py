"""A chat's generation settings: what the settings drawer edits and the history stores per chat
and per answer. Qt-free.

The defaults are what users of LM Studio and Ollama expect from a chat (a little randomness,
nucleus and top-k cuts), not the greedy decoding the CLI and the benchmarks use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from app.draft_choice import PAIR_DRAFT, REQUEST_CHOICES, DraftChoice
from app.engine.sampling import SamplingParams

MAX_DRAFT_TOKENS = 32


@dataclass(frozen=True)
class ChatSettings:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 1024
    draft_tokens: int | None = None  # None: adapts to the measured acceptance
    drafter: DraftChoice = PAIR_DRAFT  # one of REQUEST_CHOICES; stored as its text ("pair", "ngram", ...)
    # a reasoning model's thinking block, where its template has a switch (Qwen3.x); others
    # think always or never, whatever this says
    thinking: bool = True

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max new tokens must be at least 1, got {self.max_tokens}")
        if self.draft_tokens is not None and not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"draft tokens must be auto or 1 to {MAX_DRAFT_TOKENS}, got {self.draft_tokens}")
        if not isinstance(self.thinking, bool):
            raise ValueError(f"thinking must be true or false, got {self.thinking!r}")
        if self.drafter not in REQUEST_CHOICES:
            raise ValueError(f"drafter must be one of {', '.join(map(str, REQUEST_CHOICES))}, got “{self.drafter}”")
        self.sampling()  # SamplingParams checks temperature, top-p and top-k

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def to_dict(self) -> dict:
        """JSON-ready: the drafter as the text earlier versions wrote and read."""
        return {item.name: getattr(self, item.name) for item in fields(self)} | {"drafter": str(self.drafter)}

    @classmethod
    def from_dict(cls, data: dict | None, base: ChatSettings | None = None) -> ChatSettings:
        """Settings stored by any version: unknown keys are ignored, and a missing or invalid
        value falls back to `base` (the defaults) instead of making the chat unopenable."""
        settings = base or cls()
        for item in fields(cls):
            if data and item.name in data:
                try:
                    value = data[item.name]
                    if item.name == "drafter":
                        value = DraftChoice.parse(value)  # DraftChoiceError is a ValueError
                    settings = replace(settings, **{item.name: value})
                except (TypeError, ValueError):
                    continue
        return settings
