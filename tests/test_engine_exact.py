"""Exactness at temperature 0: speculative output equals the target alone, token for token."""

from __future__ import annotations

import pytest

from app.engine.backends import load_backend
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from app.engine.events import Finished, Round
from app.engine.speculative import generate

PROMPTS = [
    [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198],
    [1, 520, 198, 40, 41, 42, 40, 41, 42, 40, 41],  # repetitive: prompt lookup finds matches
    [1, 700, 701, 702, 703, 704, 705, 706, 707, 708, 709, 710, 2],
]
N = 40


def _decode(ids):
    return " ".join(map(str, ids))


def _run(target, prompt, drafter=None, **kw):
    events = list(generate(target, _decode, prompt, drafter=drafter, max_tokens=N, **kw))
    rounds = [e for e in events if isinstance(e, Round)]
    return [t for r in rounds for t in r.emitted], events[-1]


@pytest.fixture(scope="module")
def torch_models(tiny_pair):
    return {role: load_backend(tiny_pair[role], "torch") for role in ("target", "draft", "near")} | {
        "self": load_backend(tiny_pair["target"], "torch")}


@pytest.fixture(scope="module")
def mlx_models(tiny_pair):
    return {role: load_backend(tiny_pair[f"{role}_mlx"], "mlx") for role in ("target", "draft", "near")} | {
        "self": load_backend(tiny_pair["target_mlx"], "mlx")}


def _check_backend(models, ks):
    target = models["target"]
    for prompt in PROMPTS:
        plain, _ = _run(target, prompt)
        assert len(plain) == N
        for role in ("self", "near", "draft"):
            for k in ks:
                spec, done = _run(target, prompt, ModelDrafter(models[role]), draft_tokens=k)
                assert spec == plain, f"{role} draft, k={k}, prompt {prompt}"
                if role == "self" and k is not None:
                    assert done.stats.acceptance_rate == 1.0
                    assert done.stats.rounds < N
        for k in ks:
            spec, _ = _run(target, prompt, PromptLookupDrafter(), draft_tokens=k)
            assert spec == plain, f"prompt lookup, k={k}"
            both = LookupThenModelDrafter(ModelDrafter(models["near"]), min_tokens=1)
            spec, _ = _run(target, prompt, both, draft_tokens=k)
            assert spec == plain, f"lookup then model, k={k}"


def test_torch_speculative_equals_target_alone(torch_models):
    _check_backend(torch_models, ks=[1, 2, 3, 4, 5, 6, 7, 8, None])


def test_mlx_speculative_equals_target_alone(mlx_models):
    _check_backend(mlx_models, ks=[1, 3, 8, None])


def test_acceptance_tracks_how_alike_the_draft_is(torch_models):
    prompt = PROMPTS[0]
    rates = {role: _run(torch_models["target"], prompt, ModelDrafter(torch_models[role]),
                        draft_tokens=4)[1].stats.acceptance_rate for role in ("self", "near", "draft")}
    assert rates["self"] == 1.0
    assert rates["draft"] < 0.3 < rates["near"] < 1.0, rates


@pytest.mark.parametrize("trees", ["off", "on"])
@pytest.mark.parametrize("lookup", [False, True], ids=["model", "lookup-then-model"])
def test_caches_hold_exactly_the_committed_tokens(torch_models, tiny_pair, lookup, trees):
    target, draft = torch_models["target"], torch_models["near"]
    fresh = load_backend(tiny_pair["target"], "torch")
    fresh_draft = load_backend(tiny_pair["near"], "torch")
    prompt = PROMPTS[1] if lookup else PROMPTS[0]
    drafter = LookupThenModelDrafter(ModelDrafter(draft), min_tokens=1) if lookup else ModelDrafter(draft)
    committed = list(prompt)
    seen_partial = False
    sources, tree_rounds = set(), 0
    for event in generate(target, _decode, prompt, drafter=drafter, draft_tokens=5, max_tokens=N, trees=trees):
        if not isinstance(event, Round):
            continue
        sources.add(event.source)
        tree_rounds += event.tree is not None
        committed.extend(event.emitted)
        # (a tree's round shows its walked path and the first guess it rejected: any rejection counts)
        rejected = event.accepted < len(event.drafted)
        seen_partial |= rejected and (event.accepted > 0 or trees == "on")
        # the target holds all but the pending token, the draft a prefix of the committed
        assert target.cache_len == len(committed) - 1
        assert draft.cache_len <= len(committed) - 1
        # ... and what they hold is those tokens: the next logits equal a fresh prefill's
        for live, ref in ((target, fresh), (draft, fresh_draft)):
            n = live.cache_len
            got = live.forward_last(committed[n:]).clone()
            live.truncate(n)
            ref.reset()
            want = ref.forward_last(committed)
            assert (got - want).abs().max() < 1e-4
    assert seen_partial  # the check covered rounds that rejected some drafts
    assert (tree_rounds > 0) == (trees == "on")  # ... and with trees, rounds that verified trees (app/engine/tree.py)
    # the combined drafter's model really lagged behind lookup rounds and caught up
    assert sources - {""} == ({"lookup", "model"} if lookup else {"model"})


