"""A chat's generation settings: what the settings drawer edits and the history stores per chat
and per answer. Qt-free.

The defaults are what users of LM Studio and Ollama expect from a chat (a little randomness,
nucleus and top-k cuts), not the greedy decoding the CLI and the benchmarks use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from app.draft_choice import PAIR_DRAFT, REQUEST_CHOICES, DraftChoice
from app.engine.sampling import SamplingParams
from app.engine.tree_choice import MODES as TREE_MODES

MAX_DRAFT_TOKENS = 32
MAX_COUNT = 2**31 - 1  # the most a 32-bit count holds: the settings drawer's spin boxes raise beyond it


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
    # trees of drafts (docs/trees.md): "auto" the branches that pay, "on" every alternative, "off" chains
    trees: str = "auto"

    def __post_init__(self):
        # Types are checked, not only ranges: these come back from the history as JSON, where a
        # count can be 1e30, 5.5 or true, and the drawer's spin boxes raise on what they cannot hold.
        if not _whole(self.max_tokens) or not 1 <= self.max_tokens <= MAX_COUNT:
            raise ValueError(f"max new tokens must be a whole number from 1 to {MAX_COUNT:,}, got {self.max_tokens!r}")
        if self.draft_tokens is not None and (not _whole(self.draft_tokens)
                                              or not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS):
            raise ValueError(f"draft tokens must be auto or 1 to {MAX_DRAFT_TOKENS}, got {self.draft_tokens!r}")
        if not isinstance(self.thinking, bool):
            raise ValueError(f"thinking must be true or false, got {self.thinking!r}")
        if self.trees not in TREE_MODES:
            raise ValueError(f"trees must be one of {', '.join(TREE_MODES)}, got {self.trees!r}")
        if self.drafter not in REQUEST_CHOICES:
            raise ValueError(f"drafter must be one of {', '.join(map(str, REQUEST_CHOICES))}, got “{self.drafter}”")
        for name in ("temperature", "top_p"):
            if isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if _whole(self.top_k) and self.top_k > MAX_COUNT:
            raise ValueError(f"top-k must be at most {MAX_COUNT:,}, got {self.top_k!r}")
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
        return cls.read(data, base)[0]

    @classmethod
    def read(cls, data, base: ChatSettings | None = None) -> tuple[ChatSettings, list[str]]:
        """As from_dict, and the names of the fields whose values were refused (each checked as
        __post_init__ checks it), for a notice that names them. Anything but a JSON object is
        refused whole: no field of it is read."""
        settings, refused = base or cls(), []
        if not isinstance(data, dict):
            return settings, []
        for item in fields(cls):
            if item.name in data:
                try:
                    value = data[item.name]
                    if item.name == "drafter":
                        value = DraftChoice.parse(value)  # DraftChoiceError is a ValueError
                    settings = replace(settings, **{item.name: value})
                except (TypeError, ValueError, OverflowError):
                    refused.append(item.name)
        return settings, refused


def _whole(value) -> bool:
    """A whole number as JSON writes one (true and false are not counts, though Python's bool is an int)."""
    return isinstance(value, int) and not isinstance(value, bool)
