"""What Tandem remembers about pairs across sessions: the recent pairs (for the slots' menus) and
each pair's trial result ("accepts 71%, about 2.1x faster here"), in one small JSON file.

A damaged file is set aside and started afresh: it holds nothing a user typed, only what the app
measured and can measure again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.paths import data_dir

MAX_RECENT = 8
FILE_NAME = "pairs.json"


@dataclass(frozen=True)
class TrialResult:
    acceptance: float  # accepted drafts / drafted tokens over the trial prompts
    speedup: float  # speculative tokens/s over the target alone's, same prompts, same run
    tokens_per_pass: float
    tokens: int  # new tokens per run, summed over the prompts
    measured_at: float  # time.time()

    def summary(self) -> str:
        faster = f"about {self.speedup:.1f}x faster here" if self.speedup >= 1.05 else (
            "about as fast as the target alone here" if self.speedup >= 0.95
            else f"{self.speedup:.2f}x: slower than the target alone here")
        return f"accepts {self.acceptance:.0%}, {faster}"


def pair_key(backend: str, target: str, draft: str) -> str:
    return f"{backend}|{target}|{draft}"


class PairMemory:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / FILE_NAME
        self._data = self._read()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                return {"recent": list(data.get("recent", [])), "trials": dict(data.get("trials", {}))}
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            self.path.replace(self.path.with_suffix(f".damaged-{int(time.time())}"))
        return {"recent": [], "trials": {}}

    def _write(self) -> None:
        # write-then-rename: a crash mid-write leaves the previous file, never half of one
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(self._data, indent=1), encoding="utf-8")
        os.replace(partial, self.path)

    def recent(self, backend: str | None = None) -> list[dict]:
        """Newest first: {"backend", "target", "draft", "title"}."""
        return [r for r in self._data["recent"] if backend is None or r.get("backend") == backend]

    def add_recent(self, backend: str, target: str, draft: str, title: str) -> None:
        entry = {"backend": backend, "target": target, "draft": draft, "title": title}
        kept = [r for r in self._data["recent"]
                if (r.get("backend"), r.get("target"), r.get("draft")) != (backend, target, draft)]
        self._data["recent"] = [entry, *kept][:MAX_RECENT]
        self._write()

    def trial(self, backend: str, target: str, draft: str) -> TrialResult | None:
        found = self._data["trials"].get(pair_key(backend, target, draft))
        try:
            return TrialResult(**found) if found else None
        except TypeError:  # written by another version
            return None

    def set_trial(self, backend: str, target: str, draft: str, result: TrialResult) -> None:
        self._data["trials"][pair_key(backend, target, draft)] = asdict(result)
        self._write()