def test_a_failed_round_leaves_the_caches_consistent(torch_models):
    target, draft = torch_models["target"], torch_models["near"]

    class Boom(RuntimeError):
        pass

    real_verify = target.verify
    calls = {"n": 0}

    def failing_verify(ids, proposal, params):
        calls["n"] += 1
        if calls["n"] == 3:
            real_verify(ids, proposal, params)  # the pass ran and extended the cache...
            raise Boom  # ...then failed
        return real_verify(ids, proposal, params)

    target.verify = failing_verify
    committed = list(PROMPTS[0])
    try:
        with pytest.raises(Boom):
            for event in generate(target, _decode, PROMPTS[0], drafter=ModelDrafter(draft),
                                  draft_tokens=4, max_tokens=N):
                if isinstance(event, Round):
                    committed.extend(event.emitted)
    finally:
        del target.verify
    assert target.cache_len == len(committed) - 1
    assert draft.cache_len <= len(committed) - 1


def test_stop_conditions(torch_models):
    target = torch_models["target"]
    plain, _ = _run(target, PROMPTS[0])
    stop_token = plain[10]
    first_stop = plain.index(stop_token)
    spec, done = _run(target, PROMPTS[0], ModelDrafter(torch_models["self"]), draft_tokens=6,
                      stop_ids=frozenset({stop_token}))
    assert spec == plain[:first_stop] and done.stats.finish_reason == "stop"

    stop_text = _decode(plain[5:7])
    _, done = _run(target, PROMPTS[0], ModelDrafter(torch_models["self"]), draft_tokens=6,
                   stop_strings=(stop_text,))
    assert done.stats.finish_reason == "stop_string" and stop_text not in done.text

    _, done = _run(target, PROMPTS[0], ModelDrafter(torch_models["self"]), draft_tokens=6)
    assert done.stats.finish_reason == "length" and done.stats.tokens == N

    flag = {"stop": False}
    events = []
    for event in generate(target, _decode, PROMPTS[0], drafter=ModelDrafter(torch_models["self"]),
                          draft_tokens=3, max_tokens=N, should_stop=lambda: flag["stop"]):
        events.append(event)
        if isinstance(event, Round) and event.index == 2:
            flag["stop"] = True  # pressed mid-answer: honoured before the next round
    assert events[-1].stats.finish_reason == "cancelled"
    assert max(e.index for e in events if isinstance(e, Round)) == 2


def test_context_limit_is_a_clear_finish(torch_models):
    target = torch_models["target"]
    prompt = [5] * (target.context_length - 6)
    tokens, done = _run(target, prompt, ModelDrafter(torch_models["self"]), draft_tokens=8)
    assert done.stats.finish_reason == "context"
    assert len(prompt) + len(tokens) <= target.context_length + 1
    from app.engine.events import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="context holds"):
        _run(target, [5] * target.context_length)


def test_events_carry_the_round(torch_models):
    target = torch_models["target"]
    events = list(generate(target, _decode, PROMPTS[0], drafter=ModelDrafter(torch_models["near"]),
                           draft_tokens=4, max_tokens=N, trees="off"))  # (tree rounds: test_tree_rounds.py)
    rounds = [e for e in events if isinstance(e, Round) and e.drafted]
    done = events[-1]
    assert isinstance(done, Finished)
    for r in rounds:
        assert len(r.draft_p) == len(r.target_q) == len(r.drafted) == r.k <= 4
        assert all(0.0 <= v <= 1.0 for v in r.draft_p + r.target_q)
        assert r.emitted[: r.accepted] == r.drafted[: r.accepted]
        assert len(r.emitted) == r.accepted + 1
        assert r.verify_s > 0 and r.draft_s > 0
    assert done.stats.accepted == sum(r.accepted for r in rounds)
    assert done.stats.drafted == sum(len(r.drafted) for r in rounds)
    assert sum(done.stats.drafted_by_position) == done.stats.drafted
    assert done.stats.tokens == N
