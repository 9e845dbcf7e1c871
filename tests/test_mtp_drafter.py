"""A checkpoint's built-in MTP layer as its drafter (app/engine/mtp.py), on both backends: a tiny
Qwen3.5 hybrid and its MTP layer trained together on a task only the right hidden state solves
(tests/mtp_training.py) draft far above chance and fall to chance when the layer reads the hidden
state of the wrong position; speculation stays exact at every k and at temperature 1; the MLX
layer (ours) computes what transformers' MtpLayer computes; a follow-up turn's layer cache equals
a fresh one's; a checkpoint without MTP weights is refused with the reason."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.engine.backends import load_backend
from app.engine.events import Round
from app.engine.mtp import MTPDrafter, load_mtp_drafter
from app.engine.speculative import generate
from app.models.errors import ModelFileError
from app.models.mtp_weights import find_mtp
from tests.factories import save_qwen35, tiny_qwen35
from tests.head_sampling import check_sampling_keeps_the_target
from tests.mtp_training import FIRST, VOCAB, save_trained

PERIODIC = [1, 5, 9, 17, 5, 9, 17, 5]  # what the pair was trained on: the MTP layer should be right
OTHER = [1, 4, 8, 15, 22, 3, 7]  # no period: the target continues its own way, the layer errs more
N = 30
CHANCE = 1 / (VOCAB - FIRST)


def _run(target, prompt, drafter=None, max_tokens=N, **kw):
    events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=max_tokens, **kw))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1].stats


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder, losses = save_trained(tmp_path_factory.mktemp("mtp") / "qwen35-mtp")
    return folder


@pytest.fixture(scope="module", params=["torch", "mlx"])
def pair(request, trained):
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(trained, request.param)
    return target, load_mtp_drafter(target), load_backend(trained, request.param)


def test_the_checkpoints_mtp_weights_are_found_and_the_loaders_drop_nothing_else(trained):
    found = find_mtp(trained)
    assert found is not None and found.layers == 1 and found.prefix == "mtp."
    assert {"fc.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= set(found.names())


def test_a_trained_mtp_layer_drafts_far_above_chance_and_stays_exact(pair):
    target, drafter, fresh = pair
    for prompt in (PERIODIC, OTHER):
        plain, _ = _run(fresh, prompt)
        for k in range(1, 9):
            tokens, stats = _run(target, prompt, drafter, draft_tokens=k)
            assert tokens == plain, (prompt, k)
            assert stats.drafted > 0
            if k == 1:  # one step reads the target's own state: what the layer was trained for
                assert stats.accepted / stats.drafted > 0.7, (prompt, stats.accepted, stats.drafted)


class _OffByOne(MTPDrafter):
    """The wiring bug the acceptance test must catch: each token read beside the hidden state of
    the position before the right one."""

    def _take(self, committed, state):
        before = getattr(self, "_carry", None)
        if before is None or state.start == 0:
            before = state.hidden[:1]
        shifted = self.head.concat(before, state.hidden[:-1])
        self._carry = state.hidden[-1:]
        super()._take(committed, replace(state, hidden=shifted))


def test_the_layer_fed_the_wrong_positions_state_falls_to_chance(pair):
    target, drafter, fresh = pair
    wrong = _OffByOne(drafter.head)
    plain, _ = _run(fresh, PERIODIC)
    tokens, stats = _run(target, PERIODIC, wrong, draft_tokens=1)
    assert tokens == plain  # a bad drafter costs speed, never the answer
    right, right_stats = _run(target, PERIODIC, drafter, draft_tokens=1)
    assert stats.accepted / stats.drafted < 0.3 < 0.7 < right_stats.accepted / right_stats.drafted
    assert stats.accepted / stats.drafted < 3 * CHANCE + 0.15


def test_the_mlx_layer_computes_what_transformers_mtp_layer_computes(trained):
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import torch

    torch_target, mlx_target = load_backend(trained, "torch"), load_backend(trained, "mlx")
    torch_head, mlx_head = load_mtp_drafter(torch_target).head, load_mtp_drafter(mlx_target).head
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, torch_target.model.config.hidden_size)).astype(np.float32)
    tokens = [int(t) for t in rng.integers(FIRST, VOCAB, 6)]
    with torch.inference_mode():
        a = torch_head._pass(torch.tensor([tokens]), torch.from_numpy(rows)[None])
        a2 = torch_head._pass(torch.tensor([[7]]), a[:, -1:])  # a chained step, on the cache
        logits_a = torch_target.model.get_output_embeddings()(a2)[0, -1].numpy()
    b = mlx_head._pass(mx.array([tokens]), mx.array(rows)[None])
    b2 = mlx_head._pass(mx.array([[7]]), b[:, -1:])
    logits_b = np.array(mlx_head._logits(b2))
    assert np.abs(a.numpy() - np.array(b)).max() < 1e-4
    assert np.abs(logits_a - logits_b).max() < 1e-4 * max(1.0, np.abs(logits_a).max())


def _layer_keys(head) -> np.ndarray:
    if hasattr(head.cache, "layers"):  # transformers' DynamicCache
        return head.cache.layers[0].keys[0].float().numpy()
    import mlx.core as mx

    keys = head.cache.keys[..., : head.cache.offset, :]
    mx.eval(keys)
    return np.array(keys[0])


def test_a_follow_up_turn_keeps_the_layers_cache_as_a_fresh_one_would_build_it(pair, trained):
    target, drafter, fresh = pair
    first, _ = _run(target, PERIODIC, drafter, draft_tokens=2, max_tokens=12, reuse_cache=True)
    follow = [*PERIODIC, *first, 3, 11, 6, 3, 11]
    tokens, stats = _run(target, follow, drafter, draft_tokens=2, max_tokens=12, reuse_cache=True)
    assert stats.reused_tokens > len(PERIODIC)  # the target kept its cache: the layer's must line up
    plain, _ = _run(fresh, follow, max_tokens=12)
    assert tokens == plain
    again = load_mtp_drafter(fresh)
    fresh.reset()
    _run(fresh, follow, again, draft_tokens=2, max_tokens=12)
    assert again._pairs == drafter._pairs
    assert np.abs(_layer_keys(drafter.head) - _layer_keys(again.head)).max() < 1e-4


def test_mtp_speculative_sampling_matches_the_target(trained):
    """Temperature 1: the layer's own distributions go to the Leviathan/Chen rule, so tokens 2
    and 3 keep the target's marginals."""
    target = load_backend(trained, "torch")
    check_sampling_keeps_the_target(trained, target, load_mtp_drafter(target), PERIODIC[:6], VOCAB, answers=1200)


