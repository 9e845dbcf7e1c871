"""Speculation on hybrid targets (Qwen3.5-style: Gated DeltaNet layers with recurrent state, and
full attention), on both backends: exact at temperature 0 for every k and every rollback length,
the recurrent state after any round equal to the state of the model having read only the
committed tokens, the sampling distribution unchanged, a failed round rolled back, and a
follow-up turn reusing the cache only where nothing needs cutting."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.engine.backends import load_backend
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from app.engine.events import Notice, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from tests.factories import add_noise, save_qwen35, tiny_qwen35
from tests.scripted import ScriptedDrafter

PROMPTS = [
    [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198],
    [1, 520, 198, 40, 41, 42, 40, 41, 42, 40, 41],  # repetitive: prompt lookup finds matches
]
N = 40
# float32, relative to each array's largest magnitude (the recurrent states reach 8 here): the
# verify pass's chunked kernel against one-token steps differs by about 1e-6 of it
TOLERANCE = 1e-5


def _close(a: np.ndarray, b: np.ndarray) -> float:
    """How far apart, in units of b's largest magnitude (at least 1)."""
    return float(np.abs(a - b).max() / max(1.0, float(np.abs(b).max())))


def _decode(ids):
    return " ".join(map(str, ids))


def _run(target, prompt, drafter=None, max_tokens=N, **kw):
    events = list(generate(target, _decode, prompt, drafter=drafter, max_tokens=max_tokens, **kw))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events


