"""Follow-up turns reuse the caches (app/engine/reuse.py): the next answer prefills only what the
caches do not already hold, and writes exactly what an answer from empty caches writes."""

from __future__ import annotations

import pytest

from app.draft_choice import PROMPT_LOOKUP, DraftChoice
from app.engine.backends import load_backend
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from app.engine.events import Finished
from app.engine.sampling import SamplingParams
from tests.test_engine_trust import _run, _with_sliding_window

TURN_1 = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198]
NEW_MESSAGE = [2, 198, 1, 700, 701, 702, 703, 2, 198, 1, 520, 198]


@pytest.fixture(scope="module", params=["torch", "mlx"])
def models(request, tiny_pair):
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
    suffix = "_mlx" if request.param == "mlx" else ""

    def load(role):
        return load_backend(tiny_pair[role + suffix], request.param)

    # the pair that reuses, and a fresh pair for every comparison
    return {"target": load("target"), "near": load("near"), "fresh": load("target"), "fresh_near": load("near")}


def _prefilled(backend):
    """Record how many tokens each prefill pass of `backend` is given (a spy on the real one)."""
    sizes, real = [], backend.prefill
    backend.prefill = lambda ids: (sizes.append(len(ids)), real(ids))[1]
    return sizes


def _finished(events) -> Finished:
    return events[-1]


@pytest.fixture(autouse=True)
def _empty_caches(request):
    """Each test starts from empty caches (the backends are shared by the module's tests)."""
    if "models" in request.fixturenames:
        for backend in request.getfixturevalue("models").values():
            backend.reset()