def test_a_checkpoint_without_mtp_weights_is_refused_with_the_reason(tmp_path):
    folder = save_qwen35(tiny_qwen35(4, vocab=64), tmp_path / "plain")
    assert find_mtp(folder) is None
    with pytest.raises(ModelFileError, match="no built-in multi-token-prediction layer"):
        load_mtp_drafter(load_backend(folder, "torch"))


def test_incomplete_mtp_weights_are_named(tmp_path):
    import torch

    model = tiny_qwen35(4, vocab=64)
    folder = save_qwen35(model, tmp_path / "broken", extra={"mtp.fc.weight": torch.zeros(64, 128)})
    with pytest.raises(ModelFileError, match="incomplete .*pre_fc_norm_embedding"):
        find_mtp(folder)


# --- the runner: "mtp" is one draft choice among the others -------------------------------------

def _random_mtp_checkpoint(folder, tokenizer_from):
    """A tiny Qwen3.5 of the tiny pair's 1024-token vocabulary with a random MTP layer: what a
    chat through the runner needs (its chat template and tokenizer), drafts rarely accepted."""
    import torch

    from app.engine.backends.mtp_torch import build_layer, mtp_config, to_checkpoint_name

    model = tiny_qwen35(5)
    torch.manual_seed(5)
    layer = build_layer(model.model, mtp_config(model.config))
    mtp = {"mtp." + to_checkpoint_name(name): value for name, value in layer.state_dict().items()}
    return save_qwen35(model, folder, tokenizer_from, extra=mtp)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_runner_loads_mtp_as_a_draft_beside_prompt_lookup_and_stays_exact(backend, tiny_pair, tmp_path):
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    from app.draft_choice import NO_DRAFT, DraftChoice, DraftKind
    from app.engine.events import Finished
    from app.runner import ChatRequest, Runner

    folder = _random_mtp_checkpoint(tmp_path / "qwen35-mtp", tiny_pair["target"])
    runner = Runner()
    loaded = runner.load(folder, backend, DraftChoice.parse("mtp"), progress=lambda m: None)
    assert loaded.draft.kind is DraftKind.MTP and loaded.draft_words()[0] == "built-in MTP head"
    assert runner.drafter.wants_target_state and runner.drafter.model.head.weights_bytes > 0
    ask = ChatRequest(({"role": "user", "content": "Say the list 1, 2, 3, 1, 2, 3, 1, 2, 3 again."},),
                      max_tokens=24, draft_tokens=3)
    spec = list(runner.chat(ask))
    plain = list(runner.chat(ChatRequest(ask.messages, max_tokens=24, drafter=NO_DRAFT)))
    tokens = [[t for e in events if isinstance(e, Round) for t in e.emitted] for events in (spec, plain)]
    assert tokens[0] == tokens[1]
    stats = next(e for e in spec if isinstance(e, Finished)).stats
    assert stats.drafted > 0
    sources = {e.source for e in spec if isinstance(e, Round) and e.drafted}
    assert "mtp" in sources  # the layer drafted, not only prompt lookup


