"""A GGUF at its own precisions on PyTorch: 4-bit blocks re-packed code for code into the int4
kernel (app/models/gguf_blocks.py, app/models/gguf_torch.py), never through a float32 model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from app.draft_choice import AUTO_DRAFT, NO_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.models.errors import ModelFileError
from app.models.gguf_blocks import Int4Groups, int4_groups
from app.models.gguf_torch import BATCHED_TIE_GAP as GGUF_TIE_GAP  # committed: derived once, see there
from tests.factories import tiny_llama, write_gguf

Q = gguf.GGMLQuantizationType



def _random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Arbitrary codes with sane fp16 scales (gguf-py cannot quantize Q4_K, but reads any bytes)."""
    weights_per_block, block_bytes = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // weights_per_block * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    halves = lambda low, high: np.frombuffer(  # noqa: E731
        rng.uniform(low, high, len(blocks)).astype(np.float16).tobytes(), np.uint8).reshape(-1, 2)
    blocks[:, 0:2] = halves(0.001, 0.05)
    if kind != "Q4_0":
        blocks[:, 2:4] = halves(-0.05, 0.05)
    return raw


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_4bit_blocks_become_int4_groups_that_dequantize_as_gguf_does(kind):
    rows, cols = 24, 512
    if kind == "Q4_K":
        raw = _random_blocks(kind, rows, cols)
    else:  # real weights through gguf-py's own quantizer
        weights = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
        raw = gguf.quants.quantize(weights, getattr(Q, kind))
    reference = gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(rows, cols)
    groups = int4_groups(kind, raw, rows, cols)
    assert groups.codes.dtype == np.uint8 and groups.codes.max() <= 15
    assert groups.scale.shape == groups.zero.shape == (rows, cols // 32)
    # the same float32 arithmetic on the same fp16 fields: equal up to the order of operations
    np.testing.assert_allclose(groups.dequantize(), reference, rtol=0, atol=np.abs(reference).max() * 2e-7)


def test_other_types_and_shapes_are_refused_in_words():
    with pytest.raises(ValueError, match="not a 4-bit GGUF type"):
        int4_groups("Q8_0", np.zeros(34, np.uint8), 1, 32)
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        int4_groups("Q4_K", np.zeros(144, np.uint8), 1, 128)


def test_the_int4_kernel_computes_with_the_gguf_weights():
    from app.models.gguf_layers_torch import GGUFInt4Linear

    rows, cols = 64, 256
    raw = _random_blocks("Q4_1", rows, cols, seed=3)
    groups = int4_groups("Q4_1", raw, rows, cols)
    layer = GGUFInt4Linear.from_groups(groups, torch.bfloat16)
    x = torch.randn(5, cols)
    expected = x @ torch.from_numpy(gguf.quants.dequantize(raw, Q.Q4_1).reshape(rows, cols)).T
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (5, rows)
    # bfloat16 activations and scales: about 3 significant digits
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
    wrong = GGUFInt4Linear.from_groups(Int4Groups(groups.codes[::-1].copy(), groups.scale, groups.zero), torch.bfloat16)
    assert (wrong(x) - expected).abs().max() > 0.1 * expected.abs().max()  # the check can fail


def test_a_q4_gguf_loads_at_its_own_precisions_and_agrees_with_its_dequantized_weights(tiny_q4):
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_layers_torch import GGUFInt4Linear

    folder, written = tiny_q4
    own = TorchBackend(folder, precision="gguf")
    reference = TorchBackend(folder, precision="float32")  # the import: gguf's dequantization in float32
    from app.models.fused_projections_torch import ProjectionSlice
    from app.models.screened_head_torch import ScreenedHead

    projections = [getattr(getattr(layer, part), name) for layer in own.model.model.layers
                   for part, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                       ("mlp", ("gate_proj", "up_proj", "down_proj"))) for name in names]
    assert len(projections) == 7 * 2  # q k v o gate up down in both layers, each int4 or a slice of a stack
    from app.models.gguf_layers_torch import GGUFCodesLinear

    kinds = (GGUFCodesLinear, GGUFInt4Linear)  # Tandem's kernel where it runs, else PyTorch's int4 kernel
    assert all(isinstance(m, kinds) or isinstance(m.shared.fused, kinds) for m in projections)
    assert sum(isinstance(m, ProjectionSlice) for m in projections) == 2 * 2  # gate/up (k/v rows are not 64s)
    assert "int4 g32 from Q4_0 x14" in own.dtype and "float32 from" in own.dtype and "Q8_0 x1" in own.dtype
    assert "2 fused q/k/v and gate/up matmuls" in own.dtype
    assert not any(isinstance(m, torch.nn.Linear) for m in own.model.modules())
    assert isinstance(own.model.get_output_embeddings(), ScreenedHead)
    # the embedding is read from the file as needed, the file's own values exactly, in any order
    from app.models.gguf_layers_torch import GGUFEmbedding

    embedding = own.model.get_input_embeddings()
    assert isinstance(embedding, GGUFEmbedding)
    rows = written["model.embed_tokens.weight"]
    ids = torch.tensor([[3, 0, len(rows) - 1], [3, 3, 7]])
    np.testing.assert_array_equal(embedding(ids).numpy(), rows[ids.numpy()])
    with pytest.raises(IndexError, match="out of range"):
        embedding(torch.tensor([[len(rows)]]))
    linear_bytes = sum(m.weight.numel() * 4 for m in reference.model.modules()
                       if isinstance(m, torch.nn.Linear) and m is not reference.model.get_output_embeddings())
    # every linear layer shrank to 4 bits and 16-bit scales (0.625 bytes a weight, not 4; here
    # up to 1.25: the CPU kernel pads this tiny model's 32-row k and v to its chunk of 64 rows),
    # the embedding stays in the file, and the tied head adds an int8 screen of it
    screen = own.model.get_output_embeddings().codes.numel()
    assert reference.weights_bytes - own.weights_bytes >= 0.65 * linear_bytes + rows.size * 4 - screen
    ids = [1, 900, 198, 300, 301, 302, 40, 41]
    a, b = own.forward_last(ids), reference.forward_last(ids)
    assert torch.argmax(a) == torch.argmax(b)
    assert (a - b).abs().max() <= 0.05 * b.abs().max()


