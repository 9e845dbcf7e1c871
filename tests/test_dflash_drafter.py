"""DFlash block drafters (app/models/dflash_head.py, app/engine/dflash.py, app/engine/backends/
dflash_*.py): a tiny Llama and a DFlash drafter trained together on a task only the right inner
states solve (tests/dflash_training.py) draft whole blocks far above chance and fall to chance
when the drafter reads the wrong positions; speculation stays exact at every k on both backends
and at temperature 1; the MLX port computes what the PyTorch port computes, and the PyTorch port
what z-lab's published model code computes; a follow-up turn's cache equals a fresh one's;
drafters that do not fit are refused, in words, before any weights load."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.engine.backends import load_backend
from app.engine.dflash import DFlashDrafter, load_dflash_drafter
from app.engine.events import Round
from app.engine.speculative import generate
from app.models.dflash_head import default_layers, is_dflash_head, read_dflash
from app.models.errors import ModelFileError
from tests.dflash_training import (BLOCK_SIZE, OUR_LAYERS, block_pass, draft_config, states_of, train,
                                   write_drafter)
from tests.head_sampling import check_sampling_keeps_the_target
from tests.mtp_training import FIRST, VOCAB

PERIODIC = [1, 5, 9, 17, 5, 9, 17, 5]
SECOND = [1, 7, 12, 20, 7, 12, 20, 7, 12]
OTHER = [1, 4, 8, 15, 22, 3, 7]
N = 30
CHANCE = 1 / (VOCAB - FIRST)


def _run(target, prompt, drafter=None, max_tokens=N, **kw):
    events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=max_tokens, **kw))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1].stats


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target folder, drafter folder, target model, drafter modules)."""
    root = tmp_path_factory.mktemp("dflash")
    model, drafter, losses = train()
    assert losses[1] < 0.5, losses  # the drafter learned its task (chance: ln 21 = 3.0)
    model.save_pretrained(root / "target")
    return root / "target", write_drafter(drafter, root / "drafter"), model, drafter


@pytest.fixture(scope="module", params=["torch", "mlx"])
def pair(request, trained):
    if request.param == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(trained[0], request.param)
    return target, load_dflash_drafter(target, trained[1]), load_backend(trained[0], request.param)


