"""Faults of issue 46 in the engine's core, each reproduced: a top-p below float resolution (NaN
sampling), a GGUF with no vocabulary (a crash deep in transformers), a kernel cache folder that
cannot be written (compiled kernels written into the program's own folder), libraries' log lines
on every start, and a long prompt read with nothing to show for minutes.

The refusals here are part of the fuzz (tests/test_bad_inputs.py): bad input ends in a clear
message (assert_clear), with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine import prefill
from app.engine.backends import load_backend
from app.engine.drafters import ModelDrafter
from app.engine.events import Finished, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.models import numba_cache
from tests.test_bad_inputs import assert_clear, run_cli, snapshot

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198, 40, 41, 42, 40, 41, 42, 40, 41, 7, 8, 9, 10, 11, 12]
TINY_P = (1e-300, 5e-324, 1e-46)  # each rounds to 0 in float32, the dtype probabilities are in


# 1. A top-p below float resolution


def _probs(backend: str, logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    if backend == "torch":
        from app.engine.backends.verdict_torch import probs_from_logits

        return probs_from_logits(torch.from_numpy(logits), params).numpy()
    import mlx.core as mx

    from app.engine.backends.mlx_backend import probs_from_logits

    return np.array(probs_from_logits(mx.array(logits), params))


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("top_p", TINY_P)
def test_a_top_p_below_float_resolution_keeps_the_likeliest_token(backend, top_p):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    logits = np.random.default_rng(3).standard_normal((4, 50)).astype(np.float32) * 3
    for params in (SamplingParams(temperature=1.0, top_p=top_p), SamplingParams(temperature=0.7, top_p=top_p, top_k=5)):
        probs = _probs(backend, logits, params)
        assert np.isfinite(probs).all(), probs
        assert (probs.argmax(-1) == logits.argmax(-1)).all() and (probs.max(-1) == 1.0).all()
    # an ordinary top-p still keeps the smallest set that reaches it
    probs = _probs(backend, logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert np.isfinite(probs).all() and ((probs > 0).sum(-1) >= 1).all() and ((probs > 0).sum(-1) < 50).all()


def _tokens(events) -> list[int]:
    return [t for e in events if isinstance(e, Round) for t in e.emitted]


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_sampling_at_a_tiny_top_p_answers_the_greedy_answer(backend, tiny_pair):
    """Only the likeliest token is left to sample from, so a sampled answer, alone or drafted by a
    noisy copy (the Leviathan/Chen rule on one-hot rows), is the greedy one."""
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    suffix = "" if backend == "torch" else "_mlx"
    target = load_backend(tiny_pair["target" + suffix], backend)
    draft = load_backend(tiny_pair["near" + suffix], backend)
    greedy = _tokens(generate(target, lambda ids: "", PROMPT, max_tokens=12))
    params = SamplingParams(temperature=1.0, top_p=1e-300, seed=5)
    assert _tokens(generate(target, lambda ids: "", PROMPT, max_tokens=12, params=params)) == greedy
    drafted = list(generate(target, lambda ids: "", PROMPT, drafter=ModelDrafter(draft), draft_tokens=3,
                            max_tokens=12, params=params))
    assert _tokens(drafted) == greedy
    assert any(isinstance(e, Round) and e.drafted for e in drafted)  # the rejection rule did run


def test_the_cli_answers_at_a_tiny_top_p(tiny_pair, capsys):
    from app.cli import main

    model = ["--model", str(tiny_pair["target"]), "--backend", "torch", "--draft", "ngram", "--max-tokens", "6",
             "--prompt", "Hi"]
    assert main(["generate", *model]) == 0
    greedy = capsys.readouterr().out
    assert main(["generate", *model, "--top-p", "1e-300", "--temperature", "1"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == greedy and greedy.strip()


# 7. A GGUF with no vocabulary


@pytest.fixture
def no_vocabulary(tmp_path, tiny_fields) -> Path:
    """A tiny llama GGUF written by gguf's GGUFWriter with an empty token list (which it leaves out)."""
    from tests.factories import tiny_llama, write_gguf

    path = tmp_path / "files" / "novocab.gguf"
    path.parent.mkdir()
    write_gguf(tiny_llama(3), path, dict(tiny_fields, tokens=[], types=[], merges=[]))
    return path


def test_a_gguf_with_no_vocabulary_is_refused_before_anything_is_written(no_vocabulary, tmp_path):
    from app.models.errors import ModelFileError
    from app.models.gguf_import import import_gguf, inspect_gguf

    assert inspect_gguf(no_vocabulary).tokens == 0  # described (models info) all the same
    with pytest.raises(ModelFileError, match="novocab.gguf: this GGUF holds no vocabulary"):
        import_gguf(no_vocabulary, tmp_path / "out", mlx_variants=("mlx",))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["import", "{gguf}", "{out}"],
                                     ["generate", "--model", "{gguf}", "--prompt", "Hi"]])