@pytest.mark.parametrize("drafter", ["none", "model", "lookup-then-model", "lookup"])
def test_a_follow_up_turn_prefills_only_its_new_tokens_and_writes_the_same(models, drafter):
    target, fresh = models["target"], models["fresh"]

    def make(role):
        near = models[role]
        return {"none": None, "model": ModelDrafter(near), "lookup": PromptLookupDrafter(),
                "lookup-then-model": LookupThenModelDrafter(ModelDrafter(near), min_tokens=1)}[drafter]

    first, events = _run(target, TURN_1, make("near"), max_tokens=12, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == 0  # nothing was held yet
    turn_2 = [*TURN_1, *first, *NEW_MESSAGE]
    draft_sizes = _prefilled(models["near"]) if drafter in ("model", "lookup-then-model") else None
    try:
        again, events = _run(target, turn_2, make("near"), max_tokens=20, reuse_cache=True)
    finally:
        models["near"].__dict__.pop("prefill", None)
    stats = _finished(events).stats
    # the target held the first prompt and the first answer but its last token (never fed back)
    assert stats.reused_tokens == len(TURN_1) + len(first) - 1
    assert "prefill 13 tokens" in stats.summary() and f"({stats.reused_tokens} reused)" in stats.summary()
    if draft_sizes is not None:
        assert draft_sizes and draft_sizes[0] <= len(turn_2) - len(TURN_1)  # the draft kept at least turn 1
    alone, events = _run(fresh, turn_2, make("fresh_near"), max_tokens=20)
    assert _finished(events).stats.reused_tokens == 0
    assert again == alone


def test_an_edit_cuts_back_to_the_common_prefix_and_regenerate_reuses_all_but_one(models):
    target, fresh = models["target"], models["fresh"]
    first, _ = _run(target, TURN_1, max_tokens=10, reuse_cache=True)
    edited = [*TURN_1[:5], 640, 641, 642, 198]  # the user edited their message after 5 tokens
    tokens, events = _run(target, edited, max_tokens=10, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == 5
    assert tokens == _run(fresh, edited, max_tokens=10)[0]
    again, events = _run(target, edited, max_tokens=10, reuse_cache=True)  # regenerate
    assert _finished(events).stats.reused_tokens == len(edited) - 1
    assert again == tokens


def test_a_seeded_sampled_answer_is_the_same_with_reuse(models):
    target, fresh = models["target"], models["fresh"]
    params = SamplingParams(temperature=0.9, seed=5)
    first, _ = _run(target, TURN_1, ModelDrafter(models["near"]), max_tokens=8, params=params, reuse_cache=True)
    turn_2 = [*TURN_1, *first, *NEW_MESSAGE]
    reused, events = _run(target, turn_2, ModelDrafter(models["near"]), max_tokens=16, params=params, reuse_cache=True)
    assert _finished(events).stats.reused_tokens > len(TURN_1)
    assert reused == _run(fresh, turn_2, ModelDrafter(models["fresh_near"]), max_tokens=16, params=params)[0]


def test_without_reuse_or_after_the_cache_changed_behind_the_engine_it_prefills_everything(models):
    target = models["target"]
    first, _ = _run(target, TURN_1, max_tokens=6, reuse_cache=True)
    turn_2 = [*TURN_1, *first, *NEW_MESSAGE]
    assert _finished(_run(target, turn_2, max_tokens=4)[1]).stats.reused_tokens == 0  # not asked
    _run(target, turn_2, max_tokens=4, reuse_cache=True)
    target.top2_gap(TURN_1)  # another caller used (and reset) the cache
    assert _finished(_run(target, turn_2, max_tokens=4, reuse_cache=True)[1]).stats.reused_tokens == 0


def test_a_pass_that_fails_midway_leaves_nothing_to_reuse(models):
    target, fresh = models["target"], models["fresh"]
    _run(target, TURN_1, max_tokens=6, reuse_cache=True)
    real, calls = target.next_token, []

    def fails_on_the_third_pass(ids, params):
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("out of memory in the middle of a pass")
        return real(ids, params)

    target.next_token = fails_on_the_third_pass
    try:
        with pytest.raises(MemoryError):
            _run(target, TURN_1, max_tokens=6, reuse_cache=True)
    finally:
        del target.next_token
    assert target.held == ()
    tokens, events = _run(target, TURN_1, max_tokens=6, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == 0
    assert tokens == _run(fresh, TURN_1, max_tokens=6)[0]


def test_a_reader_that_stops_midway_leaves_a_whole_cache_to_reuse(models):
    from app.engine.speculative import generate

    target, fresh = models["target"], models["fresh"]
    stream = generate(target, lambda ids: " ".join(map(str, ids)), TURN_1, max_tokens=30, reuse_cache=True)
    for _ in range(4):  # the prefill and three steps, then the window closed the answer
        next(stream)
    stream.close()
    assert len(target.held) == target.cache_len > len(TURN_1)
    tokens, events = _run(target, TURN_1, max_tokens=10, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == len(TURN_1) - 1
    assert tokens == _run(fresh, TURN_1, max_tokens=10)[0]


def test_an_mlx_sliding_window_cache_is_reused_only_where_nothing_is_cut(tiny_pair, tmp_path):
    """mlx-lm's ring buffer cannot be cut back once it has wrapped, but a follow-up that extends
    all it holds appends to it as mlx-lm's own chunked prefill does: the same tokens as fresh."""
    pytest.importorskip("mlx_lm")
    folder = _with_sliding_window(tiny_pair["target_mlx"], tmp_path / "sliding")
    target, fresh = load_backend(folder, "mlx"), load_backend(folder, "mlx")
    first, _ = _run(target, TURN_1, max_tokens=12, reuse_cache=True)
    turn_2 = [*TURN_1, *first, *NEW_MESSAGE]
    tokens, events = _run(target, turn_2, max_tokens=8, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == len(TURN_1) + len(first) - 1
    assert tokens == _run(fresh, turn_2, max_tokens=8)[0]
    edited = [*TURN_1[:3], *NEW_MESSAGE]  # shares less than it holds: it would need a cut
    tokens, events = _run(target, edited, max_tokens=8, reuse_cache=True)
    assert _finished(events).stats.reused_tokens == 0
    assert tokens == _run(fresh, edited, max_tokens=8)[0]


def test_the_runner_answers_a_follow_up_from_its_kept_caches(tiny_pair):
    """Through Runner.chat, as the window and the CLI ask: turn 2 keeps turn 1 in both caches and
    writes what a runner that has never answered before writes."""
    from app.runner import ChatRequest, Runner

    def chat(runner, messages):
        events = list(runner.chat(ChatRequest(tuple(messages), max_tokens=16)))
        return events[-1]

    runner, fresh = Runner(), Runner()
    for r in (runner, fresh):
        r.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]), progress=lambda m: None)
    turn_1 = [{"role": "user", "content": "Name three rivers."}]
    first = chat(runner, turn_1)
    assert first.stats.reused_tokens == 0
    turn_2 = [*turn_1, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And lakes?"}]
    second = chat(runner, turn_2)
    assert second.stats.reused_tokens >= first.stats.prompt_tokens  # at least turn 1's prompt stayed
    assert second.stats.reused_tokens < second.stats.prompt_tokens
    alone = chat(fresh, turn_2)
    assert alone.stats.reused_tokens == 0 and alone.text == second.text


# --- several conversations (app/engine/kept_caches.py) ------------------------------------------

def _turn(runner, conversation, messages):
    from app.runner import ChatRequest

    return list(runner.chat(ChatRequest(tuple(messages), max_tokens=8, conversation=conversation)))[-1]


@pytest.fixture
def runner_pair(tiny_pair):
    from app.runner import Runner

    runners = Runner(), Runner()
    for r in runners:
        r.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]), progress=lambda m: None)
    return runners