def test_the_drafter_reads_zlabs_layout_and_counts_its_layers_as_outputs(trained):
    head = read_dflash(trained[1], json.loads((trained[0] / "config.json").read_text()))
    assert head.layers == OUR_LAYERS and head.block_size == BLOCK_SIZE and head.mask_token_id == 0
    assert is_dflash_head(trained[1]) and not is_dflash_head(trained[0])
    assert default_layers(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B's DFlash head reads these outputs


def _rate(target, drafter, k=BLOCK_SIZE - 1) -> tuple[float, float]:
    """(accepted per drafted token, tokens per round) over the two periodic prompts."""
    drafted = accepted = rounds = tokens = 0
    for prompt in (PERIODIC, SECOND):
        # chains: the drafter's own blocks (a tree's runner-ups would hide a wrong state)
        _, stats = _run(target, prompt, drafter, draft_tokens=k, trees="off")
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        rounds, tokens = rounds + stats.rounds, tokens + stats.decode_tokens
    return accepted / drafted, tokens / rounds


def test_a_trained_drafter_drafts_whole_blocks_far_above_chance_and_stays_exact(pair):
    target, drafter, fresh = pair
    for prompt in (PERIODIC, OTHER):
        plain, _ = _run(fresh, prompt)
        for k in range(1, 9):
            tokens, stats = _run(target, prompt, drafter, draft_tokens=k)
            assert tokens == plain, (prompt, k)
            assert stats.drafted > 0
    rate, per_round = _rate(target, drafter)
    assert rate > 0.7 and per_round > 2.5, (rate, per_round)  # most blocks of 3 taken whole


class _OffByOne(DFlashDrafter):
    """The wiring bug the acceptance test must catch: each position's context read from the
    state of the position before it."""

    def _take(self, committed, state):
        before = getattr(self, "_carry", None)
        if before is None or state.start == 0:
            before = state.hidden[:1]
        shifted = self.block.concat(before, state.hidden[:-1])
        self._carry = state.hidden[-1:]
        super()._take(committed, replace(state, hidden=shifted))


def test_the_drafter_fed_the_wrong_positions_falls_to_chance(pair, trained):
    target, drafter, fresh = pair
    plain, _ = _run(fresh, PERIODIC)
    wrong = _OffByOne(load_dflash_drafter(target, trained[1]).block)
    tokens, _ = _run(target, PERIODIC, wrong, draft_tokens=3)
    assert tokens == plain  # a bad drafter costs speed, never the answer
    assert _rate(target, wrong)[0] < 3 * CHANCE + 0.15


def test_the_port_computes_what_the_trained_modules_compute(trained):
    """Tandem's drafting path (the target's states through the backend, the context cache read in
    two parts, the block's entries dropped) gives the logits the training graph gave."""
    folder, drafter_folder, model, modules = trained
    x = torch.tensor([PERIODIC])
    with torch.inference_mode():
        want = model.lm_head(block_pass(modules, model, states_of(model, x), x, 7))[0, 1:]
    target = load_backend(folder, "torch")
    block = load_dflash_drafter(target, drafter_folder).block
    assert target.capture_hidden(True, OUR_LAYERS) == ""
    target.prefill(PERIODIC[:7])
    rows = target.last_hidden()
    with torch.inference_mode():
        block.block(PERIODIC[3], rows[:3], 0)  # a first proposal read positions 0..2
        assert block.length == 3  # the block's own entries went
        got = block._logits(block.block(PERIODIC[7], rows[3:], 3)[1:])
    assert block.length == 7
    torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-4)


def test_the_mlx_port_computes_what_the_pytorch_port_computes(trained):
    pytest.importorskip("mlx_lm")
    import mlx.core as mx

    torch_block = load_dflash_drafter(load_backend(trained[0], "torch"), trained[1]).block
    mlx_block = load_dflash_drafter(load_backend(trained[0], "mlx"), trained[1]).block
    rows = np.random.default_rng(0).standard_normal((9, 2 * 32)).astype(np.float32)
    with torch.inference_mode():
        torch_block.block(5, torch.from_numpy(rows[:4]), 0)
        a = torch_block.block(9, torch.from_numpy(rows[4:]), 4)
        logits_a = torch_block._logits(a[1:]).numpy()
    mlx_block.block(5, mx.array(rows[:4]), 0)
    b = mlx_block.block(9, mx.array(rows[4:]), 4)
    logits_b = np.array(mlx_block._logits(b[1:]))
    assert np.abs(a.numpy() - np.array(b)).max() < 1e-4
    assert np.abs(logits_a - logits_b).max() < 1e-4 * max(1.0, np.abs(logits_a).max())


def test_a_follow_up_turn_keeps_the_drafters_cache_as_a_fresh_one_would_build_it(pair, trained):
    target, drafter, fresh = pair
    # trees "on", not "auto": a choice by the clock could end the two runs' rounds in different places
    target.reset()
    first, _ = _run(target, PERIODIC, drafter, draft_tokens=3, max_tokens=12, reuse_cache=True, trees="on")
    follow = [*PERIODIC, *first, 3, 11, 6, 3, 11]
    tokens, stats = _run(target, follow, drafter, draft_tokens=3, max_tokens=12, reuse_cache=True, trees="on")
    assert stats.reused_tokens > len(PERIODIC)
    plain, _ = _run(fresh, follow, max_tokens=12)
    assert tokens == plain
    again = load_dflash_drafter(fresh, trained[1])
    fresh.reset()
    _run(fresh, follow, again, draft_tokens=3, max_tokens=12, trees="on")
    assert again._read == drafter._read and again._base == drafter._base
    assert np.abs(_keys(drafter.block) - _keys(again.block)).max() < 1e-4


