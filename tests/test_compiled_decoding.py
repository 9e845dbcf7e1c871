"""Compiled decoding (app/engine/backends/compile_torch.py): the same tokens as eager, checked at
load, and eager with its reason when compiling fails or is not worth it."""

from __future__ import annotations

import pytest
import torch

from app.engine.backends import compile_torch
from app.engine.backends.compile_torch import agree, decide
from app.engine.backends.torch_backend import TorchBackend, _with_compile_state
from app.engine.drafters import ModelDrafter, PromptLookupDrafter
from tests.test_engine_exact import PROMPTS, _run


@pytest.fixture(scope="module")
def q4_pair(tiny_q4):
    """The tiny Q4_0 GGUF at its own precisions (int4 kernels, fused projections, the screened
    head), compiled and eager."""
    folder = tiny_q4[0]
    return TorchBackend(folder, precision="gguf", compile="on"), TorchBackend(folder, precision="gguf")


def test_compiled_and_eager_decoding_write_the_same_tokens(q4_pair):
    compiled, eager = q4_pair
    assert compiled.compiled and not eager.compiled
    assert compiled.dtype.split(" (")[0].endswith(", compiled")
    layer = compile_torch.decoder_layers(compiled.model)[0]
    assert layer._compiled_call_impl is not None  # the decoder layers really run through torch.compile
    for prompt in PROMPTS:
        alone, _ = _run(eager, prompt)
        fast, _ = _run(compiled, prompt)
        assert fast == alone, f"prompt {prompt}"
        # and speculation on the compiled target (verify passes of several widths) writes them too
        for drafter, k in ((PromptLookupDrafter(), None), (ModelDrafter(eager), 3), (ModelDrafter(eager), None)):
            spec, _ = _run(compiled, prompt, drafter, draft_tokens=k)
            assert spec == alone, f"{type(drafter).__name__}, k={k}, prompt {prompt}"


def test_a_compile_that_fails_leaves_the_model_eager_and_says_why(tiny_q4, monkeypatch):
    folder = tiny_q4[0]

    def no_compiler(model):  # what a PC without a C++ compiler raises at the first compiled call
        raise RuntimeError("Compiler: cl is not found.\nmore detail")

    monkeypatch.setattr("app.engine.backends.torch_backend.compile_layers", no_compiler)
    messages = []
    backend = TorchBackend(folder, precision="gguf", compile="on", progress=messages.append)
    assert not backend.compiled
    assert backend.compile_note == "compiling failed (RuntimeError: Compiler: cl is not found.)"
    assert "eager: compiling failed" in backend.dtype and ", compiled" not in backend.dtype
    assert any("Compiling" in m for m in messages)
    # eagerly through the lean step (its own KV buffer), not the compiled layers' cache
    assert backend.step == "lean" and type(backend.cache).__name__ == "StaticKV"
    assert "passes: lean step" in backend.dtype
    eager = TorchBackend(folder, precision="gguf")
    assert _run(backend, PROMPTS[0])[0] == _run(eager, PROMPTS[0])[0]


def test_the_load_screen_passes_rounding_and_catches_a_miscompile():
    eager = torch.tensor([[10.0, 6.0, -30.0], [1.0, 9.0, -30.0]])  # span 40: tolerance 2.0
    assert agree(eager + torch.tensor([[0.3, -0.2, 0.1], [0.0, 1.9, -1.9]]), eager) == ""
    assert agree(torch.tensor([[8.1, 8.0, -30.0], [1.0, 9.0, -30.0]]), eager) == ""  # the demo's own size
    flipped = torch.tensor([[7.9, 8.1, -30.0], [1.0, 9.0, -30.0]])  # a clear choice lost: off by 2.1
    assert agree(flipped, eager) == "compiled logits differ from eager by 2.1 (logits span 40)"
    assert "differ" in agree(torch.zeros_like(eager), eager)  # a graph that lost the model
    assert "differ" in agree(torch.full_like(eager, float("nan")), eager)


def test_auto_compiles_only_where_it_measured_faster(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decide("off", cpu) == (False, "compiling is off")
    assert decide("on", cpu) == (True, "")
    compiled, why = decide("auto", cpu)
    assert not compiled and "measured slower" in why
    monkeypatch.setattr(compile_torch.importlib.util, "find_spec", lambda name: None)
    compiled, why = decide("on", cuda)  # Windows wheels: no Triton
    assert not compiled and "Triton" in why
    with pytest.raises(ValueError, match="auto, on, off"):
        decide("always", cpu)


def test_the_status_words_say_how_it_decodes():
    assert _with_compile_state("float32", True, "") == "float32, compiled"
    assert _with_compile_state("int4 (g32, float32 head)", True, "") == "int4, compiled (g32, float32 head)"
    assert _with_compile_state("int4 (g32, float32 head)", False, "slow here") == \
        "int4 (g32, float32 head; eager: slow here)"
    assert _with_compile_state("float32", False, "slow here") == "float32 (eager: slow here)"
    assert _with_compile_state("float32", False, "") == "float32"
