"""EAGLE-3 heads as drafters (app/models/eagle3_head.py, app/engine/backends/eagle3_*.py): a tiny
Llama and an EAGLE-3 head trained together on a task only the right inner states solve
(tests/eagle3_training.py) draft far above chance and fall to chance when the head reads the
wrong positions or the wrong layers; speculation stays exact at every k on both backends and at
temperature 1; both published layouts read to the same head; the MLX port computes what the
PyTorch port computes; a follow-up turn's head cache equals a fresh one's; heads that do not fit
are refused, in words, before any weights load."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.engine.backends import load_backend
from app.engine.events import Round
from app.engine.mtp import MTPDrafter, load_eagle3_drafter
from app.engine.speculative import generate
from app.models.eagle3_head import default_layers, is_eagle3_head, read_eagle3
from app.models.errors import ModelFileError
from tests.eagle3_training import (DRAFT_VOCAB, FIRST, LAYERS, VOCAB, fused_states, head_pass, random_head, train,
                                   write_head)
from tests.head_sampling import check_sampling_keeps_the_target

PERIODIC = [1, 5, 9, 17, 5, 9, 17, 5]  # what the pair was trained on: the head should be right
OTHER = [1, 4, 8, 15, 22, 3, 7]  # no period: the target continues its own way, the head errs more
N = 30
CHANCE = 1 / DRAFT_VOCAB


def _run(target, prompt, drafter=None, max_tokens=N, **kw):
    events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=max_tokens, **kw))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1].stats


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target folder, speculators-layout head folder, EAGLE-layout head folder, the modules)."""
    root = tmp_path_factory.mktemp("eagle3")
    model, head, losses = train(steps=300)
    assert losses[1] < 0.6, losses  # the head learned its task (chance: ln 21 = 3.0)
    model.save_pretrained(root / "target")
    return (root / "target", write_head(head, root / "head"), write_head(head, root / "head-eagle", "EAGLE"),
            model, head)


@pytest.fixture(scope="module", params=["torch", "mlx"])
def pair(request, trained):
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(trained[0], request.param)
    return target, load_eagle3_drafter(target, trained[1]), load_backend(trained[0], request.param)


def test_the_head_reads_the_layers_its_config_names_and_eagle3s_rule_otherwise(trained):
    config = json.loads((trained[0] / "config.json").read_text())
    head = read_eagle3(trained[1], config)
    assert head.layers == LAYERS and head.layout == "speculators" and head.vocab_map
    assert read_eagle3(trained[2], config).layout == "EAGLE"
    assert is_eagle3_head(trained[1]) and is_eagle3_head(trained[2]) and not is_eagle3_head(trained[0])
    assert default_layers(32) == (2, 16, 29)  # Llama-3.1-8B's: the states entering layers 2, 16 and 29


def test_a_trained_head_drafts_far_above_chance_and_stays_exact(pair):
    target, drafter, fresh = pair
    for prompt in (PERIODIC, OTHER):
        plain, _ = _run(fresh, prompt)
        for k in range(1, 9):
            tokens, stats = _run(target, prompt, drafter, draft_tokens=k)
            assert tokens == plain, (prompt, k)
            assert stats.drafted > 0
            if k == 1 and prompt is PERIODIC:  # one step reads the target's own states: what it was trained for
                assert stats.accepted / stats.drafted > 0.7, (stats.accepted, stats.drafted)


class _OffByOne(MTPDrafter):
    """The wiring bug the acceptance test must catch: each token read beside the states of the
    position before the right one."""

    def _take(self, committed, state):
        before = getattr(self, "_carry", None)
        if before is None or state.start == 0:
            before = state.hidden[:1]
        shifted = self.head.concat(before, state.hidden[:-1])
        self._carry = state.hidden[-1:]
        super()._take(committed, replace(state, hidden=shifted))


def _rate(stats) -> float:
    return stats.accepted / stats.drafted


SECOND = [1, 7, 12, 20, 7, 12, 20, 7, 12]  # another periodic prompt