def _keys(block) -> np.ndarray:
    if hasattr(block.cache, "layers"):  # transformers' DynamicCache
        return block.cache.layers[0].keys[0].float().numpy()
    import mlx.core as mx

    cache = block.caches[0]
    keys = cache.keys[..., : cache.offset, :]
    mx.eval(keys)
    return np.array(keys[0])


def test_dflash_speculative_sampling_matches_the_target(trained):
    """Temperature 1: each block position's own distribution goes to the Leviathan/Chen rule
    (the draft never sees its own picks), so tokens 2 and 3 keep the target's marginals."""
    target = load_backend(trained[0], "torch")
    check_sampling_keeps_the_target(trained[0], target, load_dflash_drafter(target, trained[1]), PERIODIC[:6],
                                    VOCAB, answers=1000)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_blocks_tree_keeps_the_answer_with_one_token_leaves_and_hands_over_the_kept_paths_states(
        trained, monkeypatch, backend):
    """The block as the trunk and, where the drafter was unsure, that position's runner-up as a leaf
    one token deep (tests/head_trees.py): the target's answer at temperature 0, and each state
    handed over the one a prefill computes there."""
    import app.engine.speculative as speculative
    from app.engine.drafters import UNSURE
    from tests.head_trees import check_head_trees

    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(trained[0], backend)
    drafter = load_dflash_drafter(target, trained[1])
    assert drafter.drafts_trees and target.tree_note() == ""
    proposed, verify = [], speculative.verify_tree_round

    def keep(target_, committed, proposal, params, want_state=False):
        proposed.append(proposal)
        return verify(target_, committed, proposal, params, want_state)

    monkeypatch.setattr(speculative, "verify_tree_round", keep)
    # prompts where the drafter, unsure, had the target's token as its runner-up (random ones, seeds 4, 5, 8)
    unsure = [[1, 10, 12, 6, 15, 18, 7, 5], [1, 22, 11, 14, 23, 19, 3, 17], [1, 10, 14, 15, 7, 9, 4, 5]]
    run = check_head_trees(target, load_backend(trained[0], backend), drafter, [PERIODIC, *unsure],
                           max_tokens=N, k=BLOCK_SIZE - 1)
    assert run.trees >= 4 and run.off_chain >= 1 and run.states > 40, run
    # the shape: the trunk is the block; each leaf sits beside a draft the drafter was unsure of
    for proposal in proposed:
        chain, tree = proposal.ids, proposal.tree
        assert tree.tokens[:len(chain)] == chain and tree.parents[:len(chain)] == tuple(range(-1, len(chain) - 1))
        leaves = range(len(chain), len(tree))
        assert leaves and all(tree.parents[n] == tree.depths[n] - 1 and proposal.p[tree.depths[n]] < UNSURE
                              and not tree.children(n) for n in leaves)


# --- the reference: z-lab's own model code, run here only as a test ------------------------------

def test_the_port_gives_zlabs_drafters_outputs(tmp_path):
    from tests.reference_packages import reference

    reference("dflash")
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    config = Qwen3Config(**{k: v for k, v in draft_config(draft_layers=2).items() if k != "architectures"})
    config.architectures = ["DFlashDraftModel"]
    theirs = DFlashDraftModel(config).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=generator))
    theirs.save_pretrained(str(tmp_path / "drafter"))
    target_config = {"hidden_size": 32, "vocab_size": VOCAB, "num_hidden_layers": 4}
    head = read_dflash(tmp_path / "drafter", target_config)
    assert head.layers == OUR_LAYERS and head.layer_count == 2
    from app.engine.backends.dflash_torch import load_modules

    ours = load_modules(head, "cpu", torch.float32)
    states = torch.randn(1, 6, 64, generator=generator)
    noise = torch.randn(1, BLOCK_SIZE, 32, generator=generator)
    positions = torch.arange(6 + BLOCK_SIZE).view(1, -1)
    with torch.no_grad():
        want = theirs(position_ids=positions, noise_embedding=noise, target_hidden=states)
        got = ours(ours.context(states), noise, positions, None)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# --- refusals, in words, before any weights load -------------------------------------------------

