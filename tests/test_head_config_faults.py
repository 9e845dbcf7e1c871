"""Part of the fuzz test (tests/test_bad_inputs.py): damaged or hand-edited drafters (issue 46,
findings 2 to 6), each ending in a clear message (a sentence naming the file and the field, no
traceback, no bare "invalid literal for int()") with nothing lost.

Kinds: an EAGLE-3 head's or a DFlash drafter's config.json whose fields are of the wrong type
(a list or text for a width, dflash_config as a list), out of range (0 heads, 0 layers, widths
of 10**9, a block of 10**6) or missing; a width in range whose layers would take more memory
than is free (counted from the config's shapes, before any layer is built); safetensors files
cut short (the header reads, the data does not); an aligned head's config with a width in words;
and pairs.json naming as a model's alignment a draft `tandem-cli align` never writes. Each is
refused by the pairing checks (`tandem-cli generate`) before any weights load, and by
`tandem-cli models info`; a bad alignment is skipped and named, and its target still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_bad_inputs import assert_clear, run_cli, snapshot

LOADED = "the target's weights would load now"  # what a pair that passed every check reaches
DELETE = object()  # _edit's value for a field left out


def _edit(folder: Path, field: str, value) -> None:
    """Set (or, with value DELETE, remove) `field` of the folder's config.json; "a.b" is field b
    of section a."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    *sections, name = field.split(".")
    at = config
    for section in sections:
        at = at[section]
    if value is DELETE:
        del at[name]
    else:
        at[name] = value
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def heads(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    """An EAGLE-3 head and a DFlash drafter made for the tiny target (random, fitting), once."""
    import torch

    from app.engine.backends.dflash_torch import DFlashModules, layer_config
    from tests.dflash_training import draft_config, spec, write_drafter
    from tests.eagle3_training import random_head, write_head

    root = tmp_path_factory.mktemp("heads")
    config = json.loads((tiny_pair["target"] / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    eagle3 = write_head(random_head(3, hidden, vocab, (0, 1, 2)), root / "eagle3", layers=(0, 1, 2))
    drafter = draft_config(hidden=hidden, vocab=vocab, layers=(0,), target_layers=config["num_hidden_layers"],
                           draft_layers=2)
    torch.manual_seed(4)
    made = spec(drafter, (1,))
    dflash = write_drafter(DFlashModules(made, layer_config(made)), root / "dflash", drafter)
    return {"eagle3": eagle3, "dflash": dflash, "target": tiny_pair["target"]}


def _copy(heads, kind: str, root: Path) -> Path:
    return Path(shutil.copytree(heads[kind], root / f"{kind}-head"))


@pytest.fixture
def no_weights_load(monkeypatch):
    """Runner.load reaches the weights only once every check passed: say so instead of loading."""
    import app.runner
    from app.models.errors import ModelFileError

    def refuse(*args, **kwargs):
        raise ModelFileError(f"Stopped here: {LOADED}.")

    monkeypatch.setattr(app.runner, "load_backend", refuse)


def _generate(target: Path, draft: str, capsys) -> tuple[int, str]:
    return run_cli(["generate", "--model", str(target), "--backend", "torch", "--draft", draft, "--prompt", "hi"],
                   capsys)


# Configs and weights each refused by pairing and by `models info`, naming the file and the field

EAGLE3_LAYER = "transformer_layer_config"
CONFIG_FAULTS = {
    # finding 4: oddly typed or damaged
    "eagle3 hidden_size a list": ("eagle3", f"{EAGLE3_LAYER}.hidden_size", [64], "hidden_size"),
    "eagle3 num_attention_heads 0": ("eagle3", f"{EAGLE3_LAYER}.num_attention_heads", 0, "num_attention_heads"),
    "eagle3 num_hidden_layers 0": ("eagle3", f"{EAGLE3_LAYER}.num_hidden_layers", 0, "num_hidden_layers"),
    "eagle3 layers read in words": ("eagle3", "eagle_aux_hidden_state_layer_ids", "0, 1, 2",
                                    "eagle_aux_hidden_state_layer_ids"),
    "eagle3 a flag in words": ("eagle3", "norm_before_residual", "false", "norm_before_residual"),
    "eagle3 num_key_value_heads 3 of 4": ("eagle3", f"{EAGLE3_LAYER}.num_key_value_heads", 3, "num_key_value_heads"),
    "dflash dflash_config a list": ("dflash", "dflash_config", [0, 2], "dflash_config"),
    "dflash hidden_size a list": ("dflash", "hidden_size", [64], "hidden_size"),
    "dflash num_attention_heads 0": ("dflash", "num_attention_heads", 0, "num_attention_heads"),
    "dflash num_hidden_layers 0": ("dflash", "num_hidden_layers", 0, "num_hidden_layers"),
    "dflash layer_types a word": ("dflash", "layer_types", 7, "layer_types"),
    "dflash target layers a word": ("dflash", "dflash_config.target_layer_ids", "all",
                                    "dflash_config.target_layer_ids"),
    "dflash softcap in words": ("dflash", "final_logit_softcapping", "thirty", "final_logit_softcapping"),
    # finding 5: values that are not numbers, a width left out
    "eagle3 intermediate_size in words": ("eagle3", f"{EAGLE3_LAYER}.intermediate_size", "abc", "intermediate_size"),
    "eagle3 draft_vocab_size in words": ("eagle3", "draft_vocab_size", "24k", "draft_vocab_size"),
    "eagle3 target_hidden_size in words": ("eagle3", "target_hidden_size", "64", "target_hidden_size"),
    "eagle3 no hidden_size": ("eagle3", f"{EAGLE3_LAYER}.hidden_size", DELETE, "hidden_size"),
    "dflash intermediate_size in words": ("dflash", "intermediate_size", "abc", "intermediate_size"),
    "dflash mask token in words": ("dflash", "dflash_config.mask_token_id", "zero", "dflash_config.mask_token_id"),
    "dflash block_size in words": ("dflash", "block_size", "4", "block_size"),
    "dflash no hidden_size": ("dflash", "hidden_size", DELETE, "hidden_size"),
    # finding 2: widths no drafter has
    "eagle3 intermediate_size 10**9": ("eagle3", f"{EAGLE3_LAYER}.intermediate_size", 10**9, "intermediate_size"),
    "eagle3 hidden_size 10**9": ("eagle3", f"{EAGLE3_LAYER}.hidden_size", 10**9, "hidden_size"),
    "dflash intermediate_size 10**9": ("dflash", "intermediate_size", 10**9, "intermediate_size"),
    # finding 3: a block that would stall the answer
    "dflash block_size 10**6": ("dflash", "block_size", 10**6, "block_size"),
    "dflash block_size 10**6 in dflash_config": ("dflash", "dflash_config.block_size", 10**6,
                                                 "dflash_config.block_size"),
}


def _faulty(heads, root: Path, kind: str, field: str, value) -> Path:
    folder = _copy(heads, kind, root)
    if kind == "eagle3" and field.endswith("hidden_size") and value == 10**9:
        _edit(folder, "target_hidden_size", 64)  # still drafts for the tiny target: only the head's width is wrong
    _edit(folder, field, value)
    return folder


@pytest.mark.parametrize("case", CONFIG_FAULTS.values(), ids=CONFIG_FAULTS.keys())
def test_a_damaged_head_config_is_refused_naming_the_file_and_field_before_any_weights_load(
        case, heads, tmp_path, capsys, no_weights_load):
    kind, field, value, named = case
    folder = _faulty(heads, tmp_path, kind, field, value)
    before = snapshot(tmp_path)
    code, err = _generate(heads["target"], f"{kind}:{folder}", capsys)
    assert code == 2
    assert_clear(err, str(folder / "config.json"), named)
    assert LOADED not in err and "invalid literal" not in err and "0 wide" not in err
    code, err = run_cli(["models", "info", str(folder)], capsys)  # what it refuses, said as pairing says it
    assert code == 2
    assert_clear(err, str(folder / "config.json"), named)
    assert snapshot(tmp_path) == before  # nothing written, nothing moved


def test_a_block_longer_than_a_round_drafts_is_refused_and_one_that_fits_is_read(heads, tmp_path, capsys):
    from app.models.dflash_head import read_dflash
    from app.models.errors import ModelFileError
    from app.models.head_files import MAX_BLOCK

    config = json.loads((heads["target"] / "config.json").read_text())
    folder = _copy(heads, "dflash", tmp_path)
    _edit(folder, "block_size", MAX_BLOCK)
    assert read_dflash(folder, config, weights=False).block_size == MAX_BLOCK == 33  # a fixed k of 32, and the anchor
    from app.cli import main

    assert main(["models", "info", str(folder)]) == 0
    assert f"drafts a block of {MAX_BLOCK} (up to {MAX_BLOCK - 1} tokens a pass)" in capsys.readouterr().out
    _edit(folder, "block_size", MAX_BLOCK + 1)
    with pytest.raises(ModelFileError, match="block_size is 34, but Tandem drafts at most 32 tokens a round"):
        read_dflash(folder, config, weights=False)  # the hub's check on the config alone says it too


WEIGHT_FAULTS = {"eagle3 cut short": ("eagle3", 100), "dflash cut short": ("dflash", 100),
                 "eagle3 one byte short": ("eagle3", 1), "dflash bytes after the last tensor": ("dflash", -8)}


@pytest.mark.parametrize("case", WEIGHT_FAULTS.values(), ids=WEIGHT_FAULTS.keys())
def test_a_head_whose_weights_are_cut_short_is_refused_before_the_target_loads(case, heads, tmp_path, capsys,
                                                                               no_weights_load):
    """The header reads whole, so every header check passed; safetensors refused it only once the
    target had loaded, from inside the head's load."""
    kind, cut = case
    folder = _copy(heads, kind, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-cut] if cut > 0 else data + b"\0" * -cut)
    code, err = _generate(heads["target"], f"{kind}:{folder}", capsys)
    assert code == 2
    assert_clear(err, str(weights), "Download the")
    assert LOADED not in err
    code, err = run_cli(["models", "info", str(folder)], capsys)
    assert code == 2
    assert_clear(err, str(weights))


# Finding 2: the memory a config's shapes take, counted before any layer is built

@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_config_whose_layers_outgrow_free_memory_is_refused_before_they_are_built(kind, heads, tmp_path, capsys,
                                                                                   monkeypatch, no_weights_load):
    """A width in range (2**20) with a file of a few hundred kB: its MLP alone is 3 x 64 x 2**20
    numbers, 805 MB at float32 as built, where 400 MB are free."""
    from app.models.memory import FREE_MEMORY_ENV

    folder = _copy(heads, kind, tmp_path)
    _edit(folder, f"{EAGLE3_LAYER}.intermediate_size" if kind == "eagle3" else "intermediate_size", 2**20)
    monkeypatch.setenv(FREE_MEMORY_ENV, "400MB")
    code, err = _generate(heads["target"], f"{kind}:{folder}", capsys)
    assert code == 2
    assert_clear(err, "does not fit", "the draft")
    assert LOADED not in err
    monkeypatch.setenv(FREE_MEMORY_ENV, "8GB")  # the same head, where its layers fit: every check passes
    code, err = _generate(heads["target"], f"{kind}:{folder}", capsys)
    assert code == 2 and LOADED in err


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_the_memory_counted_is_what_the_modules_hold(kind, heads):
    """Counted from the config, the numbers are exactly those of the modules the load builds."""
    config = json.loads((heads["target"] / "config.json").read_text())
    if kind == "eagle3":
        from app.engine.backends.eagle3_torch import Eagle3Modules, layer_config
        from app.models.eagle3_head import read_eagle3

        head = read_eagle3(heads[kind], config)
        modules = Eagle3Modules(head, layer_config(head))
    else:
        from app.engine.backends.dflash_torch import DFlashModules, layer_config
        from app.models.dflash_head import read_dflash

        head = read_dflash(heads[kind], config)
        assert head.layer_count == 2
        modules = DFlashModules(head, layer_config(head))
    built = sum(t.numel() for name, t in modules.state_dict().items() if not name.startswith("rotary_emb."))
    assert head.parameter_count == built
    assert head.memory_bytes == max(4 * built, 2 * head.weights_bytes)


# An aligned draft head's config and weights

@pytest.fixture
def aligned_copy(tmp_path) -> Path:
    from app.models.demo import demo_head_dir

    return Path(shutil.copytree(demo_head_dir(), tmp_path / "aligned-head"))


def test_an_aligned_heads_width_in_words_is_refused_naming_the_file_and_field(aligned_copy, capsys, demo,
                                                                              no_weights_load):
    _edit(aligned_copy, "hidden_size", "576")
    code, err = run_cli(["generate", "--backend", "torch", "--draft", f"head:{aligned_copy}", "--prompt", "hi"],
                        capsys)
    assert code == 2
    assert_clear(err, str(aligned_copy / "config.json"), "hidden_size", "Align the draft again")
    assert LOADED not in err and "invalid literal" not in err


def test_an_aligned_head_cut_short_is_refused_before_the_target_loads(aligned_copy, capsys, demo, no_weights_load):
    weights = aligned_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    code, err = run_cli(["generate", "--backend", "torch", "--draft", f"head:{aligned_copy}", "--prompt", "hi"],
                        capsys)
    assert code == 2
    assert_clear(err, str(weights), "cut short", "Align the draft again")
    assert LOADED not in err


# Finding 6: pairs.json naming as an alignment a draft `tandem-cli align` never writes

def _not_drafts(heads, root: Path) -> dict[str, str]:
    plain = heads["target"]  # a model, not a draft align wrote
    (root / "empty").mkdir()
    return {"eagle3:<a model>": f"eagle3:{plain}", "dflash:<a model>": f"dflash:{plain}",
            "assistant:<a model>": f"assistant:{plain}", "eagle3:<a hub id>": "eagle3:org/some-head",
            "<a folder of no model>": str(root / "empty"), "<a model align did not write>": str(plain)}


BAD_ALIGNED = ["eagle3:<a model>", "dflash:<a model>", "assistant:<a model>", "eagle3:<a hub id>",
               "<a folder of no model>", "<a model align did not write>"]  # head:<a model>: test_data_file_fields.py


@pytest.mark.parametrize("which", BAD_ALIGNED)
def test_an_alignment_to_a_draft_align_never_writes_is_named_and_its_target_still_loads(
        which, heads, tmp_path, capsys, no_weights_load):
    from app.draft_choice import PROMPT_LOOKUP
    from app.models.pair_memory import PairMemory, alignment_key
    from app.paths import data_dir
    from app.runner import auto_draft

    aligned = _not_drafts(heads, tmp_path)[which]
    target = str(heads["target"])
    key = alignment_key("torch", target)
    trial = {"acceptance": 0.5, "speedup": 1.5, "tokens_per_pass": 2.0, "tokens": 96, "measured_at": 1.0}
    other = {"aligned": "/models/a-draft", "original": "ngram", "before": trial, "after": trial,
             "agreement": [0.1, 0.5], "active": True}
    pairs = data_dir() / "pairs.json"
    pairs.parent.mkdir(parents=True, exist_ok=True)
    pairs.write_text(json.dumps({"alignments": {key: {**other, "aligned": aligned}, "torch|/models/a": other}}))
    written = pairs.read_bytes()
    memory = PairMemory()
    assert memory.alignment("torch", target) is None
    assert memory.alignment("torch", "/models/a") is not None  # the good entry is kept
    assert_clear(memory.notice, str(pairs), "alignments", key, "aligned", aligned)
    assert auto_draft(target, "torch") == PROMPT_LOOKUP  # its default draft
    code, err = _generate(heads["target"], "auto", capsys)  # and it loads with it
    assert code == 2 and LOADED in err, err
    assert pairs.read_bytes() == written  # nothing lost: the file stays as it was until the next save
