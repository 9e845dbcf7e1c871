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
from dataclasses import replace

from app.engine.adaptive import MAX_DRAFT, DraftLengthController, NominalCosts
from app.engine.backends.base import ModelBackend
from app.engine.drafters import Drafter, Proposal, TargetState
from app.engine.events import (EmptyPromptError, Finished, GenerationStats, Notice, PrefillProgress,
                               PromptTooLongError, Round)
from app.engine.output import AnswerStream
from app.engine.prefill import chunk_count, chunks, prefill_steps, split_last
from app.engine.reuse import remember, start_cache
from app.engine.sampling import SamplingParams
from app.engine.tree_choice import WIDTH, TreeChooser
from app.engine.tree_round import tree_fits, verify_tree_round
from app.engine.verified import Verified

NO_PROPOSAL = Proposal((), ())


def check_prompt_fits(prompt_len: int, context_length: int) -> None:
    if prompt_len >= context_length:
        raise PromptTooLongError(
            f"The prompt is {prompt_len} tokens but the model's context holds {context_length}. "
            "Shorten the message or start a new conversation."
        )


def why_not_speculate(target: ModelBackend, drafter: Drafter | None) -> str | None:
    """Asked on fresh caches (the previous answer's cache says nothing about this one)."""
    if drafter is None:
        return None
    if not target.can_trim():
        return target.no_rollback_reason()
    return drafter.can_speculate()


def rollback_limit(target: ModelBackend, drafter: Drafter, committed: Sequence[int]) -> int | None:
    """The longest draft both caches can take and still cut back exactly (None: no limit). A
    verify pass appends what the target's cache lacks of `committed` (the pending token) and
    the k drafts."""
    catch_up = len(committed) - target.cache_len
    limits = [room - catch_up for room in (target.rollback_room(),) if room is not None]
    limits += [room for room in (drafter.room(committed),) if room is not None]
    return max(min(limits), 0) if limits else None


def _cancelled_in_prefill(prompt_tokens: int, seconds: float) -> Finished:
    """Stop while the prompt was being read: nothing was answered."""
    return Finished(GenerationStats.nothing_written(prompt_tokens, seconds), "")


def _prompt_rows(target: ModelBackend, parts: list, lengths: list[int]):
    """The hidden states of a prompt read in chunks, joined where every chunk kept a row per
    position it read; otherwise the last chunk's rows alone (a drafter counts them from the end)."""
    whole = all(part is not None and len(part) == n for part, n in zip(parts, lengths, strict=True))
    joined = target.join_hidden(parts) if whole and len(parts) > 1 else None
    return joined if joined is not None else parts[-1]


def one_time_work(target: ModelBackend, drafter: Drafter | None) -> int:
    """Passes of the target, the draft model and a draft head that did one-time work (a CUDA graph
    captured): a round in which this changes is timed with that work in it, so its timings are left out."""
    draft = getattr(drafter, "backend", None)
    return (target.one_time_work + (getattr(draft, "one_time_work", 0) if draft is not None else 0)
            + getattr(drafter, "one_time_work", 0))


def proposal_end(proposal: Proposal, stop_ids: frozenset[int], vocab_limit: int) -> int:
    """How much of a proposal is worth verifying: it ends at its first stop token (drafts after
    the answer's end are waste), and before any id the target's vocabulary does not have."""
    for i, token in enumerate(proposal.ids):
        if token >= vocab_limit or token < 0:
            return i
        if token in stop_ids:
            return i + 1
    return len(proposal.ids)


def cut_proposal(proposal: Proposal, n: int) -> Proposal:
    if n >= len(proposal.ids):
        return proposal
    return replace(proposal, ids=proposal.ids[:n], p=proposal.p[:n],
                   probs=None if proposal.probs is None else proposal.probs[:n],
                   ids_array=None if proposal.ids_array is None else proposal.ids_array[:n])