def test_going_back_to_an_earlier_chat_finds_its_caches(runner_pair):
    runner, fresh = runner_pair
    a = [{"role": "user", "content": "Name three rivers."}]
    b = [{"role": "user", "content": "Write a short poem about the sea, please."}]
    first_a = _turn(runner, "chat 1", a)
    _turn(runner, "chat 2", b)  # chat 1's caches are set aside
    assert runner.kept.conversations == ["chat 1"] and runner.kept.set_aside_bytes > 0
    assert runner.kept.summary().startswith("1 other chat kept, ")
    a2 = [*a, {"role": "assistant", "content": first_a.text}, {"role": "user", "content": "And lakes?"}]
    again = _turn(runner, "chat 1", a2)
    assert again.stats.reused_tokens >= first_a.stats.prompt_tokens  # chat 1 came back whole
    assert runner.kept.conversations == ["chat 2"]
    assert again.text == _turn(fresh, "", a2).text
    assert _turn(runner, "a new chat", b).stats.reused_tokens == 0  # never seen: empty caches
    _turn(runner, "", b)  # a one-off (the pair trial, the CLI) ...
    _turn(runner, "chat 1", a2)
    assert "" not in runner.kept.conversations  # ... is not kept as a chat to come back to


def test_the_least_recently_used_chat_leaves_first_when_the_budget_is_spent(runner_pair):
    runner, _ = runner_pair
    chats = {name: [{"role": "user", "content": f"Tell me about {name}."}] for name in ("rivers", "lakes", "seas")}
    _turn(runner, "rivers", chats["rivers"])
    _turn(runner, "lakes", chats["lakes"])
    one_chat = runner.kept.set_aside_bytes
    runner.kept.budget = one_chat + one_chat // 2  # room for one set-aside chat, not two
    _turn(runner, "seas", chats["seas"])  # lakes set aside: rivers, the older, goes
    assert runner.kept.conversations == ["lakes"]
    assert runner.kept.set_aside_bytes <= runner.kept.budget
    assert _turn(runner, "lakes", chats["lakes"]).stats.reused_tokens > 0
    assert _turn(runner, "rivers", chats["rivers"]).stats.reused_tokens == 0


def test_a_new_pair_keeps_nothing_of_the_old_one(runner_pair, tiny_pair):
    runner, _ = runner_pair
    _turn(runner, "chat 1", [{"role": "user", "content": "Hello there."}])
    _turn(runner, "chat 2", [{"role": "user", "content": "Hi."}])
    assert runner.kept.conversations
    runner.load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, progress=lambda m: None)
    assert runner.kept.conversations == [] and runner.kept.summary() == ""
    assert _turn(runner, "chat 1", [{"role": "user", "content": "Hello there."}]).stats.reused_tokens == 0
