"""Sampling settings shared by plain and speculative decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Below this a temperature only divides logits into overflow (1e-40 made torch raise and MLX answer
# nothing); such a setting means "greedy", and the user is told to write 0 for that.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 or t > MAX_TEMPERATURE:
            raise ValueError(f"The temperature must be a number from 0 to {MAX_TEMPERATURE:g} "
                             f"(0 picks the likeliest token), not {t!r}.")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"A temperature of {t!r} is too small to sample with: use 0 for the likeliest "
                             f"token, or at least {MIN_TEMPERATURE:g}.")
        p = self.top_p
        if not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 < p <= 1.0:
            raise ValueError(f"top-p must be above 0 and at most 1 (1 keeps every token), not {p!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top-k must be a whole number of 0 or more (0 keeps every token), not {self.top_k!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"The seed must be a whole number from 0 to 2^63 - 1, not {self.seed!r}.")