def verify_round(target: ModelBackend, committed: Sequence[int], proposal: Proposal,
                 params: SamplingParams, want_state: bool = False) -> Verified:
    """One target pass over what its cache lacks of `committed` (the pending token) and the
    drafts; the cache then keeps the committed tokens and the accepted drafts. Recurrent state
    (app/engine/cache.py) goes back to the checkpoint taken before the pass and reads the kept
    tokens again (the recurrent layers alone inside the rewind where the backend can, else the
    whole model here): the cost of a rejection on a hybrid model, part of the round's rollback
    time."""
    start = time.perf_counter()
    mark = target.checkpoint()
    catch_up = list(committed[mark.length:])
    verdict = None
    passed = time.perf_counter()
    try:
        verdict = target.verify([*catch_up, *proposal.ids], proposal, params)
    finally:
        # Roll back even when cancelled or failed, so the cache never holds rejected tokens.
        kept = [*catch_up, *proposal.ids[:verdict.accepted]] if verdict is not None else []
        rewind_start = time.perf_counter()
        held = target.rewind(mark, mark.length + len(kept))
    if held > mark.length + len(kept):  # never decode on after rejected drafts: say so loudly
        raise RuntimeError(f"the target's cache kept {held - mark.length - len(kept)} rejected draft positions")
    # the kept positions' rows, taken before a replay's pass replaces them
    state = TargetState(target.last_hidden()[:len(kept)], mark.length, target) if want_state else None
    replay = kept[held - mark.length:]
    target.prefill(replay)
    end = time.perf_counter()
    replayed = len(replay) + target.recomputed
    return Verified(verdict, rewind_start - passed, (passed - start) + (end - rewind_start), replayed, state)


def speculative_round(target: ModelBackend, drafter: Drafter, committed: list[int], k: int,
                      params: SamplingParams, stop_ids: frozenset[int] = frozenset(),
                      should_stop: Callable[[], bool] = lambda: False, trees: TreeChooser | None = None,
                      costs=None) -> tuple[Proposal, Verified | None]:
    """Draft up to k tokens and verify them. None: the drafter proposed nothing, or Stop was
    pressed while it drafted (then nothing is verified). With `trees`, the drafter is asked for
    alternatives, and the chooser says, with the source's `costs`, whether the round verifies
    them or the chain alone."""
    proposal, verified = NO_PROPOSAL, None
    if trees is not None and trees.failed:
        trees = None
    try:
        if trees is not None:
            proposal = drafter.propose_tree(committed, k, WIDTH, params, should_stop)
            fits = proposal.tree is not None and len(committed) + len(proposal.tree) <= target.context_length
            if proposal.tree is not None:  # the branches that pay, priced with the source's measurements
                proposal = (trees.choose(costs, proposal) if fits and tree_fits(proposal.tree, stop_ids,
                                                                                 target.vocab_limit)
                            else replace(proposal, tree=None))
        else:
            proposal = drafter.propose(committed, k, params, should_stop)
        if proposal.tree is not None and not should_stop():
            try:
                proposal, verified = verify_tree_round(target, committed, proposal, params,
                                                       drafter.wants_target_state)
                return proposal, verified
            except Exception as exc:  # noqa: BLE001 - the cache is as it was (verify_tree_round rewound it)
                # a forward that refuses a tree's mask or positions: the chain, as tree_note's
                # refusals would have had it, and chains for the rest of the answer
                trees.failed = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                proposal = replace(proposal, tree=None)
        proposal = cut_proposal(proposal, proposal_end(proposal, stop_ids, target.vocab_limit))
        if proposal.ids and not should_stop():
            verified = verify_round(target, committed, proposal, params, drafter.wants_target_state)
    finally:
        # The draft keeps only what is now committed, also when the round failed or was cut.
        verdict = verified.verdict if verified is not None else None
        accepted = verdict.accepted if verdict is not None else 0
        tail = (*proposal.ids[:accepted], verdict.token) if verdict is not None else ()
        draft_rollback_start = time.perf_counter()
        drafter.accepted([*committed, *tail], proposal, accepted, verified.state if verified else None)
        if verified is not None:  # the draft's own rollback belongs to the round's rollback time
            draft_rollback_s = time.perf_counter() - draft_rollback_start
            verified = replace(verified, rollback_s=verified.rollback_s + draft_rollback_s)
    return proposal, verified


