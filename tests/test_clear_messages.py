"""Issue 34's unclear messages from the CLI, model folders and drafters: each now says what was
wrong in the user's words (the option, the model by the name the app shows, the tensor with its
shape), with no internal name (a function's, a class's, a cache folder's) and no traceback.

Fast: the CLI is called in-process and every refusal here comes before the target's weights
load, except the MTP ones, whose target is a tiny random Qwen3.5."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.test_bad_inputs import assert_clear, run_cli

DEMO_NAME = "SmolLM2 135M Instruct"  # the demo as the window and the CLI name it (app/models/names.py)


def _typed_options() -> list[tuple[tuple[str, ...], str]]:
    """(subcommand words, option) for every option of tandem-cli that has an argparse `type=`."""
    from app.cli import build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*words, name))
            elif action.type is not None and action.option_strings:
                found.append((words, action.option_strings[0]))

    walk(build_parser(), ())
    return found


TYPED = _typed_options()
NEEDED = {("generate",): ["--prompt", "hi"], ("remote", "models"): ["http://gpu-box:8000"]}  # what a subcommand
# requires besides the option


@pytest.mark.parametrize("words, option", TYPED, ids=[" ".join((*w, o)) for w, o in TYPED])
def test_a_refused_option_value_names_the_option_not_a_function(words, option, capsys):
    """`--draft-tokens abc` said "invalid _draft_tokens value": argparse names the type function
    whenever one raises a plain ValueError. Every typed option refuses a word or an empty value
    in words naming the option and the value."""
    from app.cli import build_parser

    refused = []
    for value in ("abc!", ""):
        try:
            build_parser().parse_args([*words, *NEEDED.get(words, []), option, value])
        except SystemExit:
            refused.append((value, capsys.readouterr().err))
    assert refused, f"{option} took both a word and an empty value"
    for value, err in refused:
        assert_clear(err, option)
        assert not re.search(r"invalid \S+ value", err), err
        if value:
            assert repr(value) in err, err


EMPTY = {
    "generate --model": ["generate", "--prompt", "hi", "--model", ""],
    "generate --model spaces": ["generate", "--prompt", "hi", "--model", "   "],
    "generate --target": ["generate", "--prompt", "hi", "--target", ""],
    "serve --model": ["serve", "--model", ""],
    "bench --model": ["bench", "--model", ""],
    "align --model": ["align", "--model", ""],
    "import gguf": ["import", "", "out"],
    "import out": ["import", "model.gguf", ""],
    "models info": ["models", "info", ""],
    "generate --draft": ["generate", "--prompt", "hi", "--draft", ""],
    "generate --draft head:": ["generate", "--prompt", "hi", "--draft", "head:"],
    "generate --draft assistant:": ["generate", "--prompt", "hi", "--draft", "assistant: "],
}


@pytest.mark.parametrize("argv", EMPTY.values(), ids=EMPTY.keys())
def test_an_empty_model_or_path_is_refused_as_empty(argv, capsys, monkeypatch):
    """`--model ""` was read as the current folder (".: no config.json ...")."""
    from app.runner import Runner

    monkeypatch.setattr(Runner, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert_clear(err)
    assert "empty" in err or "names no" in err, err
    assert ".: " not in err and "config.json" not in err and "needs source" not in err, err


@pytest.mark.parametrize("inside", [False, True], ids=["the output a file", "the output inside a file"])
def test_import_into_a_file_says_the_output_is_a_file(inside, demo_gguf, tmp_path, capsys):
    """`tandem-cli import` into an existing file got advice about broken or looping links."""
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    out = existing / "models" if inside else existing
    code, err = run_cli(["import", str(demo_gguf), str(out)], capsys)
    assert code in (1, 2)
    assert_clear(err, str(out), "is a file, not a folder")
    assert "symbolic link" not in err and "File exists" not in err, err
    assert existing.read_text() == "mine"


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory, demo) -> Path:
    """A tiny Llama saved as a plain safetensors folder (no GGUF import), the demo's tokenizer
    beside it: `tiny-plain` inside a folder named `models`."""
    from tests.factories import tiny_llama

    folder = tmp_path_factory.mktemp("plain") / "models" / "tiny-plain"
    tiny_llama(3).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(demo["hf"] / name, folder / name)
    return folder


def test_self_gguf_on_a_safetensors_model_names_the_model(plain_model, capsys):
    """`--draft self:gguf` on a safetensors model named its parent folder as the model, and said
    it needs "the .gguf file it was imported from" of a model never imported."""
    code, err = run_cli(["generate", "--model", str(plain_model), "--backend", "torch", "--draft", "self:gguf",
                         "--prompt", "hi"], capsys)
    assert code == 2
    assert_clear(err, "tiny-plain", "safetensors", "not imported from a .gguf")
    assert "models:" not in err, err


def _qwen_with_mtp(folder: Path, tokenizer_from: Path, change: dict[str, tuple[int, ...]]) -> Path:
    """A tiny Qwen3.5 with an MTP layer whose tensors named in `change` have the shapes given."""
    import torch

    from app.engine.backends.mtp_torch import build_layer, mtp_config, to_checkpoint_name
    from tests.factories import save_qwen35, tiny_qwen35

    model = tiny_qwen35(5)
    layer = build_layer(model.model, mtp_config(model.config))
    mtp = {"mtp." + to_checkpoint_name(name): value for name, value in layer.state_dict().items()}
    for name, shape in change.items():
        mtp[name] = torch.zeros(shape)
    return save_qwen35(model, folder, tokenizer_from, extra=mtp)


MISSHAPEN = {  # the tensor, its wrong shape, and the shape the tiny model's layer takes
    "mtp.fc": ("mtp.fc.weight", (64, 100), "64 x 128"),
    "mtp.layers.0": ("mtp.layers.0.self_attn.q_proj.weight", (7, 64), "128 x 64"),
}


@pytest.fixture(scope="module")
def misshapen(tmp_path_factory, demo) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp")
    return {key: _qwen_with_mtp(root / f"qwen-{key.replace('.', '-')}", demo["hf"], {name: shape})
            for key, (name, shape, _) in MISSHAPEN.items()}


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("key", MISSHAPEN)
def test_a_misshapen_mtp_tensor_is_named_with_its_shape_and_the_one_expected(key, backend, misshapen, capsys):
    """It said "its MTP weights do not fit ... (Error(s) in loading state_dict for MtpLayer:)":
    the tensor unnamed, the detail cut off (MLX: "Expected shape ... for parameter fc.weight")."""
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    name, shape, wanted = MISSHAPEN[key]
    folder = misshapen[key]
    code, err = run_cli(["generate", "--model", str(folder), "--backend", backend, "--draft", "mtp",
                         "--prompt", "hi"], capsys)
    assert code == 2
    assert_clear(err, folder.name, name, " x ".join(map(str, shape)), wanted)
    assert "MtpLayer" not in err and "Error(s)" not in err and "state_dict" not in err, err


def test_auto_on_a_model_whose_mtp_layer_is_broken_drafts_with_prompt_lookup_and_says_why(misshapen):
    """`--draft auto` refused the whole model for its broken MTP layer."""
    from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP
    from app.runner import Runner

    said = []
    runner = Runner()
    loaded = runner.load(misshapen["mtp.fc"], "torch", draft=AUTO_DRAFT, progress=said.append)
    assert loaded.draft == PROMPT_LOOKUP
    assert runner.drafter is not None and runner.drafter.name == "prompt lookup"
    assert "prompt lookup" in loaded.notice and "mtp.fc.weight" in loaded.notice, loaded.notice
    assert_clear(loaded.notice)
    assert any("mtp.fc.weight" in line for line in said), said  # the CLI prints progress: there too


@pytest.mark.parametrize("spec", ["demo", "demo:float32"])
def test_a_demo_without_mtp_is_refused_by_its_own_name(spec, capsys):
    """"gguf has no built-in multi-token-prediction layer": the demo named by its cache folder."""
    code, err = run_cli(["generate", "--model", spec, "--backend", "torch", "--draft", "mtp", "--prompt", "hi"],
                        capsys)
    assert code == 2
    assert_clear(err, DEMO_NAME, "has no built-in multi-token-prediction layer")
    assert not re.search(r"\b(gguf|hf) has no", err), err


def test_an_assistant_for_the_demo_is_refused_by_the_demos_own_name(demo, tmp_path):
    """"choose another kind of draft for gguf": the loaded target named by its cache folder."""
    from app.engine.assistant import load_assistant_drafter
    from app.models.demo import demo_folder
    from app.models.errors import ModelFileError
    from tests.factories_gemma4 import save_assistant, tiny_assistant

    assistant = save_assistant(tiny_assistant(3), tmp_path / "gemma4-assistant")
    target = SimpleNamespace(folder=demo_folder("torch", lambda message: None), model_type="llama", name="torch")
    with pytest.raises(ModelFileError) as refused:
        load_assistant_drafter(assistant, target)
    assert_clear(str(refused.value), DEMO_NAME, "Gemma 4")
    assert not str(refused.value).rstrip(".").endswith(("for gguf", "for hf")), refused.value


@pytest.mark.parametrize("what", ["nowhere", "a file"])
def test_a_head_that_is_no_folder_is_refused_as_no_such_folder(what, tmp_path, capsys, monkeypatch):
    """`--draft head:/nonexistent` said "not an aligned draft head (its config.json is missing...)"."""
    import app.runner

    monkeypatch.setattr(app.runner, "load_backend", lambda *a, **k: pytest.fail("a model was loaded"))
    path = tmp_path / "heads" / "mine"
    if what == "a file":
        path.parent.mkdir()
        path.write_text("not a head")
    code, err = run_cli(["generate", "--backend", "torch", "--draft", f"head:{path}", "--prompt", "hi"], capsys)
    assert code == 2
    assert_clear(err, str(path), "no such folder" if what == "nowhere" else "is a file, not a folder")
    assert "config.json" not in err, err


AUTO_MAPS = {
    "a class pair": {"AutoTokenizer": ["tokenization_tiny.TinyTokenizer", None]},
    "a list (older files)": ["tokenization_tiny.TinyTokenizer", "tokenization_tiny.TinyTokenizerFast"],
    "a hub reference": {"AutoTokenizer": ["org/repo--tokenization_tiny.TinyTokenizer", None]},
}


@pytest.mark.parametrize("auto_map", AUTO_MAPS.values(), ids=AUTO_MAPS.keys())
def test_a_tokenizer_that_asks_to_run_shipped_code_is_refused_in_words(auto_map, demo, tmp_path, capsys,
                                                                       monkeypatch):
    """transformers' refusal advised trust_remote_code=True, gave a broken hub address, and the
    message went on to claim that files which are there are missing."""
    import app.runner

    monkeypatch.setattr(app.runner, "load_backend", lambda *a, **k: pytest.fail("a model was loaded"))
    folder = tmp_path / "custom-tokenizer"
    shutil.copytree(demo["hf"].parent / "gguf", folder)  # config and tokenizer; the weights stay in the .gguf
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    config["auto_map"] = auto_map
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    code, err = run_cli(["generate", "--model", str(folder), "--backend", "torch", "--draft", "none",
                         "--prompt", "hi"], capsys)
    assert code == 2
    assert_clear(err, "custom-tokenizer", "tokenizer_config.json", "auto_map", "tokenization_tiny",
                 "never runs")
    for wrong in ("trust_remote_code", "hf.co", "https://", "missing", "needs tokenizer.json"):
        assert wrong not in err, (wrong, err)
