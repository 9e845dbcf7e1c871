"""A token tree verified in one pass of an mlx-lm model (app/engine/backends/tree_mlx.py), on
MLX's CPU build: each node's logits are a one-token step's along its path (tiny Llama, Qwen2 and
Qwen3 models, whose RoPE and mask are stood in for), the cache after a verdict continues as a
fresh prefill of the kept path would, the states a drafter reads are the kept path's, the engine's
tree rounds write the target alone at temperature 0, MLX draft models name their runner-ups, and
a model the stand-ins do not cover (or a sliding window) says it verifies chains."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("mlx_lm")

from app.engine.backends import load_backend  # noqa: E402
from app.engine.events import Round  # noqa: E402
from app.engine.sampling import SamplingParams  # noqa: E402
from app.engine.speculative import generate  # noqa: E402
from app.engine.tree import ROOT, TokenTree  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [5, 17, 300, 42, 7, 9, 101, 3]
# a branch revisited after shallower nodes came between (as tests/test_tree_verify.py's)
BRANCHY = [[11, 12, 13], [11, 14], [15], [11, 12, 13, 18], [15, 16], [11, 12, 17], [11, 12, 19, 20]]


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory, tiny_pair):
    from tests.factories import tiny_qwen3

    folder = tmp_path_factory.mktemp("qwen3_mlx") / "qwen3"
    tiny_qwen3(seed=7).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_pair["target"] / name).exists():
            shutil.copy(tiny_pair["target"] / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory, tiny_pair):
    """A tiny Qwen2 (biases on q, k and v) from transformers' own classes, random weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(9)
    config = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    folder = tmp_path_factory.mktemp("qwen2_mlx") / "qwen2"
    Qwen2ForCausalLM(config).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_pair["target"] / name).exists():
            shutil.copy(tiny_pair["target"] / name, folder / name)
    return folder


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def target(request, tiny_pair, qwen2_folder, qwen3_folder):
    folder = {"llama": tiny_pair["target_mlx"], "qwen2": qwen2_folder, "qwen3": qwen3_folder}[request.param]
    backend = load_backend(folder, "mlx", precision="float32")
    assert backend.tree_note() == "", backend.tree_note()
    return backend


def _step(backend, tokens, before=PROMPT[:-2]):
    """Logits after reading `tokens` one at a time after `before`."""
    backend.reset()
    backend.prefill(list(before))
    for token in tokens[:-1]:
        backend.forward_last([token])
    return np.array(backend.forward_last([tokens[-1]]))


def test_each_nodes_logits_are_a_one_token_steps_along_its_path(target):
    from app.engine.backends.tree_mlx import tree_logits

    tree = TokenTree.from_paths(BRANCHY)
    target.reset()
    target.prefill(PROMPT[:-2])
    logits = np.array(tree_logits(target, PROMPT[-2:], tree))  # two pending tokens, then the tree
    assert logits.shape[0] == 2 + len(tree) and target.cache.length == len(PROMPT) + len(tree)
    np.testing.assert_allclose(logits[1], _step(target, PROMPT[-2:]), atol=1e-4, rtol=1e-4)
    for node in range(len(tree)):
        path = [*PROMPT[-2:], *(tree.tokens[i] for i in tree.path(node))]
        np.testing.assert_allclose(logits[2 + node], _step(target, path), atol=1e-4, rtol=1e-4, err_msg=str(node))


OTHER_FAMILIES = ("cohere", "ernie4_5", "gemma", "gemma2", "glm4", "granite", "helium", "mixtral", "olmo2", "phi3",
                  "qwen2_moe", "qwen3_moe", "seed_oss", "stablelm", "starcoder2")


def test_every_family_named_is_tested():
    from app.engine.backends.tree_mlx import FAMILIES

    assert set(FAMILIES) == {"llama", "qwen2", "qwen3", *OTHER_FAMILIES}


@pytest.mark.parametrize("kind", OTHER_FAMILIES)
def test_each_familys_nodes_are_one_token_steps_along_their_paths(kind, tmp_path):
    """mlx-lm's other families, each a tiny model from transformers' classes (tests/factories.py
    says what each one's layers do differently): the stand-ins give every node exactly what a
    one-token step along its path gives it."""
    from app.engine.backends.tree_mlx import _family, tree_logits
    from tests.factories import save_for_mlx, tiny_family

    target = load_backend(save_for_mlx(tiny_family(kind, seed=3), tmp_path / kind), "mlx", precision="float32")
    assert _family(target) == kind and target.tree_note() == ""
    tree = TokenTree.from_paths(BRANCHY)
    target.reset()
    target.prefill(PROMPT[:-2])
    logits = np.array(tree_logits(target, PROMPT[-2:], tree))
    for node in range(len(tree)):
        path = [*PROMPT[-2:], *(tree.tokens[i] for i in tree.path(node))]
        np.testing.assert_allclose(logits[2 + node], _step(target, path), atol=1e-5, rtol=1e-5, err_msg=str(node))


def test_models_info_on_a_mac_says_whether_the_family_verifies_trees_on_mlx(tmp_path, capsys, monkeypatch):
    from app.cli import main
    from app.engine import backends
    from tests.factories import save_for_mlx, tiny_family

    gemma = tmp_path / "gemma"
    save_for_mlx(tiny_family("gemma", seed=3), gemma)
    assert main(["models", "info", str(gemma)]) == 0
    assert "on MLX" not in capsys.readouterr().out  # PyTorch's machine: its own lines only
    monkeypatch.setattr(backends, "default_backend", lambda: "mlx")
    assert main(["models", "info", str(gemma)]) == 0
    assert "on MLX: trees of drafts verified (mlx-lm's gemma model" in capsys.readouterr().out
    from app.engine.backends.tree_mlx import tree_words

    assert "(mlx-lm's llama model" in tree_words("mistral")  # mlx-lm loads Mistral's configs as Llama's
    assert "on MLX: drafts verified as chains" in tree_words("gemma3_text") and "not gemma3_text" in tree_words(
        "gemma3_text")