def test_the_memory_check_counts_the_loaded_size_not_float32(tiny_q4):
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import gguf_source, inspect_gguf
    from app.models.gguf_torch import loaded_bytes

    folder, _ = tiny_q4
    info = inspect_gguf(gguf_source(folder))
    predicted = loaded_bytes(info.elements, info.embedding, info.head, info.head_rows)
    measured = TorchBackend(folder, precision="gguf").weights_bytes
    assert abs(predicted - measured) <= 0.05 * measured


def test_a_folder_whose_gguf_is_gone_says_what_to_do(tmp_path, tiny_fields):
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import import_gguf

    write_gguf(tiny_llama(seed=2), tmp_path / "gone.gguf", tiny_fields, Q.Q4_0)
    folders = import_gguf(tmp_path / "gone.gguf", tmp_path / "import", mlx_variants=())
    (tmp_path / "gone.gguf").unlink()
    with pytest.raises(ModelFileError, match=r"needs the \.gguf file it was imported from .*gone"):
        TorchBackend(folders["hf"], precision="gguf")
    marker = json.loads((folders["hf"].parent / "tandem-import.json").read_text())
    assert marker["source"].endswith("gone.gguf")


# Exactness of the quantized target, checked as ../shared issue 17 asks: its batched verify passes
# may round differently from its one-token steps, so the speculative output is replayed step by
# step and every token must be the stepwise argmax, except at a near-tie (gap < GGUF_TIE_GAP).

def _speculative_answers(runner, prompts, max_tokens, draft_tokens=None):
    from app.engine.events import Round
    from app.engine.sampling import SamplingParams
    from app.runner import ChatRequest

    answers = []
    for prompt in prompts:
        messages = ({"role": "user", "content": prompt},)
        request = ChatRequest(messages, max_tokens=max_tokens, params=SamplingParams(temperature=0.0),
                              draft_tokens=draft_tokens)
        tokens = [t for event in runner.chat(request) if isinstance(event, Round) for t in event.emitted]
        answers.append((runner.tokenizer.render_chat(list(messages)), tokens))
    return answers


def _disagreements(target, prompt_ids, tokens):
    """(position, the stepwise top-2 gap) wherever `tokens` is not the argmax of the target's own
    one-token steps (its plain decoding: the same backend, one position per pass)."""
    target.reset()
    logits = target.forward_last(prompt_ids)
    found = []
    for i, token in enumerate(tokens):
        top = torch.topk(logits.float(), 2)
        if int(top.indices[0]) != token:
            found.append((i, float(top.values[0] - top.values[1])))
        logits = target.forward_last([token])
    target.reset()
    return found


SUITE_FILE = Path(__file__).parents[1] / "benchmarks" / "suite.json"
SUITE = [p["user"] for p in json.loads(SUITE_FILE.read_text())["prompts"]]


