"""Temperature-0 outputs against the target alone, token for token.

A divergence is reported with its position and the target's top-1 minus top-2 logit gap there.
A verify pass over k+1 tokens runs other kernel shapes than one-token decoding, so in reduced
precision a near-tie can flip an argmax: that is numerics. A divergence at a clear gap is a bug.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.bench.harness import TARGET_ALONE, BenchRun

# Top-2 gaps below these are near-ties. float32: batched and stepwise logits differ by about 5e-5
# on the demo model. Reduced precisions: the threshold follows the logits' rounding, a number of
# units in the last place of the top logit (one bfloat16 ulp of a logit near 20 is 0.125, so a
# fixed 0.1 called a one-ulp flip a "clear gap"): a flip needs the gap below the sum of both
# logits' errors, each at least half an ulp from the last rounding plus what the layers before it
# accumulated in that precision, taken as 2 ulps each.
NEAR_TIE = {"float32": 1e-3}
TIE_ULPS = 4
MANTISSA_BITS = {"bfloat16": 7, "float16": 10}


def tie_limit(logits_dtype: str, top: float) -> float:
    """The widest top-2 gap still counted a near-tie for logits of `logits_dtype` near `top`."""
    bits = MANTISSA_BITS.get(logits_dtype)
    if bits is None:
        return NEAR_TIE.get(logits_dtype, NEAR_TIE["float32"])
    exponent = math.floor(math.log2(abs(top))) if top else -14
    return TIE_ULPS * 2.0 ** (exponent - bits)


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
    fixed = getattr(target, "near_tie_gap", None)  # measured for the model's own kernels (a GGUF)
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
        first, second = target.top2(bench.prompt_ids[record.prompt] + ref[:position])
        gap = first - second
        limit = fixed or tie_limit(getattr(target, "logits_dtype", "float32"), first)
        found.append(Divergence(record.method, family[record.method], record.prompt, record.repeat,
                                position, gap, gap < limit))
    return found