class _Committed:
    """What an answer has committed so far (None until the prefill is done): the caches hold a
    prefix of it whenever the answer is paused at a yield."""

    tokens: list[int] | None = None


def generate(target: ModelBackend, decode: Callable[[list[int]], str], prompt_ids: Sequence[int], *,
             drafter: Drafter | None = None, reuse_cache: bool = False,
             **options) -> Iterator[Round | Notice | Finished]:
    """Stream an answer to `prompt_ids` (options: see _generate). With `reuse_cache` the caches
    keep what they already hold of this prompt (app/engine/reuse.py) and prefill only the rest.
    Whatever way the answer ends, each cache's contents are recorded for the next one; a pass
    that failed midway leaves them unknown, so the next answer starts from empty caches."""
    committed = _Committed()
    wants_state = drafter is not None and drafter.wants_target_state
    try:
        yield from _generate(target, decode, prompt_ids, drafter=drafter, reuse_cache=reuse_cache,
                             record=committed, **options)
    except GeneratorExit:  # the consumer stopped reading, at a yield: the caches are whole
        raise
    except BaseException:
        committed.tokens = None  # a pass may have stopped halfway through the caches
        raise
    finally:
        remember(target, committed.tokens)
        if drafter is not None:
            drafter.finish(committed.tokens)
        if wants_state:
            target.capture_hidden(False)