@pytest.fixture(scope="module")
def hybrid_folders(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    tokenizer = tiny_pair["target"]
    return {"target": save_qwen35(tiny_qwen35(3), root / "target", tokenizer),
            # a noisy copy: accepted about 60% of the time, and a hybrid itself (its own rollbacks)
            "near": save_qwen35(add_noise(tiny_qwen35(3), 0.02, seed=9), root / "near", tokenizer)}


def _models(folders, backend):
    return {"target": load_backend(folders["target"], backend), "near": load_backend(folders["near"], backend),
            "fresh": load_backend(folders["target"], backend)}  # reads committed tokens only


@pytest.fixture(scope="module")
def torch_models(hybrid_folders):
    return _models(hybrid_folders, "torch")


# PyTorch rebuilds recurrent state after a rollback in two ways (torch_cache.STATE_REPLAYS): the
# recurrent layers alone on the inputs they recorded in the pass, or the whole model again
STATE_REPLAYS = ["layers", "model"]


def _replaying(models, mode):
    for backend in models.values():
        backend.state_replay = mode
    return models


@pytest.fixture(params=STATE_REPLAYS)
def torch_hybrid(torch_models, request):
    yield _replaying(torch_models, request.param)
    _replaying(torch_models, "layers")


@pytest.fixture(scope="module")
def mlx_hybrid(hybrid_folders):
    pytest.importorskip("mlx_lm")
    return _models(hybrid_folders, "mlx")


def _check_exact(models, prompts, ks):
    target = models["target"]
    drafted = set()
    for prompt in prompts:
        plain, _ = _run(models["fresh"], prompt)
        assert len(plain) == N
        for k in ks:
            scripted = ScriptedDrafter(prompt, plain, target.vocab_limit)
            spec, events = _run(target, prompt, scripted, draft_tokens=k)
            assert spec == plain, f"scripted, k={k}"
            assert scripted.got == scripted.expected[:len(scripted.got)], f"k={k}"
            assert set(range(k + 1)) <= scripted.rejected, f"k={k}: rollbacks of {sorted(scripted.rejected)}"
            assert not [e for e in events if isinstance(e, Notice)], k  # it speculated all the way
            for name, drafter in (("draft model", ModelDrafter(models["near"])),
                                  ("prompt lookup", PromptLookupDrafter()),
                                  ("lookup then model", LookupThenModelDrafter(ModelDrafter(models["near"]),
                                                                               min_tokens=1))):
                spec, events = _run(target, prompt, drafter, draft_tokens=k)
                assert spec == plain, f"{name}, k={k}, prompt {prompt}"
                if any(isinstance(e, Round) and e.drafted for e in events):
                    drafted.add(name)
    assert drafted == {"draft model", "prompt lookup", "lookup then model"}  # each one speculated


def test_torch_hybrid_speculation_equals_the_target_alone(torch_hybrid):
    _check_exact(torch_hybrid, PROMPTS, ks=range(1, 9))


def test_mlx_hybrid_speculation_equals_the_target_alone(mlx_hybrid):
    _check_exact(mlx_hybrid, PROMPTS[:1], ks=range(1, 9))


def test_a_noisy_hybrid_draft_is_accepted_often_and_rolls_back_too(torch_hybrid):
    """The pair the other tests lean on really exercises both sides: many drafts accepted,
    many rejected, and the target's rejected rounds replayed."""
    _, events = _run(torch_hybrid["target"], PROMPTS[0], ModelDrafter(torch_hybrid["near"]), draft_tokens=4)
    stats = events[-1].stats
    assert 0.3 < stats.acceptance_rate < 0.95, stats.acceptance_rate
    rounds = [e for e in events if isinstance(e, Round) and e.drafted]
    assert any(e.replayed for e in rounds) and any(e.accepted == len(e.drafted) for e in rounds)
    assert stats.replayed == sum(e.replayed for e in rounds)
    assert all(e.rollback_s > 0 for e in rounds)
    assert stats.rollback_s == pytest.approx(sum(e.rollback_s for e in rounds))


# --- the state after each round ----------------------------------------------------------------

def _arrays(backend) -> list[np.ndarray]:
    """Every array the cache holds for its positions: the recurrent layers' conv and recurrent
    states, and the attention layers' keys and values."""
    out = []
    if backend.name == "torch":
        for layer in backend.cache.snapshot():
            for name in ("conv_states", "recurrent_states"):
                out += [t.float().numpy() for t in layer[name].values() if t is not None]
        for layer in backend.cache.store.layers:
            if hasattr(layer, "keys") and layer.keys is not None:
                out += [layer.keys.float().numpy(), layer.values.float().numpy()]
    else:
        for layer in backend.cache.snapshot():
            out += [np.array(a) for a in layer if a is not None]
        for layer in backend.cache.layers:
            if getattr(layer, "keys", None) is not None:
                out += [np.array(layer.keys[..., :layer.offset, :]), np.array(layer.values[..., :layer.offset, :])]
    return out


def _read_one_by_one(fresh, tokens, prompt_len):
    """The same model having read `tokens`: the prompt in one pass, then each token alone."""
    fresh.reset()
    fresh.prefill(tokens[:prompt_len])
    for token in tokens[prompt_len:]:
        fresh.prefill([token])


def _assert_same_state(live, fresh, committed, prompt_len, where):
    n = live.cache_len
    assert n == len(committed) - 1, where  # all but the pending token: rejected drafts are gone
    _read_one_by_one(fresh, committed[:n], prompt_len)
    got, want = _arrays(live), _arrays(fresh)
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape, where
        assert _close(a, b) < TOLERANCE, (where, _close(a, b))


def _check_state_after_each_round(models):
    target, fresh = models["target"], models["fresh"]
    prompt = PROMPTS[0]
    plain, _ = _run(fresh, prompt, max_tokens=24)
    scripted = ScriptedDrafter(prompt, plain, target.vocab_limit)
    committed = list(prompt)
    for event in generate(target, _decode, prompt, drafter=scripted, draft_tokens=4, max_tokens=24):
        if isinstance(event, Round) and event.emitted:
            committed.extend(event.emitted)
            _assert_same_state(target, fresh, committed, len(prompt), f"round {event.index}")
    assert set(range(5)) <= scripted.rejected  # every rollback length was checked


def test_torch_hybrid_state_after_every_round_is_the_committed_tokens_state(torch_hybrid):
    _check_state_after_each_round(torch_hybrid)


def test_mlx_hybrid_state_after_every_round_is_the_committed_tokens_state(mlx_hybrid):
    _check_state_after_each_round(mlx_hybrid)


@pytest.mark.parametrize("backend, state_replay", [("torch", "layers"), ("torch", "model"), ("mlx", None)])
def test_the_state_check_catches_a_rollback_that_keeps_the_rejected_drafts(backend, state_replay, request,
                                                                           monkeypatch):
    """With the restore of recurrent state left out, the same check fails on both backends, with
    either replay on PyTorch (the layers alone then advance the rejected drafts' state)."""
    if backend == "torch":
        models = _replaying(request.getfixturevalue("torch_models"), state_replay)
        request.addfinalizer(lambda: _replaying(models, "layers"))
    else:
        models = request.getfixturevalue("mlx_hybrid")
    monkeypatch.setattr(type(models["target"].cache), "restore", lambda self, state: None)
    with pytest.raises(AssertionError):
        _check_state_after_each_round(models)


def test_the_state_check_catches_a_layer_replay_that_runs_no_layer(torch_models, monkeypatch):
    """Restored but not advanced over the kept positions, the layer replay's state fails the check
    too: the recurrent layers' own pass in the rewind is what makes it right."""
    from app.engine.backends.layer_replay_torch import MixerInputs

    monkeypatch.setattr(MixerInputs, "replay", lambda self, n: True)
    with pytest.raises(AssertionError):
        _check_state_after_each_round(_replaying(torch_models, "layers"))


def test_layer_replay_hooks_the_mixers_only_between_a_checkpoint_and_its_rewind(torch_models):
    """Plain passes pay nothing: the recording hooks are on only while a pass may be rolled back,
    and a reset in between (a cancelled answer) takes them off too."""
    target = _replaying(torch_models, "layers")["target"]
    mixers = [m for m in target.model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    hooked = lambda: sum(len(m._forward_pre_hooks) for m in mixers)  # noqa: E731
    target.reset()
    target.prefill(PROMPTS[0])
    assert hooked() == 0
    mark = target.checkpoint()
    assert hooked() == len(mixers) == 3
    target.prefill([40, 41, 42])
    assert target.rewind(mark, mark.length + 2) == mark.length + 2 and target.recomputed == 2
    assert hooked() == 0
    target.checkpoint()
    target.reset()
    assert hooked() == 0


@pytest.mark.parametrize("state_replay", STATE_REPLAYS)
def test_layer_replay_runs_the_recurrent_layers_alone(torch_models, state_replay):
    """Inside a rewind, layer replay calls the Gated DeltaNet mixers and nothing else of the model
    (no decoder layer, no attention, no head), and the engine then passes no token again; the
    whole-model replay calls nothing in the rewind and passes the kept tokens after it. So the
    layer replay cannot silently fall back to the whole model."""
    target, fresh = _replaying(torch_models, state_replay)["target"], torch_models["fresh"]
    prompt = PROMPTS[0]
    plain, _ = _run(fresh, prompt, max_tokens=16)
    calls, where, replayed_after = {}, {"rewind": False, "after": False}, []

    def counter(kind):
        def count(module, args):
            if where["rewind"]:
                calls[kind] = calls.get(kind, 0) + 1
        return count

    hooks = [target.model.register_forward_pre_hook(counter("model"))]
    for module in target.model.modules():
        kind = type(module).__name__
        if kind.endswith(("DecoderLayer", "Attention", "GatedDeltaNet", "MLP")):
            hooks.append(module.register_forward_pre_hook(counter(kind.removeprefix("Qwen3_5"))))
    real_rewind, real_prefill = target.rewind, target.prefill

    def rewind(mark, length):
        where["rewind"] = True
        try:
            return real_rewind(mark, length)
        finally:
            where.update(rewind=False, after=True)

    def prefill(ids):
        if where["after"]:  # verify_round's replay, right after the rewind
            replayed_after.append(len(ids))
            where["after"] = False
        real_prefill(ids)

    target.rewind, target.prefill = rewind, prefill
    try:
        spec, events = _run(target, prompt, ScriptedDrafter(prompt, plain, target.vocab_limit), draft_tokens=4,
                            max_tokens=16)
    finally:
        del target.rewind, target.prefill
        for hook in hooks:
            hook.remove()
        _replaying(torch_models, "layers")
    assert spec == plain
    replayed = sum(e.replayed for e in events if isinstance(e, Round))
    assert replayed > 0 and replayed_after
    if state_replay == "layers":
        assert set(calls) == {"GatedDeltaNet"}, calls
        assert calls["GatedDeltaNet"] % 3 == 0  # the model's three recurrent layers, once each per rollback
        assert not any(replayed_after)  # the engine passed no token again
    else:
        assert calls == {}
        assert sum(replayed_after) == replayed


def test_a_hybrid_draft_models_state_holds_only_committed_tokens(torch_hybrid, hybrid_folders):
    """The draft's own recurrent state goes back to its checkpoint and reads the kept tokens
    again: after every round it holds a prefix of the committed tokens, and exactly that."""
    target, draft = torch_hybrid["target"], torch_hybrid["near"]
    fresh_draft = load_backend(hybrid_folders["near"], "torch")
    prompt = PROMPTS[0]
    committed, partial, recomputed = list(prompt), 0, 0
    for event in generate(target, _decode, prompt, drafter=ModelDrafter(draft), draft_tokens=4, max_tokens=24):
        if isinstance(event, Round) and event.emitted:
            committed.extend(event.emitted)
            partial += 0 < event.accepted < len(event.drafted)
            recomputed += draft.recomputed  # by the draft's own layers in its last rewind
            n = draft.cache_len
            assert n <= len(committed) - 1
            _read_one_by_one(fresh_draft, committed[:n], len(prompt))
            for a, b in zip(_arrays(draft), _arrays(fresh_draft), strict=True):
                assert _close(a, b) < TOLERANCE
    assert partial  # rounds that rejected part of a proposal were among those checked
    assert (recomputed > 0) == (draft.state_replay == "layers")  # the draft's replay ran as chosen


def test_a_failed_verify_pass_leaves_the_hybrid_state_at_its_checkpoint(torch_hybrid):
    """A pass that fails after it ran (its recurrent states already written in place) is rolled
    back to the checkpoint: the cache holds the committed tokens' state, not the drafts'."""
    target, fresh = torch_hybrid["target"], torch_hybrid["fresh"]
    prompt = PROMPTS[0]
    plain, _ = _run(fresh, prompt, max_tokens=12)

    class Boom(RuntimeError):
        pass

    real_verify, calls = target.verify, {"n": 0}

    def failing_verify(ids, proposal, params):
        calls["n"] += 1
        verdict = real_verify(ids, proposal, params)
        if calls["n"] == 3:
            raise Boom("the pass failed")
        return verdict

    target.verify = failing_verify
    committed = list(prompt)
    try:
        with pytest.raises(Boom):
            for event in generate(target, _decode, prompt, drafter=ScriptedDrafter(prompt, plain, target.vocab_limit),
                                  draft_tokens=3, max_tokens=12):
                if isinstance(event, Round):
                    committed.extend(event.emitted)
    finally:
        del target.verify
    _assert_same_state(target, fresh, committed, len(prompt), "after the failed pass")


# --- follow-up turns ---------------------------------------------------------------------------

def test_a_hybrid_follow_up_reuses_its_cache_only_where_nothing_is_cut(torch_hybrid):
    """Recurrent state cannot be cut back: a follow-up that extends what the cache holds keeps
    it (and writes what a fresh cache writes), an edit that shares less starts afresh."""
    target, fresh = torch_hybrid["target"], torch_hybrid["fresh"]
    first = PROMPTS[0]
    answer, _ = _run(target, first, PromptLookupDrafter(), draft_tokens=3, max_tokens=12)
    follow_up = [*first, *answer, 198, 1, 520, 198, 40, 41]
    want, _ = _run(fresh, follow_up, max_tokens=12)
    got, events = _run(target, follow_up, PromptLookupDrafter(), draft_tokens=3, max_tokens=12, reuse_cache=True)
    assert got == want
    assert events[-1].stats.reused_tokens == len(first) + len(answer) - 1
    edited = [*first[:5], 700, 701, 702, 198]
    want, _ = _run(fresh, edited, max_tokens=12)
    got, events = _run(target, edited, PromptLookupDrafter(), draft_tokens=3, max_tokens=12, reuse_cache=True)
    assert got == want and events[-1].stats.reused_tokens == 0


# --- temperature above 0 -----------------------------------------------------------------------

VOCAB = 16
SMALL_PROMPT = [3, 7, 1, 12]


@pytest.fixture(scope="module")
def small_hybrids(tmp_path_factory):
    root = tmp_path_factory.mktemp("small-hybrid")
    return (save_qwen35(tiny_qwen35(21, vocab=VOCAB, hidden=32, scale=3.0, context=64), root / "target"),
            save_qwen35(tiny_qwen35(22, vocab=VOCAB, hidden=32, scale=3.0, context=64), root / "draft"))


@pytest.mark.parametrize("state_replay", STATE_REPLAYS)
def test_hybrid_speculative_sampling_matches_the_target(small_hybrids, state_replay):
    """Tokens 2 and 3 of answers drafted one token a round by another hybrid: where round 1
    rejects its draft, token 3 is sampled from a state that was rolled back and replayed."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_engine_sampling import ALPHA, _p_value, exact_marginals

    params = SamplingParams(temperature=1.0, seed=7)
    model = AutoModelForCausalLM.from_pretrained(str(small_hybrids[0]), dtype=torch.float32).eval()
    exact = exact_marginals(model, SMALL_PROMPT, params, depth=3, vocab=VOCAB)
    target, draft = (load_backend(folder, "torch", state_replay=state_replay) for folder in small_hybrids)
    drafter = ModelDrafter(draft)
    counts, replayed = np.zeros((3, VOCAB)), 0
    for i in range(1500):
        seeded = replace(params, seed=params.seed * 100_003 + i)
        events = list(generate(target, lambda ids: "", SMALL_PROMPT, drafter=drafter, draft_tokens=1,
                               max_tokens=3, params=seeded))
        replayed += events[-1].stats.replayed
        tokens = [t for e in events if isinstance(e, Round) for t in e.emitted]
        for position, t in enumerate(tokens):
            counts[position, t] += 1
    assert replayed > 200  # many answers went through a rollback of the recurrent state
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position