def _rates(target, drafter) -> float:
    drafted = accepted = 0
    for prompt in (PERIODIC, SECOND):
        # chains: the head's own first guesses (a tree's runner-ups would hide a wrong state)
        _, stats = _run(target, prompt, drafter, draft_tokens=1, trees="off")
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    return accepted / drafted


def test_the_head_fed_the_wrong_positions_or_layers_falls_far(pair, trained):
    target, drafter, fresh = pair
    plain, _ = _run(fresh, PERIODIC)
    right = _rates(target, drafter)

    def head():  # each drafter its own head: a head's cache belongs to one drafter
        return load_eagle3_drafter(target, trained[1]).head

    wrong_place = _OffByOne(head(), source="eagle3", target_layers=drafter.target_layers)
    tokens, _ = _run(target, PERIODIC, wrong_place, draft_tokens=1)
    assert tokens == plain  # a bad drafter costs speed, never the answer
    # the convention read wrongly: each layer's output (the state entering the next) for its input.
    # (Not to chance: in a 4-layer toy the residual streams of neighbouring layers are close.)
    outputs = MTPDrafter(head(), source="eagle3", target_layers=tuple(i + 1 for i in LAYERS))
    assert right > 0.7
    assert _rates(target, wrong_place) < 3 * CHANCE + 0.15
    assert _rates(target, outputs) < 0.4


def test_the_port_computes_what_the_trained_modules_compute(trained):
    """Tandem's drafting path (the target's states through the backend, the head's cache, d2t)
    gives the logits the training graph gave, in both layouts."""
    folder, head_folder, eagle_folder, model, head = trained
    tokens = torch.tensor([PERIODIC])
    with torch.inference_mode():
        fused = head.fuse(fused_states(model, tokens))
        want = head.lm_head(head.norm(head_pass(head, model, tokens[:, 1:], fused[:, :-1])))[0, -1]
    for source in (head_folder, eagle_folder):
        target = load_backend(folder, "torch")
        port = load_eagle3_drafter(target, source).head
        assert target.capture_hidden(True, LAYERS) == ""
        target.prefill(PERIODIC[:-1])
        rows = target.last_hidden()
        with torch.inference_mode():
            out = port._pass(tokens[:, 1:], port.modules.fuse(rows[None]))
            got = port.logits(out[0, -1])
        assert torch.isinf(got[:FIRST]).all()  # no draft token maps onto the specials
        torch.testing.assert_close(got[FIRST:], want.float(), atol=1e-4, rtol=1e-4)


def test_the_mlx_port_computes_what_the_pytorch_port_computes(trained):
    pytest.importorskip("mlx_lm")
    import mlx.core as mx

    for folder in (trained[1], trained[2]):
        torch_head = load_eagle3_drafter(load_backend(trained[0], "torch"), folder).head
        mlx_head = load_eagle3_drafter(load_backend(trained[0], "mlx"), folder).head
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((6, 3 * 32)).astype(np.float32)
        tokens = [int(t) for t in rng.integers(FIRST, VOCAB, 6)]
        with torch.inference_mode():
            a = torch_head._pass(torch.tensor([tokens]), torch_head.modules.fuse(torch.from_numpy(rows)[None]))
            a2 = torch_head._pass(torch.tensor([[7]]), a[:, -1:])  # a chained step, on the cache
            logits_a = torch_head.logits(a2[0, -1]).numpy()
        b = mlx_head._pass(mx.array([tokens]), mlx_head.layers.fuse(mx.array(rows)[None]))
        b2 = mlx_head._pass(mx.array([[7]]), b[:, -1:])
        logits_b = np.array(mlx_head.logits(b2[0, -1]))
        assert np.abs(a.numpy() - np.array(b)).max() < 1e-4
        assert np.array_equal(np.isinf(logits_a), np.isinf(logits_b))
        finite = np.isfinite(logits_a)
        assert np.abs(logits_a[finite] - logits_b[finite]).max() < 1e-4 * max(1.0, np.abs(logits_a[finite]).max())


