"""Temperature-0 outputs against the target alone, token for token.

A divergence is reported with its position and the target's top-1 minus top-2 logit gap there.
A verify pass over k+1 tokens runs other kernel shapes than one-token decoding, so in reduced
precision a near-tie can flip an argmax: that is numerics. A divergence at a clear gap is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.bench.harness import TARGET_ALONE, BenchRun

# Top-2 gaps below these are near-ties for the precision (float32: batched and stepwise logits
# differ by about 5e-5 on the demo model).
NEAR_TIE = {"float32": 1e-3}
NEAR_TIE_REDUCED = 0.1


@dataclass(frozen=True)
class Divergence:
    method: str
    family: str
    prompt: str
    repeat: int
    position: int  # index in the answer of the first differing token
    top2_gap: float
    near_tie: bool


def same_as_plain(bench: BenchRun, method: str, plain: str) -> tuple[int, int]:
    """(runs whose text equals `plain`'s on the same prompt and repeat, runs compared): llama.cpp's
    prompt lookup against its own plain decoding."""
    plain_runs = {(r.prompt, r.repeat): r.result.tokens for r in bench.records if r.method == plain}
    pairs = [(r.result.tokens, plain_runs.get((r.prompt, r.repeat))) for r in bench.records if r.method == method]
    return sum(a == b for a, b in pairs if b is not None), sum(b is not None for _, b in pairs)


def find_divergences(bench: BenchRun, target) -> list[Divergence]:
    reference = {r.prompt: r.result.tokens for r in bench.records if r.method == TARGET_ALONE and r.repeat == 0}
    family = {m.name: m.family for m in bench.methods}
    limit = getattr(target, "near_tie_gap", None) or NEAR_TIE.get(target.dtype, NEAR_TIE_REDUCED)
    found = []
    for record in bench.records:
        if family[record.method] == "external":  # llama.cpp: its own kernels, compared with itself
            continue
        ref, got = reference[record.prompt], record.result.tokens
        position = next((i for i, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), None)
        if position is None and len(ref) != len(got):
            position = min(len(ref), len(got))  # one stopped where the other went on
        if position is None:
            continue
        gap = target.top2_gap(bench.prompt_ids[record.prompt] + ref[:position])
        found.append(Divergence(record.method, family[record.method], record.prompt, record.repeat,
                                position, gap, gap < limit))
    return found
