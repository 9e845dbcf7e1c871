"""`tandem --self-test` (and `tandem-cli self-test`): proof that an installed Tandem works.

It loads the demo pair (from the copy bundled with the app, so no network), decodes a short
answer with the target alone and then speculatively, greedily, and checks the two are the same
token for token: the promise the whole app rests on. One line of result, exit status 0 or 1, no
window and no display needed, so a build machine or a user's support request can run it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from app.draft_choice import AUTO_DRAFT, NO_DRAFT, PAIR_DRAFT, DraftChoice
from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from app.models.demo import DEMO_REFERENCE
from app.runner import ChatRequest, Runner
from app.service import RunnerService, Traced

SELF_TEST_PROMPT = "Write a Python function that checks whether a number is prime."
SELF_TEST_TOKENS = 16
PREFIX = "Tandem self-test:"


@dataclass(frozen=True)
class Decoded:
    """One answer: the committed token ids, their text, and what speculation did."""

    ids: tuple[int, ...]
    text: str
    tokens_per_s: float
    drafted: int = 0
    accepted: int = 0


def same_output(alone: Decoded, speculative: Decoded) -> bool:
    return alone.ids == speculative.ids and alone.text == speculative.text


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Index of the first token where the two answers part (the shorter length if one is a prefix)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def decode(service: RunnerService, drafter: DraftChoice, prompt: str = SELF_TEST_PROMPT,
           tokens: int = SELF_TEST_TOKENS) -> Decoded:
    """Greedy answer to `prompt` through the runner service, as every client asks; `drafter` is
    NO_DRAFT (the target alone) or PAIR_DRAFT."""
    request = ChatRequest(({"role": "user", "content": prompt},), max_tokens=tokens,
                          params=SamplingParams(temperature=0.0), drafter=drafter)
    ids: list[int] = []
    finished = None
    for event in service.submit(request, client="self-test").events():
        if isinstance(event, Traced):
            ids.extend(event.round.emitted)
        elif isinstance(event, Finished):
            finished = event
    if finished is None:
        raise RuntimeError("the decoder stopped without finishing its answer")
    stats = finished.stats
    # A final stop token is emitted but is not part of the answer: compare what was written.
    return Decoded(tuple(ids[: stats.tokens]), finished.text, stats.tokens_per_s, stats.drafted, stats.accepted)


def _where(runner: Runner, model: str) -> str:
    loaded = runner.loaded
    pair = {"demo": "demo pair", DEMO_REFERENCE: "demo float32 pair"}.get(model) or loaded.describe().split(" (")[0]
    note = f" ({loaded.device_note})" if loaded.device_note else ""
    return f"{loaded.backend}/{loaded.device}{note}, {pair}"


def self_test(model: str = DEMO_REFERENCE, backend: str | None = None, draft: DraftChoice = AUTO_DRAFT,
              tokens: int = SELF_TEST_TOKENS, prompt: str = SELF_TEST_PROMPT,
              compare: Callable[[Decoded, Decoded], bool] = same_output,
              out: Callable[[str], None] | None = None, progress: Callable[[str], None] | None = None) -> int:
    """Load `model` with `draft`, decode `tokens` tokens alone and speculatively, compare them
    with `compare`, print one line through `out` (stdout by default). Returns 0 when they agree."""
    out = out or (lambda line: print(line, flush=True))
    progress = progress or (lambda message: None)
    service = RunnerService()
    runner = service.runner
    try:
        try:
            service.load(model, backend or None, draft=draft, progress=progress).result()
        except Exception as exc:  # one line and exit 1 whatever went wrong: that is the test's whole job
            out(f"{PREFIX} FAILED, the model did not load: {exc}")
            return 1
        where = _where(runner, model)
        try:
            alone = decode(service, NO_DRAFT, prompt, tokens)
            speculative = decode(service, PAIR_DRAFT, prompt, tokens)
        except Exception as exc:
            out(f"{PREFIX} FAILED, decoding raised {type(exc).__name__}: {exc} ({where})")
            return 1
    finally:
        service.close()
    if not compare(alone, speculative):
        at = first_difference(alone.ids, speculative.ids)
        out(f"{PREFIX} FAILED, speculative output differs from the target alone at token {at} "
            f"({len(alone.ids)} against {len(speculative.ids)} tokens; {where})")
        return 1
    if runner.drafter is not None and speculative.drafted == 0:
        out(f"{PREFIX} FAILED, the pair drafted nothing, so speculation was not tested ({where})")
        return 1
    # No speed figure: 16 tokens right after loading time the warm-up, not the pair (the side
    # panel and `tandem-cli bench` measure speed).
    drafts = f", {speculative.accepted}/{speculative.drafted} drafts accepted" if speculative.drafted else ""
    out(f"{PREFIX} ok, {len(alone.ids)} tokens identical to the target alone{drafts} ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(self_test())