def test_the_kept_path_continues_as_a_prefill_of_it_would_and_hands_over_its_states(target):
    from app.engine.backends.tree_mlx import keep_path, tree_logits

    tree = TokenTree.from_paths(BRANCHY)
    node = tree.children(tree.children(tree.children(tree.children(ROOT)[11])[12])[19])[20]
    assert target.capture_hidden(True) == ""
    try:
        target.reset()
        target.prefill(PROMPT[:-1])
        tree_logits(target, [PROMPT[-1]], tree)
        keep_path(target, 1, tree.path(node), len(PROMPT) - 1)
        assert target.cache.length == len(PROMPT) + 4
        kept = np.array(target.last_hidden())
        after = np.array(target.forward_last([21]))
        target.reset()
        target.prefill([*PROMPT, 11, 12, 19, 20])
        want = np.array(target.last_hidden())[-5:]
    finally:
        target.capture_hidden(False)
    assert kept.shape == want.shape
    np.testing.assert_allclose(kept, want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(after, _step(target, [PROMPT[-1], 11, 12, 19, 20, 21], PROMPT[:-1]),
                               atol=1e-4, rtol=1e-4)


def test_at_temperature_0_the_verdict_is_the_longest_path_of_the_targets_own_tokens(target):
    from tests.test_tree_verify import check_greedy_verdict

    check_greedy_verdict(target)


def test_the_engines_tree_rounds_on_mlx_take_the_right_branch_and_write_the_target_alone(tiny_pair):
    """A round whose first branch is wrong and second right (tests/test_tree_rounds.py's
    ScriptedTree), on an MLX target: three drafts of the second branch taken, the answer the
    target's alone, the cache holding every committed token but the pending one."""
    from tests.test_tree_rounds import ScriptedTree

    target = load_backend(tiny_pair["target_mlx"], "mlx", precision="float32")
    alone = [t for e in generate(target, lambda ids: "", PROMPT, max_tokens=24) if isinstance(e, Round)
             for t in e.emitted]
    right = tuple(alone[5:8])
    drafter = ScriptedTree(len(PROMPT) + 5, right, ((right[0] + 1) % 64, 1, 2, 3))
    rounds = [e for e in generate(target, lambda ids: "", PROMPT, drafter=drafter, max_tokens=24, trees="on")
              if isinstance(e, Round)]
    assert [t for r in rounds for t in r.emitted] == alone
    trees = [r for r in rounds if r.tree is not None]
    assert len(trees) == 1 and trees[0].accepted == 3 and trees[0].drafted[:3] == right
    assert target.cache.length == len(PROMPT) + len(alone) - 1


def test_mlx_draft_steps_name_each_steps_runner_up():
    import mlx.core as mx

    from app.engine.backends.mlx_backend import DraftSteps

    logits = mx.array([0.1, 3.0, 2.5, -1.0])
    steps = DraftSteps(GREEDY, lambda: mx.random.key(0), runner_up=True)
    steps.pick(logits)
    second, p = steps.runner_ups()
    assert second == (2,) and p[0] == pytest.approx(float(mx.softmax(logits)[2]), rel=1e-6)
    keys = iter(mx.random.split(mx.random.key(1), 40))
    sampled = DraftSteps(SamplingParams(temperature=5.0), lambda: next(keys), runner_up=True)
    tokens = [int(sampled.pick(logits).item()) for _ in range(40)]
    seconds, ps = sampled.runner_ups()
    assert all(second == (2 if token == 1 else 1) for token, second in zip(tokens, seconds, strict=True))
    assert len(set(tokens)) > 1 and all(0 < q < 1 for q in ps)


def test_an_mlx_draft_models_trees_write_the_target_alone(tiny_pair):
    """The draft model's runner-ups as leaves where it was unsure (drafters.runner_up_tree), on
    MLX: tree rounds from the model, the answer the target's alone at temperature 0."""
    from app.engine.drafters import ModelDrafter

    target = load_backend(tiny_pair["target_mlx"], "mlx", precision="float32")
    alone = [t for e in generate(target, lambda ids: "", PROMPT, max_tokens=60) if isinstance(e, Round)
             for t in e.emitted]
    drafter = ModelDrafter(load_backend(tiny_pair["near_mlx"], "mlx", precision="float32"))
    assert drafter.drafts_trees
    rounds = [e for e in generate(target, lambda ids: "", PROMPT, drafter=drafter, max_tokens=60, trees="on")
              if isinstance(e, Round)]
    assert [t for r in rounds for t in r.emitted] == alone
    assert any(r.tree is not None and r.source == "model" for r in rounds)


def test_a_sliding_window_or_an_uncovered_family_verifies_chains(tiny_pair, monkeypatch):
    from mlx_lm.models.cache import RotatingKVCache

    from app.engine.backends import tree_mlx

    target = load_backend(tiny_pair["target_mlx"], "mlx", precision="float32")
    monkeypatch.setattr(tree_mlx, "FAMILIES", ("qwen3",))
    assert "for qwen3 models, not llama" in target.tree_note()
    monkeypatch.undo()
    target.cache.layers[0] = RotatingKVCache(max_size=64)
    assert "RotatingKVCache" in target.tree_note()
