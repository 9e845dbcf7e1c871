"""The fuzz test: bad inputs of every kind a user can hand Tandem, each ending in a clear message
(a sentence naming the problem: no traceback, not a bare exception class) with nothing lost.

Kinds: model files and folders given to the CLI (corrupt and truncated safetensors and GGUF,
symbolic links that loop or dangle, empty folders, pickled-only weights, 5,000-character names,
folders where files belong); CLI values; the window's settings file and pairs.json; texts and
links dropped on a model slot. Fast: every check here runs before any weights load (the CLI is
called in-process; what it would load is refused first)."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest


pytest.importorskip("pytestqt")

RAW_EXCEPTION = re.compile(r"^[A-Za-z_.]*(Error|Exception|Warning|Interrupt)\b:?")


def assert_clear(message: str, *names: str) -> None:
    """A message a person can act on: the sentence names the problem (and `names`), and it is
    neither a traceback nor an exception's class name standing for the message."""
    text = message.strip()
    assert text, "no message at all"
    assert "Traceback" not in text, text
    body = text.splitlines()[-1]  # argparse prints its usage line first
    body = re.sub(r"^(tandem-cli: |tandem-cli \w+: error: )", "", body)
    assert not RAW_EXCEPTION.match(body), body
    assert len(body.split()) >= 4, body  # a sentence, not a bare errno or a class name
    for name in names:
        assert name in text, (name, text)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    from app.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage, a message and exit 2
        code = exc.code
    captured = capsys.readouterr()
    assert captured.out == "", "nothing may be generated from a bad input"
    return code, captured.err


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (not following links), to show a refusal changed nothing."""
    seen: dict[str, bytes | str] = {}
    for entry in sorted(root.rglob("*")):
        key = str(entry.relative_to(root))
        if entry.is_symlink():
            seen[key] = "-> " + os.readlink(entry)
        elif entry.is_file():
            seen[key] = entry.read_bytes()
        else:
            seen[key] = "dir"
    return seen


# Model files and folders


def _config(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return folder


def _safetensors(header, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _weights(content: bytes):
    def make(root: Path) -> tuple[Path, str]:
        folder = _config(root / "model")
        (folder / "model.safetensors").write_bytes(content)
        return folder, "model.safetensors"
    return make


def _gguf_bytes(root: Path) -> bytes:
    import gguf
    import numpy as np

    path = root / "source.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(64)])  # a GGUF without a vocabulary is refused first
    writer.add_tensor("token_embd.weight", np.ones((64, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    path.unlink()
    return data


def _gguf(damage):
    def make(root: Path) -> tuple[Path, str]:
        path = root / "model.gguf"
        path.write_bytes(damage(_gguf_bytes(root)))
        return path, "model.gguf"
    return make


def _empty_folder(root):
    (root / "empty").mkdir()
    return root / "empty", "empty"


def _config_only(root):
    return _config(root / "noweights"), "noweights"


def _pickled_only(root):
    folder = _config(root / "pickled")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    return folder, "pytorch_model.bin"


def _config_not_json(root):
    folder = _config(root / "m")
    (folder / "config.json").write_text("{model_type: llama")
    (folder / "model.safetensors").write_bytes(_safetensors({}))
    return folder, "config.json"


def _config_is_a_folder(root):
    folder = root / "m"
    (folder / "config.json").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(_safetensors({}))
    return folder, "config.json"


def _config_loops(root):
    folder = root / "m"
    folder.mkdir()
    os.symlink("config.json", folder / "config.json")
    (folder / "model.safetensors").write_bytes(_safetensors({}))
    return folder, "config.json"


def _weights_loop(root):
    folder = _config(root / "m")
    os.symlink("model.safetensors", folder / "model.safetensors")
    return folder, "model.safetensors is a symbolic link that loops"


def _weights_dangling(root):
    folder = _config(root / "m")
    os.symlink(root / "elsewhere" / "model.safetensors", folder / "model.safetensors")
    return folder, "which does not exist"


def _weights_is_a_folder(root):
    folder = _config(root / "m")
    (folder / "model.safetensors").mkdir()
    return folder, "model.safetensors is a folder"


def _index_not_json(root):
    folder = _config(root / "m")
    (folder / "model-00001-of-00001.safetensors").write_bytes(_safetensors({}))
    (folder / "model.safetensors.index.json").write_text("not json")
    return folder, "model.safetensors.index.json"


def _index_missing_shard(root):
    folder = _config(root / "m")
    (folder / "model-00001-of-00002.safetensors").write_bytes(_safetensors({}))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return folder, "model-00002-of-00002.safetensors"


def _index_names_no_files(root):
    folder = _config(root / "m")
    (folder / "model.safetensors").write_bytes(_safetensors({}))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 7}}))
    return folder, "model.safetensors.index.json"


def _shard_loops(root):
    folder = _config(root / "m")
    os.symlink("model-00001-of-00001.safetensors", folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00001.safetensors"}}))
    return folder, "model-00001-of-00001.safetensors is a symbolic link that loops"


def _model_folder_loops(root):
    os.symlink("loop", root / "loop")
    return root / "loop", "loop"


def _name_5000(root):
    return root / ("m" * 5000), "File name too long"


def _nested_too_long(root):
    return root / "/".join(["d" * 200] * 25), "File name too long"


def _no_such_path(root):
    return root / "nowhere" / "model", "no such file or folder"


def _pickled_file(root):
    path = root / "model.pt"
    path.write_bytes(b"\x80\x04K\x01.")
    return path, "model.pt"


def _gguf_folder(root):
    (root / "model.gguf").mkdir()
    return root / "model.gguf", "model.gguf"


def _gguf_loops(root):
    os.symlink("model.gguf", root / "model.gguf")
    return root / "model.gguf", "model.gguf"


def _gguf_dangling(root):
    os.symlink(root / "gone.gguf", root / "model.gguf")
    return root / "model.gguf", "model.gguf"


def _tokenizer(tokenizer_config: dict | None, named: str, tokenizer_json: str | None = None):
    """A model folder whose config and weights pass, with these tokenizer files (None: none)."""
    def make(root: Path) -> tuple[Path, str]:
        from tokenizers import Tokenizer, models

        folder = _config(root / "m")
        (folder / "model.safetensors").write_bytes(_safetensors({"w": {"dtype": "F32", "shape": [1],
                                                                      "data_offsets": [0, 4]}}, b"\0" * 4))
        if tokenizer_config is not None:
            Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
            (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        if tokenizer_json is not None:
            (folder / "tokenizer.json").write_text(tokenizer_json)
        return folder, named
    return make


FILES = {
    "an empty folder": _empty_folder,
    "config.json and no weights": _config_only,
    "pickled weights only": _pickled_only,
    "config.json not JSON": _config_not_json,
    "config.json a folder": _config_is_a_folder,
    "config.json a link loop": _config_loops,
    "weights empty": _weights(b""),
    "weights 4 bytes": _weights(b"\x10\0\0\0"),
    "weights header longer than the file": _weights(_safetensors({}, length=10_000)),
    "weights header over 100 MB": _weights(_safetensors({}, length=2**40)),
    "weights header not JSON": _weights(_safetensors(b"{not json!}")),
    "weights header not UTF-8": _weights(_safetensors(b'{"\xff\xfe": 1}')),
    "weights header a list": _weights(_safetensors([1, 2, 3])),
    "weights tensor without a range": _weights(_safetensors({"w": {"dtype": "F32", "shape": [4]}})),
    "weights tensor range not numbers": _weights(_safetensors({"w": {"data_offsets": ["a", "b"]}})),
    "weights truncated": _weights(_safetensors({"w": {"dtype": "F32", "shape": [1024],
                                                      "data_offsets": [0, 4096]}}, b"\0" * 100)),
    "weights a symlink loop": _weights_loop,
    "weights a dangling link": _weights_dangling,
    "weights a folder": _weights_is_a_folder,
    "index not JSON": _index_not_json,
    "index with a missing shard": _index_missing_shard,
    "index naming no files": _index_names_no_files,
    "shard a symlink loop": _shard_loops,
    "model folder a symlink loop": _model_folder_loops,
    "a name of 5,000 characters": _name_5000,
    "a path of 5,000 characters": _nested_too_long,
    "no such path": _no_such_path,
    "a pickled checkpoint file": _pickled_file,
    "gguf empty": _gguf(lambda data: b""),
    "gguf wrong magic": _gguf(lambda data: b"GGML" + data[4:]),
    "gguf header garbage": _gguf(lambda data: data[:8] + b"\xff" * 64),
    "gguf truncated": _gguf(lambda data: data[: len(data) - 4000]),
    "gguf only its magic": _gguf(lambda data: data[:4]),
    "gguf a folder": _gguf_folder,
    "gguf a symlink loop": _gguf_loops,
    "gguf a dangling link": _gguf_dangling,
    "tokenizer asks to run shipped code": _tokenizer(
        {"auto_map": {"AutoTokenizer": ["tokenization_tiny.TinyTokenizer", None]}}, "auto_map"),
    "tokenizer asks for shipped code (a list)": _tokenizer(
        {"auto_map": ["tokenization_tiny.TinyTokenizer", None]}, "never runs"),
    "no tokenizer files": _tokenizer(None, "tokenizer.json and tokenizer_config.json are missing"),
    "tokenizer.json not JSON": _tokenizer({}, "tokenizer", tokenizer_json="{not json"),
}


@pytest.mark.parametrize("make", FILES.values(), ids=FILES.keys())
def test_a_bad_model_file_or_folder_is_refused_in_words(make, tmp_path, capsys):
    root = tmp_path / "inputs"
    root.mkdir()
    path, named = make(root)
    before = snapshot(root)
    code, err = run_cli(["generate", "--model", str(path), "--backend", "torch", "--draft", "none",
                         "--prompt", "hi"], capsys)
    assert code in (1, 2)
    assert_clear(err, named)
    assert len(err) < 1000, "a 5,000-character name is not repeated whole"
    assert snapshot(root) == before  # the user's files are as they were


# CLI values

CLI_VALUES = {
    "temperature nan": (["--temperature", "nan"], "temperature"),
    "temperature inf": (["--temperature", "inf"], "temperature"),
    "temperature -1": (["--temperature", "-1"], "temperature"),
    "temperature 1e-40": (["--temperature", "1e-40"], "temperature"),
    "temperature a word": (["--temperature", "warm"], "--temperature"),
    "top-p 0": (["--top-p", "0"], "top-p"),
    "top-p 1.5": (["--top-p", "1.5"], "top-p"),
    "top-p nan": (["--top-p", "nan"], "top-p"),
    "top-k -1": (["--top-k", "-1"], "top-k"),
    "top-k 2.5": (["--top-k", "2.5"], "--top-k"),
    "max-tokens 0": (["--max-tokens", "0"], "--max-tokens"),
    "max-tokens -5": (["--max-tokens", "-5"], "--max-tokens"),
    "max-tokens 1e3": (["--max-tokens", "1e3"], "--max-tokens"),
    "draft-tokens 0": (["--draft-tokens", "0"], "--draft-tokens"),
    "draft-tokens 99": (["--draft-tokens", "99"], "--draft-tokens"),
    "seed -1": (["--seed", "-1"], "seed"),
    "prompt not UTF-8": (["--prompt", b"\xff\xfe caf\xe9".decode("utf-8", "surrogateescape")], "--prompt"),
    "system not UTF-8": (["--system", b"r\xe9sum\xe9".decode("utf-8", "surrogateescape")], "--system"),
    "precision unknown": (["--precision", "int3"], "--precision"),
    "compile unknown": (["--compile", "always"], "--compile"),
    "context 0": (["--context", "0"], "--context"),
    "context a word": (["--context", "long"], "--context"),
    "context 1.5": (["--context", "1.5"], "--context"),
    "draft-tokens a word": (["--draft-tokens", "abc"], "--draft-tokens: 'abc' is not a whole number"),
    "draft-tokens 2.5": (["--draft-tokens", "2.5"], "--draft-tokens"),
    "draft-tokens empty": (["--draft-tokens", ""], "--draft-tokens"),
    "temperature empty": (["--temperature", ""], "--temperature"),
    "top-p a word": (["--top-p", "high"], "--top-p: 'high' is not a number"),
    "top-k a word": (["--top-k", "many"], "--top-k: 'many' is not a whole number"),
    "seed a word": (["--seed", "lucky"], "--seed"),
    "seed 1.5": (["--seed", "1.5"], "--seed"),
    "max-tokens a word": (["--max-tokens", "lots"], "--max-tokens"),
    "model empty": (["--model", ""], "empty"),
    "model spaces": (["--model", "   "], "empty"),
    "target empty": (["--target", ""], "--target"),
    "draft empty": (["--draft", ""], "no draft named"),
    "draft head: and no folder": (["--draft", "head:"], "names no folder"),
    "draft assistant: and no folder": (["--draft", "assistant: "], "names no folder"),
    "draft self: and no precision": (["--draft", "self:"], "no precision named"),
    "draft self: at an unknown precision": (["--draft", "self:int3"], "int3"),
    "draft a request's pair": (["--draft", "pair"], "loads nothing"),
    "draft with a NUL": (["--draft", "a\0b"], "NUL"),
}


@pytest.mark.parametrize("args, named", CLI_VALUES.values(), ids=CLI_VALUES.keys())
def test_a_bad_cli_value_is_refused_before_any_model_loads(args, named, capsys, monkeypatch):
    from app.runner import Runner

    def never(*a, **k):
        raise AssertionError("a model was loaded before the bad value was refused")

    monkeypatch.setattr(Runner, "load", never)
    argv = ["generate", *args] if "--prompt" in args else ["generate", "--prompt", "hi", *args]
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert_clear(err, named)
    assert not re.search(r"invalid \S+ value", err), err  # argparse naming a type function ("_draft_tokens")


@pytest.mark.parametrize("args, named", [
    (["--ks", "0,99"], "--ks"), (["--repeats", "0"], "--repeats"), (["--prompts", "-1"], "--prompts"),
    (["--temperature", "nan"], "temperature"),
], ids=["bench ks", "bench repeats", "bench prompts", "bench temperature"])
def test_a_bad_bench_value_is_refused_before_any_model_loads(args, named, capsys, monkeypatch):
    from app.runner import Runner

    monkeypatch.setattr(Runner, "load", lambda *a, **k: pytest.fail("loaded"))
    code, err = run_cli(["bench", *args], capsys)
    assert code == 2
    assert_clear(err, named)


# Other commands' values: every `type=` names its option, an empty model or path is refused as empty

COMMAND_VALUES = {
    "serve port a word": (["serve", "--port", "http"], "--port: 'http' is not a whole number"),
    "serve model empty": (["serve", "--model", ""], "empty"),
    "serve draft head: alone": (["serve", "--draft", "head:"], "names no folder"),
    "bench model empty": (["bench", "--model", ""], "empty"),
    "bench top-k a word": (["bench", "--top-k", "x"], "--top-k"),
    "bench top-p a word": (["bench", "--top-p", "x"], "--top-p"),
    "bench seed a word": (["bench", "--seed", "x"], "--seed"),
    "bench ks words": (["bench", "--ks", "two,four"], "'two,four'"),
    "bench json empty": (["bench", "--json", ""], "--json"),
    "bench suite empty": (["bench", "--suite", ""], "--suite"),
    "align minutes a word": (["align", "--minutes", "soon"], "--minutes: 'soon' is not a number"),
    "align temperature a word": (["align", "--temperature", "warm"], "--temperature"),
    "align seed 1.5": (["align", "--seed", "1.5"], "--seed"),
    "align model empty": (["align", "--model", ""], "empty"),
    "align draft empty": (["align", "--draft", ""], "--draft"),
    "align out empty": (["align", "--out", ""], "--out"),
    "import gguf empty": (["import", "", "out"], "empty"),
    "import out empty": (["import", "model.gguf", ""], "empty"),
    "models info empty": (["models", "info", ""], "empty"),
}


@pytest.mark.parametrize("argv, named", COMMAND_VALUES.values(), ids=COMMAND_VALUES.keys())
def test_a_bad_value_to_any_command_is_refused_before_anything_loads(argv, named, capsys, monkeypatch):
    import app.align.command
    import app.models.gguf_import
    from app.runner import Runner

    def never(*a, **k):  # an AssertionError, not pytest.fail: the server's engine thread passes it on
        raise AssertionError("a refused value started the command's work")

    # whatever a command would start, a refused value starts none of it (align would run for minutes)
    for owner, name in ((Runner, "load"), (app.align.command, "run"), (app.models.gguf_import, "import_gguf")):
        monkeypatch.setattr(owner, name, never)
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert_clear(err, named)
    assert not re.search(r"invalid \S+ value", err), err  # argparse naming a type function


def _a_file(root: Path) -> Path:
    (root / "notes.txt").write_text("mine")
    return root / "notes.txt"


def _dangling(root: Path) -> Path:
    os.symlink(root / "gone", root / "out")
    return root / "out"


IMPORT_OUTPUTS = {
    "the output a file": (_a_file, "is a file, not a folder"),
    "the output inside a file": (lambda root: _a_file(root) / "models", "is a file, not a folder"),
    "the output a dangling link": (_dangling, "points nowhere"),
}


@pytest.mark.parametrize("make, named", IMPORT_OUTPUTS.values(), ids=IMPORT_OUTPUTS.keys())
def test_an_import_into_a_path_that_is_no_folder_is_refused_in_words(make, named, tmp_path, capsys):
    root = tmp_path / "inputs"
    root.mkdir()
    (root / "model.gguf").write_bytes(_gguf_bytes(root))
    out = make(root)
    before = snapshot(root)
    code, err = run_cli(["import", str(root / "model.gguf"), str(out)], capsys)
    assert code in (1, 2)
    assert_clear(err, str(out), named)
    assert "Check that the path exists" not in err, err  # the advice for unreadable files, not this
    assert snapshot(root) == before


# Drafts refused while pairing, before any weights load (the demo as the target)

def _head_folder(kind: str):
    def make(root: Path) -> tuple[str, str]:
        path = root / "head"
        if kind == "a file":
            path.write_text("not a head")
        elif kind == "an empty folder":
            path.mkdir()
        elif kind == "a dangling link":
            os.symlink(root / "gone", path)
        return f"head:{path}", {"nowhere": "no such folder", "a file": "is a file, not a folder",
                                "an empty folder": "not an aligned draft head",
                                "a dangling link": "does not exist"}[kind]
    return make


def _empty_draft(root: Path) -> tuple[str, str]:
    (root / "empty").mkdir()
    return str(root / "empty"), "config.json"


DRAFTS = {
    "head: nowhere": _head_folder("nowhere"),
    "head: a file": _head_folder("a file"),
    "head: an empty folder": _head_folder("an empty folder"),
    "head: a dangling link": _head_folder("a dangling link"),
    "mtp on the demo": lambda root: ("mtp", "SmolLM2 135M Instruct (demo) has no built-in"),
    "assistant: nowhere": lambda root: (f"assistant:{root / 'nowhere'}", "no such file or folder"),
    "a draft model nowhere": lambda root: (str(root / "nowhere"), "no such file or folder"),
    "a draft model an empty folder": _empty_draft,
}


@pytest.mark.parametrize("make", DRAFTS.values(), ids=DRAFTS.keys())
def test_a_draft_that_cannot_pair_is_refused_in_words_before_any_weights_load(make, tmp_path, capsys,
                                                                                monkeypatch):
    import app.runner

    monkeypatch.setattr(app.runner, "load_backend", lambda *a, **k: pytest.fail("weights were loaded"))
    draft, named = make(tmp_path)
    code, err = run_cli(["generate", "--backend", "torch", "--draft", draft, "--prompt", "hi"], capsys)
    assert code in (1, 2)
    assert_clear(err, named)
    assert not re.search(r"\b(gguf|hf) has no", err), err  # the demo by its name, not its cache folder's