def test_the_demo_at_gguf_precision_speculates_what_it_would_write_alone(demo):
    from app.models.memory import NotEnoughMemory
    from app.runner import Runner

    runner = Runner()
    # 600 MB free: too little for the float32 import (540 MB of weights) with a 4k-token chat, room
    # enough for the file's own precisions (95 MB): the memory check counts what will load
    runner.free_memory = lambda backend, device: (600_000_000, "RAM")
    with pytest.raises(NotEnoughMemory):
        runner.load(demo["hf"], "torch", draft=PROMPT_LOOKUP, precision="float32", progress=lambda m: None)
    loaded = runner.load(demo["hf"], "torch", draft=PROMPT_LOOKUP, precision="gguf", progress=lambda m: None)
    assert "int4 g32 from Q4_1 x210" in loaded.dtype and loaded.weights_bytes < 100_000_000  # 95 MB
    answers = _speculative_answers(runner, SUITE[:5], max_tokens=128)
    assert sum(len(tokens) for _, tokens in answers) >= 500
    for prompt_ids, tokens in answers:
        for position, gap in _disagreements(runner.target, prompt_ids, tokens):
            assert gap < GGUF_TIE_GAP, f"token {position} differs from the target alone with a top-2 gap of {gap:.3f}"


def test_the_exactness_check_catches_a_kept_rejected_draft(demo, monkeypatch):
    """The same check on an engine that keeps the first rejected draft of a round (in the answer
    and in the cache, as a rollback one position short would) must fail."""
    from app.engine.backends.base import Verdict
    from app.engine.backends.torch_backend import TorchBackend
    from app.runner import Runner

    real_verify = TorchBackend.verify

    def keeps_one_rejected(self, ids, proposal, params):
        verdict = real_verify(self, ids, proposal, params)
        if verdict.accepted < len(proposal.ids):
            return Verdict(verdict.accepted + 1, verdict.token, verdict.q)
        return verdict

    runner = Runner()
    runner.load(demo["hf"], "torch", draft=PROMPT_LOOKUP, precision="gguf", progress=lambda m: None)
    monkeypatch.setattr(TorchBackend, "verify", keeps_one_rejected)
    # a copy prompt, at a fixed draft length: adaptive k, pricing passes by the clock, may decode
    # plainly on a busy machine, and an engine that drafts nothing keeps no rejected draft
    answers = _speculative_answers(runner, [SUITE[6]], max_tokens=96, draft_tokens=4)
    monkeypatch.undo()
    gaps = [gap for prompt_ids, tokens in answers for _, gap in _disagreements(runner.target, prompt_ids, tokens)]
    assert any(gap >= GGUF_TIE_GAP for gap in gaps)