def test_a_follow_up_turn_keeps_the_heads_cache_as_a_fresh_one_would_build_it(pair, trained):
    target, drafter, fresh = pair
    # trees "on", not "auto": a choice by the clock could end the two runs' rounds in different places
    target.reset()  # (what earlier tests left in the target's cache is not this conversation's)
    first, _ = _run(target, PERIODIC, drafter, draft_tokens=2, max_tokens=12, reuse_cache=True, trees="on")
    follow = [*PERIODIC, *first, 3, 11, 6, 3, 11]
    tokens, stats = _run(target, follow, drafter, draft_tokens=2, max_tokens=12, reuse_cache=True, trees="on")
    assert stats.reused_tokens > len(PERIODIC)  # the target kept its cache: the head's must line up
    plain, _ = _run(fresh, follow, max_tokens=12)
    assert tokens == plain
    again = load_eagle3_drafter(fresh, trained[1])
    fresh.reset()
    _run(fresh, follow, again, draft_tokens=2, max_tokens=12, trees="on")
    assert again._pairs == drafter._pairs
    assert np.abs(_keys(drafter.head) - _keys(again.head)).max() < 1e-4


def _keys(head) -> np.ndarray:
    if hasattr(head.cache, "layers"):  # transformers' DynamicCache
        return head.cache.layers[0].keys[0].float().numpy()
    import mlx.core as mx

    keys = head.cache.keys[..., : head.cache.offset, :]
    mx.eval(keys)
    return np.array(keys[0])


def test_eagle3_speculative_sampling_matches_the_target(trained):
    """Temperature 1: the head's distributions (over its draft vocabulary, zero elsewhere) go to
    the Leviathan/Chen rule, so tokens 2 and 3 keep the target's marginals."""
    target = load_backend(trained[0], "torch")
    check_sampling_keeps_the_target(trained[0], target, load_eagle3_drafter(target, trained[1]), PERIODIC[:6],
                                    VOCAB, answers=1000)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_eagle3_trees_keep_the_answer_and_hand_the_head_its_layers_states_of_the_kept_path(trained, backend):
    """Trees from the head's runner-ups (tests/head_trees.py), with the three inner layers' states
    handed over after each verdict, on both backends: the target's answer at temperature 0, and
    each state the one a prefill computes there."""
    from tests.head_trees import check_head_trees

    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(trained[0], backend)
    drafter = load_eagle3_drafter(target, trained[1])
    assert drafter.drafts_trees and target.tree_note() == ""
    # prompts where the head, unsure, had the target's token as its runner-up (seeds 1 and 3 of random prompts)
    unsure = [[1, 7, 21, 5, 11, 6, 18, 17], [1, 10, 21, 20, 7, 14, 22, 18]]
    run = check_head_trees(target, load_backend(trained[0], backend), drafter, [PERIODIC, *unsure], max_tokens=N)
    assert run.trees >= 4 and run.off_chain >= 1 and run.states > 40, run


# --- refusals, in words, before any weights load -------------------------------------------------

def _config(trained) -> dict:
    return json.loads((trained[0] / "config.json").read_text())


def test_a_pickle_only_head_is_refused_and_says_why(trained, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((trained[2] / "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(ModelFileError, match="pytorch_model.bin, a Python pickle.*never does"):
        read_eagle3(folder, _config(trained))


def test_a_head_for_another_target_is_refused_naming_what_differs(trained):
    config = _config(trained)
    with pytest.raises(ModelFileError, match="32 wide; .* 64 wide"):
        read_eagle3(trained[1], {**config, "hidden_size": 64})
    with pytest.raises(ModelFileError, match="vocabulary of 24 tokens; .* has 32"):
        read_eagle3(trained[1], {**config, "vocab_size": 32})
    with pytest.raises(ModelFileError, match=r"layers \[1, 2, 3\]; .* has 2 decoder layers"):
        read_eagle3(trained[1], {**config, "num_hidden_layers": 2})


def test_missing_tensors_are_named_in_the_heads_own_layout(trained, tmp_path):
    _, _, _, _, head = trained
    with pytest.raises(ModelFileError, match=r"incomplete \(no layers.0.hidden_norm.weight\)"):
        read_eagle3(write_head(head, tmp_path / "a", drop="layers.0.hidden_norm.weight"), _config(trained))
    with pytest.raises(ModelFileError, match=r"incomplete \(no midlayer.self_attn.k_proj.weight\)"):
        read_eagle3(write_head(head, tmp_path / "b", "EAGLE", drop="midlayer.self_attn.k_proj.weight"),
                    _config(trained))


def test_a_layout_or_layer_not_read_yet_is_refused(trained, tmp_path):
    _, _, _, _, head = trained
    other = write_head(head, tmp_path / "dflash")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "speculators_model_type": "mlp"}))
    assert not is_eagle3_head(other)
    with pytest.raises(ModelFileError, match="speculators head of type 'mlp'; .* not that type yet"):
        read_eagle3(other, _config(trained))
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelFileError, match="not an EAGLE-3 head"):
        read_eagle3(other, _config(trained))
    (other / "config.json").write_text(json.dumps({**config, "transformer_layer_config": {
        **config["transformer_layer_config"], "model_type": "gpt_oss"}}))
    with pytest.raises(ModelFileError, match="a gpt_oss layer; .* not that one yet"):
        read_eagle3(other, _config(trained))