def test_the_cli_refuses_a_gguf_with_no_vocabulary_in_words(command, no_vocabulary, tmp_path, capsys, monkeypatch):
    """Part of the fuzz: importing or loading it ends in a sentence, and nothing is written (the
    model cache included)."""
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    before = snapshot(tmp_path)
    argv = [part.format(gguf=no_vocabulary, out=tmp_path / "out") for part in command]
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert_clear(err, "novocab.gguf", "this GGUF holds no vocabulary")
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("cache")} == before
    assert not [k for k in after if k.startswith("cache/models/")]


def test_the_header_reader_counts_the_vocabulary_as_ggufs_reader_does(demo_gguf, no_vocabulary):
    import gguf

    from app.models.gguf_header import open_tensors, token_count

    whole = gguf.GGUFReader(demo_gguf)
    assert token_count(open_tensors(demo_gguf)) == token_count(whole) == len(whole.fields["tokenizer.ggml.tokens"].data)
    assert token_count(open_tensors(no_vocabulary)) == 0


# 14. A kernel cache folder that cannot be written

KERNEL_CACHE = '''
import json, sys
from numba.core.registry import CPUDispatcher
from app.models import int4_cpu_torch

def skipped(*args, **kwargs):  # the probe compiles every kernel (minutes here): where they cache is decided before
    raise RuntimeError("probe skipped")

int4_cpu_torch.CodeBlocks.of = skipped
int4_cpu_torch.compiled()
from app.models import kernels_numba
from numba.typed import typedlist
functions = [f for f in vars(kernels_numba).values() if isinstance(f, CPUDispatcher)]
functions += [typedlist._make_list, typedlist._append]
print(json.dumps([type(f._cache).__name__ == "NullCache" or f._cache._impl.locator.get_cache_path()
                  for f in functions]))
'''


def _program_caches() -> set[Path]:
    """Numba's cache files beside the sources: Tandem's and Numba's own."""
    import numba

    return {p for folder in (ROOT / "app", Path(numba.__file__).parent) for p in folder.rglob("*.nb[ic]")}


def _kernel_cache_run(tmp_path: Path, **env: str) -> tuple[list, str]:
    run_env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    run_env.update(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"), TANDEM_CACHE=str(tmp_path / "cache"), **env)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-c", KERNEL_CACHE], env=run_env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("blocked", ["NUMBA_CACHE_DIR", "TANDEM_CACHE/numba"])
def test_an_unwritable_kernel_cache_falls_back_to_a_private_temporary_folder(blocked, tmp_path):
    pytest.importorskip("numba")
    a_file = tmp_path / "a file"
    a_file.write_text("not a folder")
    env = {"NUMBA_CACHE_DIR": str(a_file)} if blocked == "NUMBA_CACHE_DIR" else {}
    if blocked != "NUMBA_CACHE_DIR":
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "numba").write_text("not a folder")
    before = _program_caches()
    paths, err = _kernel_cache_run(tmp_path, **env)
    temporary = tmp_path / "tmp" / numba_cache.temporary_folder().name
    assert len(paths) > 10 and all(isinstance(p, str) and Path(p).is_relative_to(temporary) for p in paths), paths
    if hasattr(os, "getuid"):
        assert temporary.stat().st_mode & 0o777 == 0o700  # this user's alone: cached code is run
    assert _program_caches() == before
    assert err.count("The compiled CPU kernels are cached in") == 1 and "cannot be written" in err, err


def test_with_no_writable_folder_at_all_the_kernels_are_not_cached(tmp_path):
    pytest.importorskip("numba")
    a_file = tmp_path / "a file"
    a_file.write_text("not a folder")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / numba_cache.temporary_folder().name).write_text("someone else's")
    before = _program_caches()
    paths, err = _kernel_cache_run(tmp_path, NUMBA_CACHE_DIR=str(a_file))
    assert paths and all(p is True for p in paths), paths  # Numba's NullCache: compiled, never written
    assert _program_caches() == before
    assert err.count("compiled at each start, not cached") == 1, err


# The libraries' log lines on every start