PEAK_SCRIPT = """
import gc, json, sys
from pathlib import Path
import psutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
from app.models.gguf_torch import load_gguf_model
folder, source = Path(sys.argv[1]), Path(sys.argv[2])
with torch.device("meta"):  # the loader's imports and first meta model, before the baseline
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)))
from app.models.int4_cpu_torch import compiled
compiled()  # the 4-bit CPU kernel's compiled code (LLVM's, not weights), before the baseline too
gc.collect()
def high_water():  # the peak resident size (VmHWM), in bytes
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # start the peak from here, not from the imports
base = psutil.Process().memory_info().rss
before = high_water()
model, report = load_gguf_model(folder, source)
print(json.dumps({"added": high_water() - base, "reset": before - base, "loaded": report.weights_bytes,
                  "classes": report.describe()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads and resets Linux's peak resident size")
def test_loading_a_large_q4_gguf_never_holds_much_more_than_the_loaded_model(tmp_path, tiny_fields):
    """Peak memory added while loading (above the process right after its imports) stays within
    1.3x of the loaded size: no float32 copy of the model, nor of the file, at any moment."""
    import subprocess

    from app.models.gguf_import import import_gguf
    from tests.factories import write_random_q4_gguf

    size = write_random_q4_gguf(tmp_path / "big.gguf", tiny_fields)
    assert size > 200e6
    folder = import_gguf(tmp_path / "big.gguf", tmp_path / "import", mlx_variants=(), torch_variant="gguf")["gguf"]
    assert not list(folder.glob("*.safetensors"))
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(folder), str(tmp_path / "big.gguf")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert "int4 g32 from Q4_0 x56" in figures["classes"]
    assert figures["reset"] == 0  # the peak was measured from the baseline on
    assert figures["added"] <= 1.3 * figures["loaded"], figures  # 1.11x when written


def test_a_dropped_gguf_on_pytorch_is_read_in_place_at_its_own_precisions(tmp_path, tiny_fields, monkeypatch):
    """Opening a .gguf (window, CLI) with PyTorch imports no weights: a folder of config and
    tokenizer that points at the file, 4-bit layers on the int4 kernel; a float precision asked of
    that folder says how to get one."""
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.resolve import display_name
    from app.runner import Runner

    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    write_gguf(tiny_llama(seed=4), tmp_path / "Tiny-Q4_0.gguf", tiny_fields, Q.Q4_0, embedding_qtype=Q.Q8_0)
    runner = Runner()
    messages = []
    loaded = runner.load(tmp_path / "Tiny-Q4_0.gguf", "torch", draft=PROMPT_LOOKUP, progress=messages.append)
    folder = loaded.folder
    assert folder.name == "gguf" and not list(folder.glob("*.safetensors"))
    assert display_name(folder) == "Tiny-Q4_0"
    assert "int4 g32 from Q4_0" in loaded.dtype
    assert any("model description and vocabulary" in m for m in messages)
    # (the CPU kernel's compiled code lands in the cache too where this test is the process's first GGUF)
    imported = [f for f in (tmp_path / "cache").rglob("*") if f.is_file() and "numba" not in f.parts]
    assert sum(f.stat().st_size for f in imported) < 1_000_000
    with pytest.raises(ModelFileError, match="has no float32 weights to load.*open the .gguf file with that precision"):
        TorchBackend(folder, precision="float32")
    float32 = Runner().load(tmp_path / "Tiny-Q4_0.gguf", "torch", draft=NO_DRAFT, precision="float32",
                            progress=lambda m: None)
    assert float32.folder.name == "hf" and float32.dtype.split(" (")[0] == "float32"


def test_models_info_says_what_runs_and_check_measures_it(tiny_q4, capsys):
    from app.cli import main
    from app.models.gguf_import import gguf_source

    source = gguf_source(tiny_q4[0])
    assert main(["models", "info", "--check", str(source)]) == 0
    out = capsys.readouterr().out
    from app.models.int4_cpu_torch import int4_scales, why_not_available

    on_kernel = "int4 g32, the file's codes and scales exactly, on Tandem's kernel"
    assert "Q4_0" in out and (on_kernel if not why_not_available() else f"int4, groups of 32, {int4_scales()}") in out
    assert "float32 would be" in out
    q4 = next(line for line in out.splitlines() if line.strip().startswith("Q4_0 as int4 g32:"))
    assert any(line.strip().startswith("Q8_0 (token embedding) as float32 rows read from the file: 1 tensors, exact")
               for line in out.splitlines())
    largest = float(q4.split("largest error ")[1].split(" ")[0])

    if why_not_available():
        assert 0 < largest < 1e-2  # PyTorch's kernel: bfloat16 scales, about 3 significant digits
    else:
        assert largest == 0  # Tandem's CPU kernel holds the file's fp16 scales as they are
    ppl = next(line for line in out.splitlines() if line.startswith("perplexity"))
    change = float(ppl.rsplit("(", 1)[1].split("%")[0])
    assert abs(change) < 1.0, ppl


def test_an_8bit_gguf_loads_at_the_files_numbers_on_the_kernel_else_as_int8_per_row(tmp_path, tiny_fields, capsys,
                                                                                    monkeypatch):
    """Q8_0 linear weights: on Tandem's kernel, the file's codes and fp16 scales exactly; where it
    does not run, int8 with one scale per row on PyTorch's int8 kernel (no group scales there),
    within INT8_TOLERANCE of the file's weights. The token embedding stays in the file either way."""
    from app.cli import main
    from app.engine.backends.torch_backend import TorchBackend
    from app.models import int4_cpu_torch
    from app.models.gguf_import import import_gguf
    from app.models.gguf_layers_torch import INT8_TOLERANCE, GGUFCodesLinear, GGUFInt8Linear

    write_gguf(tiny_llama(seed=8), tmp_path / "q8.gguf", tiny_fields, Q.Q8_0)
    folders = import_gguf(tmp_path / "q8.gguf", tmp_path / "import", mlx_variants=(), torch_variant="gguf")
    reference = gguf.GGUFReader(tmp_path / "q8.gguf", "r")
    v_proj = next(t for t in reference.tensors if t.name == "blk.0.attn_v.weight")  # no row permutation
    expected = gguf.quants.dequantize(v_proj.data, v_proj.tensor_type)
    float32 = TorchBackend(folders["hf"] if "hf" in folders else
                           import_gguf(tmp_path / "q8.gguf", tmp_path / "import", mlx_variants=())["hf"])
    ids = [1, 900, 198, 300, 301, 302, 40, 41]
    for kernel in (True, False):
        if not kernel:  # as on a machine where Numba cannot build the kernel
            monkeypatch.setattr(int4_cpu_torch, "_COMPILED", None)
            monkeypatch.setattr(int4_cpu_torch, "_WHY_NOT", "turned off by the test")
        elif int4_cpu_torch.why_not_available():
            continue
        own = TorchBackend(folders["gguf"])
        layer_type, words = (GGUFCodesLinear, "int8 g32") if kernel else (GGUFInt8Linear, "int8 per row")
        assert own.dtype.startswith(f"8-bit GGUF ({words} from Q8_0 x14; int8 screen + float32 argmax from tied head")
        layers = [m for m in own.model.modules() if isinstance(m, layer_type)]
        # o, down, stacked gate/up; q/k/v stacked on PyTorch's kernel, three on Tandem's (k and v have
        # 32 rows, under the kernel's chunk of 64)
        assert len(layers) == (6 if kernel else 4) * 2
        v = own.model.model.layers[0].self_attn.v_proj
        if kernel:
            np.testing.assert_array_equal(v.blocks.dequantize(), expected)
        else:
            got = v.dequantized().numpy() if hasattr(v, "dequantized") else None
            if got is not None:
                assert np.abs(got - expected).max() <= INT8_TOLERANCE * np.abs(expected).max()
        a, b = own.forward_last(ids), float32.forward_last(ids)
        assert torch.argmax(a) == torch.argmax(b)
        if kernel:  # (PyTorch's int8 head screen gives the rows it does not rescore in bfloat16)
            assert (a - b).abs().max() <= 0.05 * b.abs().max()

    monkeypatch.undo()
    assert main(["models", "info", "--check", str(tmp_path / "q8.gguf")]) == 0
    out = capsys.readouterr().out
    assert "the token embedding, read from the file as needed" in out
    if not int4_cpu_torch.why_not_available():
        assert "int8 g32, the file's codes and scales exactly" in out
        line = next(x for x in out.splitlines() if x.strip().startswith("Q8_0 as int8 g32:"))
        assert float(line.split("largest error ")[1].split(" ")[0]) == 0