def test_the_runner_refuses_mtp_for_a_checkpoint_without_one_before_loading(tiny_pair, tmp_path):
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    folder = save_qwen35(tiny_qwen35(4), tmp_path / "plain", tiny_pair["target"])
    said = []
    runner = Runner()
    with pytest.raises(ModelFileError, match="no built-in multi-token-prediction layer"):
        runner.load(folder, "torch", DraftChoice.parse("mtp"), progress=said.append)
    assert runner.target is None and not any(line.startswith("Loading") for line in said)


def test_auto_gives_a_hub_named_target_its_own_mtp_layer_once_fetched(tiny_pair, tmp_path, monkeypatch):
    """"auto" is decided before a hub id is fetched; the fetched checkpoint's MTP layer still wins
    over prompt lookup (the folder is what tells)."""
    import app.load_plan as load_plan
    from app.draft_choice import AUTO_DRAFT, DraftKind
    from app.runner import Runner

    folder = _random_mtp_checkpoint(tmp_path / "qwen35-mtp", tiny_pair["target"])
    plain = save_qwen35(tiny_qwen35(4), tmp_path / "plain", tiny_pair["target"])
    fetched = {"org/qwen35-mtp": folder, "org/plain": plain}
    monkeypatch.setattr(load_plan, "resolve_model", lambda spec, *a, **k: fetched[str(spec)])
    runner = Runner()
    assert runner.load("org/qwen35-mtp", "torch", AUTO_DRAFT, progress=lambda m: None).draft.kind is DraftKind.MTP
    assert runner.load("org/plain", "torch", AUTO_DRAFT, progress=lambda m: None).draft.kind is DraftKind.LOOKUP


def test_the_side_panels_tooltip_names_each_drafter_by_its_source():
    """Per-token provenance stays readable for the new drafters: the round's tooltip says which
    drafter proposed, for every source the engine's drafters write."""
    from app.chat.trace import ACCEPTED, Chip, RoundTrace
    from ui.panel.rounds_view import round_tip

    said = {}
    sources = ("model", "lookup", "mtp", "head", "assistant", "eagle3", "dflash")
    for source in sources:
        chips = (Chip(5, "a", ACCEPTED, 0.9, 0.8),)
        said[source] = round_tip(RoundTrace(3, 2, source, chips, "a", 0, 0.1, 0.01, 0.02))
    assert "drafted by the model's built-in MTP layer" in said["mtp"]
    assert "drafted by the aligned draft head" in said["head"]  # an aligned head drafts through the MTP drafter
    assert "drafted by the Gemma 4 assistant" in said["assistant"]
    assert "drafted by prompt lookup" in said["lookup"] and "drafted by the draft model" in said["model"]
    assert len(set(said.values())) == len(sources)


def test_a_corrupt_weights_header_is_named_not_a_traceback(tmp_path):
    from app.models.draft_heads import has_mtp

    folder = save_qwen35(tiny_qwen35(4, vocab=64), tmp_path / "cut")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:20])  # the header cut short, as by an interrupted copy
    with pytest.raises(ModelFileError, match="model.safetensors: the safetensors header is corrupt"):
        find_mtp(folder)
    assert not has_mtp(folder)  # pairing asks quietly; the load then reports it in full


def test_an_assistant_choice_naming_an_ordinary_model_is_refused_before_loading(tiny_pair):
    from app.draft_choice import DraftChoice, DraftChoiceError
    from app.runner import Runner

    runner = Runner()
    said = []
    with pytest.raises(ModelFileError, match="is not a Gemma 4 assistant"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.parse(f"assistant:{tiny_pair['draft']}"),
                    progress=said.append)
    assert runner.target is None and not any(line.startswith("Loading") for line in said)
    with pytest.raises(DraftChoiceError, match="“assistant:” names no folder"):
        DraftChoice.parse("assistant:")
