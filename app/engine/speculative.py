"""The speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023).

Each round: the drafter proposes up to k tokens; the target runs one forward pass over the
pending token and the drafts; verification (in the backend, on the device) accepts a prefix and
adds one token of the target's own (the correction, or the bonus after k acceptances); both
caches are cut back past what was rejected, in a `finally`. k = 0 is plain decoding: the same
loop is the target-alone baseline, so the two cannot drift apart.

Cache invariant after every round: the target's cache holds every committed token but the last
(the pending one, whose logits the next pass computes); the draft's cache holds a prefix of the
committed tokens and catches up on the rest when it next drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from app.engine.adaptive import MAX_DRAFT, DraftLengthController
from app.engine.backends.base import ModelBackend, Verdict
from app.engine.drafters import Drafter, Proposal
from app.engine.events import Finished, GenerationStats, Notice, PromptTooLongError, Round
from app.engine.output import AnswerStream
from app.engine.sampling import SamplingParams

NO_PROPOSAL = Proposal((), ())


def check_prompt_fits(prompt_len: int, context_length: int) -> None:
    if prompt_len >= context_length:
        raise PromptTooLongError(
            f"The prompt is {prompt_len} tokens but the model's context holds {context_length}. "
            "Shorten the message or start a new conversation."
        )


def why_not_speculate(target: ModelBackend, drafter: Drafter | None) -> str | None:
    if drafter is None:
        return None
    if not target.can_trim():
        return (f"the target ({target.model_type}) has recurrent layers whose state cannot be "
                "rolled back after a rejected draft")
    return drafter.can_speculate()


def verify_round(target: ModelBackend, pending: int, proposal: Proposal,
                 params: SamplingParams) -> tuple[Verdict, float]:
    """One target pass over [pending, *drafts]; the cache keeps pending + the accepted drafts."""
    base = target.cache_len
    verdict = None
    start = time.perf_counter()
    try:
        verdict = target.verify([pending, *proposal.ids], proposal, params)
    finally:
        # Roll back even when cancelled or failed, so the cache never holds rejected tokens.
        keep = base + 1 + verdict.accepted if verdict is not None else base
        target.truncate(keep)
    return verdict, time.perf_counter() - start


def speculative_round(target: ModelBackend, drafter: Drafter, committed: list[int], k: int,
                      params: SamplingParams) -> tuple[Proposal, Verdict | None, float]:
    """Draft up to k tokens and verify them. Verdict None: the drafter proposed nothing."""
    proposal, verdict, verify_s = NO_PROPOSAL, None, 0.0
    try:
        proposal = drafter.propose(committed, k, params)
        if proposal.ids:
            verdict, verify_s = verify_round(target, committed[-1], proposal, params)
    finally:
        # The draft keeps only what is now committed, also when the round failed or was cut.
        accepted = verdict.accepted if verdict is not None else 0
        tail = (*proposal.ids[:accepted], verdict.token) if verdict is not None else ()
        drafter.accepted([*committed, *tail], proposal, accepted)
    return proposal, verdict, verify_s


def generate(
    target: ModelBackend,
    decode: Callable[[list[int]], str],
    prompt_ids: Sequence[int],
    *,
    drafter: Drafter | None = None,
    stop_ids: frozenset[int] = frozenset(),
    max_tokens: int = 256,
    params: SamplingParams = SamplingParams(),
    stop_strings: Sequence[str] = (),
    draft_tokens: int | None = None,  # None: adaptive; an int fixes k
    max_draft: int = MAX_DRAFT,
    controller: DraftLengthController | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[Round | Notice | Finished]:
    check_prompt_fits(len(prompt_ids), target.context_length)
    reason = why_not_speculate(target, drafter)
    if reason:
        yield Notice(f"Decoding without a draft: {reason}.")
        drafter = None
    controller = controller or DraftLengthController(fixed_k=draft_tokens, max_k=max_draft)
    answer = AnswerStream(decode, prompt_ids, stop_ids, stop_strings, max_tokens)
    max_k = controller.costs.max_k  # the longest k it can choose (a fixed k included)
    drafted_at, accepted_at, reached_at = [0] * max_k, [0] * max_k, [0] * max_k

    start = time.perf_counter()
    target.reset()
    if drafter is not None:
        drafter.start(prompt_ids)
    first = target.next_token(prompt_ids, params)  # prefill
    prefill_s = time.perf_counter() - start
    committed = [*prompt_ids, first]
    kept, text = answer.take((first,))
    yield Round(index=0, drafted=(), accepted=0, emitted=kept, text=text, verify_s=prefill_s)

    rounds = decode_tokens = 0
    # Throughput is wall clock, not the sum of model calls: the loop's own overhead (and the
    # consumer's, between yields) is part of what a user waits for.
    decode_start = time.perf_counter()
    while answer.finish is None:
        if should_stop():
            answer.finish = "cancelled"
            break
        room = target.context_length - len(committed)  # positions a verify pass may still use
        if room <= 0:
            answer.finish = "context"
            break
        k = controller.choose() if drafter is not None else 0
        k = max(0, min(k, room - 1, answer.remaining - 1))
        proposal, verdict, verify_s = NO_PROPOSAL, None, 0.0
        if k:
            proposal, verdict, verify_s = speculative_round(target, drafter, committed, k, params)
        if verdict is not None:
            accepted = verdict.accepted
            emitted = (*proposal.ids[:accepted], verdict.token)
            controller.record_round(len(proposal.ids), accepted, proposal.seconds, verify_s)
            for i in range(len(proposal.ids)):
                drafted_at[i] += 1
                accepted_at[i] += i < accepted
                reached_at[i] += i <= accepted
        else:  # plain step: k = 0, or the drafter had nothing to offer
            step = time.perf_counter()
            emitted, accepted = (target.next_token((committed[-1],), params),), 0
            verify_s = time.perf_counter() - step
            if drafter is not None:
                controller.record_plain(verify_s)
        rounds += 1
        decode_tokens += len(emitted)
        committed.extend(emitted)
        kept, text = answer.take(emitted)
        yield Round(index=rounds, drafted=proposal.ids, accepted=accepted, emitted=kept,
                    text=text, draft_p=proposal.p, target_q=verdict.q if verdict else (),
                    draft_s=proposal.seconds, verify_s=verify_s, k=k, source=proposal.source)
    decode_s = time.perf_counter() - decode_start
    tail = answer.close()
    if tail:
        yield Round(index=rounds, drafted=(), accepted=0, emitted=(), text=tail)
    stats = GenerationStats(
        prompt_tokens=len(prompt_ids), tokens=len(answer.tokens), rounds=rounds,
        decode_tokens=decode_tokens, drafted=sum(drafted_at), accepted=sum(accepted_at),
        prefill_s=prefill_s, decode_s=decode_s, finish_reason=answer.finish,
        accepted_by_position=tuple(accepted_at), drafted_by_position=tuple(drafted_at),
        reached_by_position=tuple(reached_at),
    )
    yield Finished(stats=stats, text=answer.text)