def _generate(
    target: ModelBackend,
    decode: Callable[[list[int]], str],
    prompt_ids: Sequence[int],
    *,
    record: _Committed,
    reuse_cache: bool,
    drafter: Drafter | None = None,
    stop_ids: frozenset[int] = frozenset(),
    max_tokens: int = 256,
    params: SamplingParams = SamplingParams(),
    stop_strings: Sequence[str] = (),
    draft_tokens: int | None = None,  # None: adaptive; an int fixes k
    trees: str = "auto",  # "auto": trees of drafts where measured faster (tree_choice.py); "on", "off"
    max_draft: int = MAX_DRAFT,
    controller: DraftLengthController | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    repeatable: bool | None = None,  # None: when the answer is seeded and sampled
) -> Iterator[Round | Notice | Finished]:
    if not prompt_ids:
        raise EmptyPromptError("The prompt is empty: there is nothing for the model to continue. "
                               "Write a message (this model has no chat template to frame an empty one).")
    check_prompt_fits(len(prompt_ids), target.context_length)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
    if repeatable is None:
        repeatable = params.seed is not None and not params.greedy
    # a fixed k repeats by itself and clears `repeatable` below; a tree's choice must still not follow the clock
    must_repeat = repeatable
    if repeatable and draft_tokens is None and (controller is None or controller.fixed_k is None):
        # k must not follow the clock (see NominalCosts), nor what other answers taught a chat's
        # controller: the seed alone decides this answer
        controller = DraftLengthController(max_k=controller.costs.max_k if controller else max_draft)
        # its verify costs are known, so no round is spent measuring widths (the warm-up)
        controller.costs.t_verify.update({w: NominalCosts.verify(w) for w in range(1, controller.costs.max_k + 2)})
    else:
        repeatable = False
    controller = controller or DraftLengthController(fixed_k=draft_tokens, max_k=max_draft)
    answer = AnswerStream(decode, prompt_ids, stop_ids, stop_strings, max_tokens)
    max_k = controller.costs.max_k  # the longest k it can choose (a fixed k included)
    drafted_at, accepted_at, reached_at = [0] * max_k, [0] * max_k, [0] * max_k

    start = time.perf_counter()
    reused = start_cache(target, prompt_ids, reuse_cache)
    target.seed(params.seed)
    reason = why_not_speculate(target, drafter)  # on the caches this answer will use
    if not reason and drafter is not None and drafter.wants_target_state:
        reason = target.capture_hidden(True, drafter.target_layers)  # the drafter reads the target's states
    if reason:
        yield Notice(f"Decoding without a draft: {reason}.")
        drafter = None
    if (total := chunk_count(len(prompt_ids) - reused)) > 1:  # a long read says how far it has gone,
        yield PrefillProgress(0, total)  # from before a draft model reads the prompt too
    # trees of drafts where the drafter has alternatives and the target verifies them; a choice
    # by the clock is no choice for an answer that must repeat
    chooser = (TreeChooser(trees) if drafter is not None and drafter.drafts_trees and trees != "off"
               and not target.tree_note() and (trees == "on" or not must_repeat) else None)
    if drafter is not None:
        drafter.start(prompt_ids, params.seed, reuse=reuse_cache, should_stop=should_stop)
        controller.new_answer(drafter.acceptance_follows_text)  # what this text is, not the last one
    # the prompt in chunks, Stop checked between them (app/engine/prefill.py); the last chunk's
    # pass gives the first token
    wants_state = drafter is not None and drafter.wants_target_state
    head, last = split_last(prompt_ids[reused:])
    rows: list | None = [] if wants_state else None
    if not (yield from prefill_steps(target, head, should_stop, rows)) or should_stop():
        yield _cancelled_in_prefill(len(prompt_ids), time.perf_counter() - start)
        return
    first = target.next_token(last, params)  # prefill what the cache lacks
    prefill_s = time.perf_counter() - start
    committed = [*prompt_ids, first]
    if wants_state:  # what the prefill read, for the drafter
        # The rows end at the prompt's last position; a model may keep fewer than it read (Gemma 4
        # runs its KV-shared layers on the kept logits' positions only), so count them from the end.
        hidden = _prompt_rows(target, [*rows, target.last_hidden()], [*map(len, chunks(head)), len(last)])
        drafter.accepted(committed, NO_PROPOSAL, 0, TargetState(hidden, len(prompt_ids) - len(hidden), target))
    record.tokens = committed  # the same list, extended as the answer goes
    kept, text = answer.take((first,))
    yield Round(index=0, drafted=(), accepted=0, emitted=kept, text=text, verify_s=prefill_s)

    rounds = decode_tokens = replayed_total = tree_gain = 0
    rollback_total = 0.0
    noted = getattr(drafter, "graph_note", "")  # why a draft head runs without CUDA graphs, once said
    # Throughput is wall clock, not the sum of model calls: the loop's own overhead (and the
    # consumer's, between yields) is part of what a user waits for.
    decode_start = time.perf_counter()
    said_failed = False
    while answer.finish is None:
        if should_stop():
            answer.finish = "cancelled"
            break
        if chooser is not None and chooser.failed and not said_failed:  # said between rounds, once
            said_failed = True
            yield Notice(f"Verifying chains of drafts from here: a tree's pass failed ({chooser.failed}).")
        room = target.context_length - len(committed)  # positions a verify pass may still use
        if room <= 0:
            answer.finish = "context"
            break
        # a drafter with several sources (prompt lookup beside a model) says which proposes next,
        # and that source's own measurements choose k
        if drafter is not None:
            source = drafter.next_source(committed)
            control = controller.for_source(source)
            control.costs.per_pass = drafter.drafts_in_one_pass(source)  # a block drafter's cost is per pass
        else:
            control = controller
        k = control.choose() if drafter is not None else 0
        k = max(0, min(k, room - 1, answer.remaining - 1))
        if k and (limit := rollback_limit(target, drafter, committed)) is not None and limit < k:
            k = limit
            if not limit:  # a sliding window has filled: it stays full for the rest of the answer
                room_left = target.rollback_room()
                why = (target.no_rollback_reason() if room_left is not None and room_left < 2
                       else "the draft model's sliding window is full")
                yield Notice(f"Decoding without a draft from here: {why}.")
                drafter = None
        proposal, verified, verify_s, rollback_s, replayed = NO_PROPOSAL, None, 0.0, 0.0, 0
        work = one_time_work(target, drafter)
        if k:
            proposal, verified = speculative_round(target, drafter, committed, k, params, stop_ids, should_stop,
                                                   chooser, control.costs)
        verdict = verified.verdict if verified is not None else None
        if verified is not None:
            verify_s, rollback_s, replayed = verified.seconds, verified.rollback_s, verified.replayed
            accepted = verdict.accepted
            emitted = (*proposal.ids[:accepted], verdict.token)
            n = len(proposal.ids)
            costs = ((NominalCosts.draft(n, proposal.source, control.costs.per_pass), NominalCosts.verify(n + 1))
                     if repeatable
                     else (proposal.seconds, verify_s + rollback_s) if one_time_work(target, drafter) == work
                     else (None, None))  # a graph captured in this round: its acceptance counts, its time not
            if verified.chain is not None:  # a tree: what its chain would have taken, and its pass's width
                drafted_chain, on_chain = verified.chain
                tree_costs = ((NominalCosts.draft(drafted_chain, proposal.source, control.costs.per_pass),
                               NominalCosts.verify(len(proposal.tree) + 1)) if repeatable else costs)
                control.record_round(drafted_chain, on_chain, *tree_costs, proposal.read,
                                     width=len(proposal.tree) + 1)
            else:
                control.record_round(n, accepted, *costs, proposal.read)
            if chooser is not None and verified.chain is not None:  # what the alternatives won
                chooser.record(accepted - verified.chain[1], proposal.tree, verified.path)
                tree_gain += accepted - verified.chain[1]
        elif should_stop():  # Stop pressed while drafting: nothing was verified
            answer.finish = "cancelled"
            break
        else:  # plain step: k = 0, or the drafter had nothing to offer
            step = time.perf_counter()
            held = target.cache_len
            emitted, accepted = (target.next_token(committed[held:], params),), 0
            verify_s = time.perf_counter() - step
            if drafter is not None and drafter.wants_target_state:
                state = TargetState(target.last_hidden(), held, target)
                drafter.accepted([*committed, *emitted], NO_PROPOSAL, 0, state)
            if drafter is not None and (repeatable or one_time_work(target, drafter) == work):
                controller.record_plain(NominalCosts.verify(1) if repeatable else verify_s)
        rounds += 1
        committed.extend(emitted)
        kept, text = answer.take(emitted)
        # Only what the answer keeps counts: drafts past its end (after a stop token, a stop
        # string or the max-tokens cut) were verified, but they are neither shown nor counted.
        drafted = proposal.ids[:len(kept)] if len(kept) < len(emitted) else proposal.ids
        accepted = min(accepted, len(kept))
        decode_tokens += len(kept)
        for i in range(len(drafted)):
            drafted_at[i] += 1
            accepted_at[i] += i < accepted
            reached_at[i] += i <= accepted
        yield Round(index=rounds, drafted=drafted, accepted=accepted, emitted=kept,
                    text=text, draft_p=proposal.p[:len(drafted)],
                    target_q=verdict.q[:len(drafted)] if verdict else (),
                    draft_s=proposal.seconds, verify_s=verify_s, k=k, source=proposal.source,
                    rollback_s=rollback_s, replayed=replayed, tree=proposal.tree)
        if drafter is not None and (note := getattr(drafter, "graph_note", "")) != noted:
            noted = note  # a capture failed in this round: the head went on eagerly (head_cache_torch.py)
            yield Notice(f"Draft head: {note}; it drafts on without them.")
        rollback_total += rollback_s
        replayed_total += replayed
    decode_s = time.perf_counter() - decode_start
    tail = answer.close()
    if tail:
        yield Round(index=rounds, drafted=(), accepted=0, emitted=(), text=tail)
    stats = GenerationStats(
        prompt_tokens=len(prompt_ids), tokens=len(answer.tokens), rounds=rounds,
        decode_tokens=decode_tokens, drafted=sum(drafted_at), accepted=sum(accepted_at),
        prefill_s=prefill_s, decode_s=decode_s, finish_reason=answer.finish,
        accepted_by_position=tuple(accepted_at), drafted_by_position=tuple(drafted_at),
        reached_by_position=tuple(reached_at), reused_tokens=reused,
        rollback_s=rollback_total, replayed=replayed_total,
        trees=chooser.trees if chooser is not None else 0,
        trees_declined=chooser.declined if chooser is not None else 0, tree_gain=tree_gain,
    )
    yield Finished(stats=stats, text=answer.text)