def _config(trained) -> dict:
    return json.loads((trained[0] / "config.json").read_text())


def test_a_drafter_for_another_target_is_refused_naming_what_differs(trained):
    config = _config(trained)
    with pytest.raises(ModelFileError, match="32 wide; .* 64 wide"):
        read_dflash(trained[1], {**config, "hidden_size": 64})
    with pytest.raises(ModelFileError, match="made for a model of 4 layers; .* has 8"):
        read_dflash(trained[1], {**config, "num_hidden_layers": 8})
    with pytest.raises(ModelFileError, match="mask token 0 is not one of"):
        read_dflash(trained[1], {**config, "vocab_size": 0})


def test_missing_tensors_and_unread_layouts_are_named(trained, tmp_path):
    _, _, _, modules = trained
    with pytest.raises(ModelFileError, match=r"incomplete \(no layers.0.self_attn.k_norm.weight\)"):
        read_dflash(write_drafter(modules, tmp_path / "a", drop="layers.0.self_attn.k_norm.weight"), _config(trained))
    two = write_drafter(modules, tmp_path / "b", {**draft_config(), "conv_kernel_size": 4})
    with pytest.raises(ModelFileError, match="DFlash-2 drafter .* conv_kernel_size"):
        read_dflash(two, _config(trained))
    pickled = tmp_path / "c"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(draft_config()))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not loaded")
    with pytest.raises(ModelFileError, match="pytorch_model.bin, a Python pickle"):
        read_dflash(pickled, _config(trained))


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_runner_loads_a_dflash_drafter_beside_prompt_lookup_and_stays_exact(backend, tiny_pair, tmp_path):
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    from app.draft_choice import NO_DRAFT, DraftChoice, DraftKind
    from app.engine.backends.dflash_torch import DFlashModules, layer_config
    from app.engine.events import Finished
    from app.runner import ChatRequest, Runner
    from tests.dflash_training import spec

    target_config = json.loads((tiny_pair["target"] / "config.json").read_text())
    config = draft_config(hidden=target_config["hidden_size"], vocab=target_config["vocab_size"], layers=(0,),
                          target_layers=target_config["num_hidden_layers"])
    torch.manual_seed(4)
    folder = write_drafter(DFlashModules(spec(config, (1,)), layer_config(spec(config, (1,)))), tmp_path / "d", config)
    target = tiny_pair["target"] if backend == "torch" else tiny_pair["target_mlx"]
    runner = Runner()
    for named in (f"dflash:{folder}", str(folder)):
        loaded = runner.load(target, backend, DraftChoice.parse(named), progress=lambda m: None)
        assert loaded.draft.kind is DraftKind.DFLASH and loaded.draft_words()[0] == "DFlash drafter"
    ask = ChatRequest(({"role": "user", "content": "Say the list 1, 2, 3, 1, 2, 3, 1, 2, 3 again."},),
                      max_tokens=24, draft_tokens=3)
    spec_events = list(runner.chat(ask))
    plain = list(runner.chat(ChatRequest(ask.messages, max_tokens=24, drafter=NO_DRAFT)))
    tokens = [[t for e in events if isinstance(e, Round) for t in e.emitted] for events in (spec_events, plain)]
    assert tokens[0] == tokens[1]
    assert next(e for e in spec_events if isinstance(e, Finished)).stats.drafted > 0
    assert "dflash" in {e.source for e in spec_events if isinstance(e, Round) and e.drafted}
