"""`tandem-cli bench --model http://...`: the suite against a model on a server, timed from here.

Rows, each over the suite's prompts and the repeats, interleaved as the local bench does:
- "server as started": the answer as the server speculates (its own figures where it reports
  them: app/remote/engines.py);
- for another Tandem, which takes the draft per request: "server, target alone" (speculation off
  there) and "server, prompt lookup only", so the speculation's ratio is measured on that server.
What cannot apply to a server is left out and said: the anchors (transformers, mlx-lm, llama.cpp
need the weights here), the exactness check (the server's own bench checks its token ids), the
pass costs and the bound (they time the model's passes, which run there).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

from app.bench.suite import BenchPrompt
from app.draft_choice import NO_DRAFT, PAIR_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.engine.events import Finished, GenerationStats
from app.engine.sampling import SamplingParams
from app.runner import ChatRequest

LEFT_OUT = ("the anchors (transformers, mlx-lm, llama.cpp): they run the weights on this machine, and the weights "
            "are on the server",
            "the exactness check: the server's own `tandem-cli bench` compares its token ids",
            "the target's pass costs and the bound: they time the model's passes, which run on the server")
WARMUP_TOKENS = 8


@dataclass
class RemoteRow:
    name: str
    draft: DraftChoice
    runs: list[GenerationStats] = field(default_factory=list)

    def tokens_per_s(self) -> list[float]:
        return [s.tokens_per_s for s in self.runs if s.decode_tokens]


def remote_rows(remote) -> tuple[list[RemoteRow], list[str]]:
    """The rows this server allows, and the words for those it does not."""
    rows = [RemoteRow("server as started", PAIR_DRAFT)]
    skipped = list(LEFT_OUT)
    if remote.can_choose_draft():
        rows += [RemoteRow("server, target alone", NO_DRAFT), RemoteRow("server, prompt lookup only", PROMPT_LOOKUP)]
    else:
        skipped.append(f"the target alone: {remote.engine} sets its speculation when it starts, so there is no "
                       "ratio to its plain rate")
    return rows, skipped


def run_remote_bench(runner, prompts: list[BenchPrompt], params: SamplingParams, repeats: int,
                     progress=print) -> tuple[list[RemoteRow], list[str], float]:
    rows, skipped = remote_rows(runner.remote)
    start = time.perf_counter()
    first = prompts[0]
    for row in rows:  # warm-up, not recorded (the server's caches, the connection)
        _run(runner, replace(first, max_tokens=WARMUP_TOKENS), row.draft, params)
    for repeat in range(repeats):
        order = rows if repeat % 2 == 0 else rows[::-1]
        for prompt in prompts:
            for row in order:
                seeded = params if params.greedy else replace(params, seed=(params.seed or 0) + repeat)
                stats = _run(runner, prompt, row.draft, seeded)
                row.runs.append(stats)
                progress(f"repeat {repeat + 1}/{repeats}  {prompt.name:<12} {row.name:<28} "
                         f"{stats.tokens_per_s:6.1f} tok/s  ({stats.tokens} tokens)")
    return rows, skipped, time.perf_counter() - start


def _run(runner, prompt: BenchPrompt, draft: DraftChoice, params: SamplingParams) -> GenerationStats:
    request = ChatRequest(prompt.messages, max_tokens=prompt.max_tokens, params=params, drafter=draft)
    finished = next(e for e in runner.chat(request) if isinstance(e, Finished))
    return finished.stats


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def format_remote(rows: list[RemoteRow], skipped: list[str], header: str, wall_s: float) -> str:
    """One table: tok/s, the ratio to the server's target alone where there is one, acceptance."""
    alone = next((r for r in rows if r.draft == NO_DRAFT), None)
    lines = [header, "tok/s: median [min-max] over every run, timed from here (network included); "
                     "acc: the server's own count where it reports one", ""]
    head = f"{'row':<30}{'tok/s':>24}{'vs target alone':>24}{'acc':>7}{'first token s':>22}"
    lines += [head, "-" * len(head)]
    for row in rows:
        speeds = row.tokens_per_s()
        ratio = "-"
        if alone is not None and row is not alone and speeds and alone.tokens_per_s():
            per = [a / b for a, b in zip(speeds, alone.tokens_per_s(), strict=False) if b > 0]
            ratio = _spread(per) + "x"
        drafted = sum(s.drafted for s in row.runs)
        accepted = sum(s.accepted for s in row.runs)
        acc = f"{accepted / drafted:.0%}" if drafted else "-"
        first = _spread([s.prefill_s for s in row.runs])
        lines.append(f"{row.name:<30}{_spread(speeds):>24}{ratio:>24}{acc:>7}{first:>22}")
    lines.append("")
    lines += ["left out: " + why for why in skipped]
    lines.append(f"\nwall time {wall_s:.0f}s")
    return "\n".join(lines)


def remote_summary(rows: list[RemoteRow], skipped: list[str], config: dict, wall_s: float) -> dict:
    return {"config": config, "wall_s": wall_s, "left_out": skipped,
            "rows": [{"name": r.name, "draft": str(r.draft), "tokens_per_s": r.tokens_per_s(),
                      "drafted": sum(s.drafted for s in r.runs), "accepted": sum(s.accepted for s in r.runs),
                      "first_token_s": [s.prefill_s for s in r.runs]} for r in rows]}