def test_gguf_precision_on_mlx_is_refused_before_loading(capsys):
    from app.cli import main

    assert main(["generate", "--backend", "mlx", "--precision", "gguf", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "precision gguf (a GGUF file's own 4-bit layers) runs on PyTorch only" in err
    assert "Traceback" not in err and "Loading" not in err


def test_gguf_precision_on_a_folder_without_its_gguf_says_what_to_do(tiny_pair, tmp_path, capsys):
    import shutil

    from app.cli import main

    folder = tmp_path / "plain-folder"
    shutil.copytree(tiny_pair["target"], folder)  # safetensors, with no .gguf or import record beside it
    assert main(["generate", "--model", str(folder), "--backend", "torch", "--precision", "gguf",
                 "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    # the model by its own name, and why: it never came from a .gguf (not that its .gguf went missing)
    assert "plain-folder is a folder of safetensors weights, not imported from a .gguf file" in err
    assert "Traceback" not in err


def test_models_info_on_a_truncated_gguf_says_so(tmp_path, demo_gguf, capsys):
    from app.cli import main

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(demo_gguf.read_bytes()[:5000])
    assert main(["models", "info", "--check", str(cut)]) == 2
    err = capsys.readouterr().err
    assert "cut.gguf" in err and "damaged or truncated" in err and "Traceback" not in err


def test_the_demo_defaults_to_its_gguf_with_prompt_lookup_and_keeps_its_float32_reference(demo):
    """"demo" on PyTorch is the fast pair (the GGUF at its own precisions, drafted by prompt
    lookup); "demo:float32" is the float32 reference with its int4 self-draft, one click away."""
    from app.models.demo import DEMO_REFERENCE
    from app.runner import Runner

    fast = Runner().load("demo", "torch", draft=AUTO_DRAFT, progress=lambda m: None)
    assert fast.folder.name == "gguf" and fast.dtype.startswith("4-bit GGUF") and fast.draft == PROMPT_LOOKUP
    reference = Runner().load(DEMO_REFERENCE, "torch", draft=AUTO_DRAFT, progress=lambda m: None)
    assert reference.folder == demo["hf"] and reference.dtype.split(" (")[0] == "float32"
    assert reference.draft == DraftChoice.self_draft("int4") and reference.draft_dtype.startswith("int4")