def test_a_cli_start_shows_none_of_the_libraries_log_lines(tiny_fields, tmp_path):
    from tests.factories import tiny_llama, write_gguf

    write_gguf(tiny_llama(4), tmp_path / "tiny.gguf", tiny_fields)
    script = ("import sys\nfrom app.cli import main\ncode = main(sys.argv[1:])\n"
              "print('torchao imported' if 'torchao' in sys.modules else 'no torchao', file=sys.stderr)\n"
              "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", script, "import", str(tmp_path / "tiny.gguf"), str(tmp_path / "out"),
                           "--variants", "hf"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    assert "torchao imported" in err  # the library that writes them was imported
    assert "Converting tiny.gguf to hf" in err  # Tandem's own words still show
    for noise in ("Failed to load", "_C_mxfp8", "is an Enum subclass", "register_constant"):
        assert noise not in err, err


def test_only_those_lines_are_filtered():
    import logging

    from app.cli import quiet_libraries

    quiet_libraries()
    quiet_libraries()  # once only
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    for name, kept, dropped in (
            ("torchao", "Skipping import of cpp extensions due to incompatible torch version.",
             "Failed to load /site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load"),
            ("torch.utils._pytree", "something else about pytrees",
             "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an "
             "opaque value type.")):
        logger = logging.getLogger(name)
        handler, level = Keep(), logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)  # (app/models/torch_quantize.py raises torchao's, once imported)
        try:
            assert len([f for f in logger.filters if type(f).__name__ == "_NotTheUsersBusiness"]) == 1
            logger.warning(dropped)
            logger.warning(kept)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        assert seen[-1] == kept and dropped not in seen


# 16. A long prompt says how far its reading has gone


def _events(target, **options) -> list:
    return list(generate(target, lambda ids: "", PROMPT, max_tokens=4, **options))


def _progress(events) -> list[tuple[int, int]]:
    from app.engine.events import PrefillProgress

    return [(e.done, e.total) for e in events if isinstance(e, PrefillProgress)]


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_long_prompt_reports_each_chunk_read_before_the_first_token(backend, tiny_pair, monkeypatch):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    target = load_backend(tiny_pair["target" if backend == "torch" else "target_mlx"], backend)
    whole = _tokens(_events(target))
    assert _progress(_events(target)) == []  # one chunk: nothing to say
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)  # 25 prompt tokens: chunks of 8, 8, 8 and 1
    events = _events(target)
    assert _progress(events) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    first_round = next(i for i, e in enumerate(events) if isinstance(e, Round))
    assert len(_progress(events[:first_round])) == first_round  # all of it before the first token
    assert _tokens(events) == whole
    # a follow-up reads only what its cache lacks (the answer's last token and 17 more): 8, 8 and 2
    follow = list(generate(target, lambda ids: "", PROMPT + whole + PROMPT[:17], max_tokens=2, reuse_cache=True))
    assert _progress(follow) == [(0, 3), (1, 3), (2, 3)]
    # Stop during the reading: the progress stops with it
    events, read = [], []
    for event in generate(target, lambda ids: "", PROMPT, max_tokens=4, should_stop=lambda: len(read) >= 2):
        events.append(event)
        read.extend(done for done, _ in _progress([event]) if done)  # Stop once two chunks are read
    assert _progress(events) == [(0, 4), (1, 4), (2, 4)]
    assert isinstance(events[-1], Finished) and events[-1].stats.finish_reason == "cancelled"


def test_the_service_hands_the_progress_to_its_clients(service, monkeypatch):
    """What the window reads: a request's events carry the progress, before the first round."""
    from app.draft_choice import NO_DRAFT
    from app.runner import ChatRequest
    from app.service import Traced

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)
    request = ChatRequest(({"role": "user", "content": "Count the ones: 1 1 1 1 1 1 1 1 1 1 1 1"},), max_tokens=3,
                          drafter=NO_DRAFT)
    events = list(service.submit(request, client="window").events(timeout=120))
    progress = _progress(events)
    assert len(progress) >= 2 and [done for done, _ in progress] == list(range(len(progress)))
    assert {total for _, total in progress} == {len(progress)}  # the last chunk's pass is the first round
    first_round = next(i for i, e in enumerate(events) if isinstance(e, Traced))
    assert len(_progress(events[:first_round])) == len(progress)
    assert isinstance(events[-1], Finished)


def test_the_cli_says_how_far_a_long_prompt_has_been_read(tiny_pair, capsys, monkeypatch):
    from app.cli import main

    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 8)
    assert main(["generate", "--model", str(tiny_pair["target"]), "--backend", "torch", "--draft", "none",
                 "--max-tokens", "2", "--prompt", "Read this: one two three four five six seven eight"]) == 0
    err = capsys.readouterr().err
    assert "Reading the prompt: 0 of " in err and "Reading the prompt: 1 of " in err