# --- the runner: "eagle3:<folder>" is one draft choice among the others --------------------------

@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_runner_loads_an_eagle3_head_beside_prompt_lookup_and_stays_exact(backend, tiny_pair, tmp_path):
    """Named with eagle3: or dropped as a draft model, the head drafts (its rounds say so) and the
    answer is the target's alone."""
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    from app.draft_choice import NO_DRAFT, DraftChoice, DraftKind
    from app.engine.events import Finished
    from app.runner import ChatRequest, Runner

    config = json.loads((tiny_pair["target"] / "config.json").read_text())
    head = random_head(3, config["hidden_size"], config["vocab_size"], (0, 1, 2))
    folder = write_head(head, tmp_path / "eagle3-head", layers=(0, 1, 2))
    target = tiny_pair["target"] if backend == "torch" else tiny_pair["target_mlx"]
    runner = Runner()
    for named in (f"eagle3:{folder}", str(folder)):
        loaded = runner.load(target, backend, DraftChoice.parse(named), progress=lambda m: None)
        assert loaded.draft.kind is DraftKind.EAGLE3 and loaded.draft_words()[0] == "EAGLE-3 head"
    assert runner.drafter.wants_target_state and runner.drafter.model.target_layers == (0, 1, 2)
    if backend == "torch":  # the head's passes, in the draft's detail (CUDA graphs on a GPU: test_head_graphs.py)
        assert "passes" not in loaded.draft_words()[1]  # eager on the CPU, as everything there
        estimates = []
        real_check = runner._check_memory
        runner._check_memory = lambda models, *rest: (estimates.extend(models), real_check(models, *rest))[1]
        static = runner.load(target, backend, DraftChoice.parse(f"eagle3:{folder}"), graphs="static",
                             progress=lambda m: None)
        assert static.draft_words()[1].endswith("; passes: fixed buffers, eagerly")
    ask = ChatRequest(({"role": "user", "content": "Say the list 1, 2, 3, 1, 2, 3, 1, 2, 3 again."},),
                      max_tokens=24, draft_tokens=3)
    spec = list(runner.chat(ask))
    plain = list(runner.chat(ChatRequest(ask.messages, max_tokens=24, drafter=NO_DRAFT)))
    tokens = [[t for e in events if isinstance(e, Round) for t in e.emitted] for events in (spec, plain)]
    assert tokens[0] == tokens[1]
    assert next(e for e in spec if isinstance(e, Finished)).stats.drafted > 0
    assert "eagle3" in {e.source for e in spec if isinstance(e, Round) and e.drafted}
    if backend == "torch":  # the memory check counted the head's own cache as the fixed buffer holds it
        kv = runner.drafter.model.head.static_kv
        assert kv.store is not None and next(e for e in estimates if e.name == "draft").kv_per_token == (
            kv.store.nbytes // kv.capacity)


def test_the_runner_refuses_a_head_for_another_target_before_loading(tiny_pair, trained):
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    said = []
    runner = Runner()
    with pytest.raises(ModelFileError, match="drafts for a model 32 wide"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.parse(f"eagle3:{trained[1]}"), progress=said.append)
    assert runner.target is None and not any(line.startswith("Loading") for line in said)
