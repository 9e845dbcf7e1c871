"""The benchmark prompt suite (benchmarks/suite.json): chat prompts of different kinds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.json"
QUICK_PROMPTS, QUICK_TOKENS = 2, 16


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    kind: str
    messages: tuple[dict, ...]
    max_tokens: int


def load_suite(path: Path | None = None, *, prompts: int | None = None, max_tokens: int | None = None,
               quick: bool = False) -> list[BenchPrompt]:
    """The suite's prompts; `quick` keeps the first two at 16 tokens (the CI smoke run)."""
    path = Path(path or DEFAULT_SUITE)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["prompts"]
        default_tokens = int(data.get("max_tokens", 128))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a benchmark suite ({exc}). It needs a JSON object with a "
                         "'prompts' list of {name, kind, user}.") from exc
    if quick:
        prompts, max_tokens = prompts or QUICK_PROMPTS, max_tokens or QUICK_TOKENS
    suite = []
    for entry in entries[:prompts]:
        messages = ({"role": "system", "content": entry["system"]},) if entry.get("system") else ()
        messages += ({"role": "user", "content": entry["user"]},)
        suite.append(BenchPrompt(entry["name"], entry.get("kind", ""), messages,
                                 int(max_tokens or entry.get("max_tokens", default_tokens))))
    return suite
