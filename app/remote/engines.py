"""What each serving engine tells of its speculation, read as it tells it (docs/remote.md):

- vLLM: Prometheus counters on /metrics (`vllm:spec_decode_num_drafts_total`,
  `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`,
  `..._num_accepted_tokens_per_pos_total{position="i"}`), read before and after an answer; the
  difference is the answer's, unless other requests ran meanwhile (then it is marked mixed).
- llama.cpp's own server (`llama-server`): `timings.draft_n` and `timings.draft_n_accepted` in
  the stream's last chunk. llama-cpp-python's `[server]` is another, Python server that sends
  neither: it is "an OpenAI-compatible server" here, with tokens/s and the first token's wait.
- SGLang: only its native /generate reports `meta_info.spec_verify_ct`; its OpenAI endpoint,
  which Tandem speaks, does not, so nothing of its speculation is shown.
- Another Tandem sends every round (app/remote/target.py); nothing here is needed for it.

Nothing is estimated: a figure the engine did not report is not shown.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

VLLM_PREFIX = "vllm:spec_decode_"
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ServerFigures:
    """One answer's speculation as its server reported it."""

    source: str  # where it was read: "vLLM's /metrics", "llama-server's timings"
    drafted: int
    accepted: int
    drafts: int | None = None  # proposals (vLLM's num_drafts): the denominator of acceptance by position
    accepted_by_position: tuple[int, ...] = ()
    mixed: str = ""  # why these may include other requests' tokens ("": this answer's alone)

    def words(self) -> str:
        rate = f" ({self.accepted / self.drafted:.0%})" if self.drafted else ""
        line = f"{self.source}: {self.drafted} tokens drafted, {self.accepted} accepted{rate}"
        if self.drafts and self.accepted_by_position:
            shown = ", ".join(f"{n / self.drafts:.0%}" for n in self.accepted_by_position)
            line += f"; accepted by position {shown} of {self.drafts} proposals"
        return line + (f". Mixed: {self.mixed}" if self.mixed else ".")


def prometheus_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of Prometheus' text format; comments, and lines
    that do not parse, are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if found is None:
            continue
        try:
            value = float(found.group(4))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(found.group(3) or "")}
        samples.append((found.group(1), labels, value))
    return samples


@dataclass(frozen=True)
class VllmCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    by_position: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    running: float = 0.0  # requests running as it was read
    found: bool = False  # the speculative counters were there at all (vLLM started with speculation)


def vllm_counters(text: str, model: str) -> VllmCounters:
    """The speculative counters of `model` (its `model_name` label, where there is one), summed over
    vLLM's engines. Counter names are matched by prefix: `_total` is the exposition's suffix."""
    drafts = tokens = accepted = generation = running = 0.0
    by_position: dict[int, float] = {}
    found = False
    for name, labels, value in prometheus_samples(text):
        if labels.get("model_name", model) != model or not math.isfinite(value):
            continue
        base = name.removesuffix("_total")
        if base == VLLM_PREFIX + "num_drafts":
            drafts, found = drafts + value, True
        elif base == VLLM_PREFIX + "num_draft_tokens":
            tokens, found = tokens + value, True
        elif base == VLLM_PREFIX + "num_accepted_tokens":
            accepted, found = accepted + value, True
        elif base == VLLM_PREFIX + "num_accepted_tokens_per_pos" and labels.get("position", "").isdigit():
            position = int(labels["position"])
            by_position[position] = by_position.get(position, 0.0) + value
        elif base == "vllm:generation_tokens":
            generation += value
        elif base == "vllm:num_requests_running":
            running += value
    width = max(by_position, default=-1) + 1
    return VllmCounters(drafts, tokens, accepted, tuple(by_position.get(i, 0.0) for i in range(width)), generation,
                        running, found)


def vllm_figures(before: VllmCounters, after: VllmCounters, completion_tokens: int | None) -> ServerFigures | None:
    """The answer's share of the counters; None where vLLM runs without speculation."""
    if not after.found:
        return None
    mixed = []
    if before.running > 0:
        mixed.append(f"{before.running:.0f} other request{'s' if before.running != 1 else ''} ran as it started")
    generated = after.generation_tokens - before.generation_tokens
    if completion_tokens is not None and generated > completion_tokens:
        mixed.append(f"the server wrote {generated:.0f} tokens meanwhile, this answer {completion_tokens}")
    width = max(len(before.by_position), len(after.by_position))

    def at(values: tuple[float, ...], i: int) -> float:
        return values[i] if i < len(values) else 0.0

    by_position = tuple(int(at(after.by_position, i) - at(before.by_position, i)) for i in range(width))
    return ServerFigures("vLLM's /metrics", int(after.draft_tokens - before.draft_tokens),
                         int(after.accepted - before.accepted), int(after.drafts - before.drafts), by_position,
                         "; ".join(mixed))


def llamacpp_figures(timings: object) -> ServerFigures | None:
    """llama-server's `timings` of the answer; None where it drafted nothing (no speculation)."""
    if not isinstance(timings, dict):
        return None
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (drafted, accepted)):
        return None
    return ServerFigures("llama-server's timings", drafted, accepted)
