"""Lower-precision copies of a model: int4 weight-only (torchao on PyTorch, MLX's affine
quantization) and bfloat16, as targets and as self-drafts. The float32 target stays the
reference: a self-draft of any precision must leave its output unchanged, token for token."""

from __future__ import annotations

import pytest

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.engine.events import Finished, Round
from app.runner import ChatRequest, Runner

ASK = ChatRequest(({"role": "user", "content": "Tell me about the sea."},), max_tokens=24)


def _run(runner, request):
    events = list(runner.chat(request))
    tokens = [t for e in events if isinstance(e, Round) for t in e.emitted]
    return tokens, next(e for e in events if isinstance(e, Finished)).stats


@pytest.mark.parametrize("backend, key", [("torch", "target"), ("mlx", "target_mlx")])
def test_int4_self_draft_leaves_the_output_unchanged(tiny_pair, backend, key):
    runner = Runner()
    loaded = runner.load(tiny_pair[key], backend, draft=DraftChoice.self_draft("int4"), progress=lambda m: None)
    draft = runner.drafter.backend
    assert "int4" in draft.dtype and loaded.draft == DraftChoice.self_draft("int4")
    assert loaded.draft_dtype == draft.dtype
    assert loaded.draft_words()[0] == "the same model in 4-bit"
    assert draft.weights_bytes < 0.6 * runner.target.weights_bytes
    spec, stats = _run(runner, ChatRequest(ASK.messages, max_tokens=24, draft_tokens=4))
    plain, _ = _run(runner, ChatRequest(ASK.messages, max_tokens=24, drafter=NO_DRAFT))
    assert spec == plain
    assert stats.drafted > 0 and stats.accepted > 0  # the quantized copy mostly agrees


def test_torch_int4_layers_use_torchao(tiny_pair):
    from torchao.quantization.linear_quant_modules import WeightOnlyInt4Linear

    from app.engine.backends.torch_backend import TorchBackend

    full = TorchBackend(tiny_pair["target"], precision="float32")
    body = TorchBackend(tiny_pair["target"], precision="int4")
    everything = TorchBackend(tiny_pair["target"], precision="int4-head")
    kinds = {type(m).__name__ for m in body.model.modules()}
    assert "WeightOnlyInt4Linear" in kinds and "int4" in body.dtype and "float32 head" in body.dtype
    assert not isinstance(body.model.get_output_embeddings(), WeightOnlyInt4Linear)
    assert isinstance(everything.model.get_output_embeddings(), WeightOnlyInt4Linear)
    from app.models.torch_quantize import LowPrecisionHead

    half_head = TorchBackend(tiny_pair["target"], precision="int4-bf16-head")
    head = half_head.model.get_output_embeddings()
    assert isinstance(head, LowPrecisionHead) and "bfloat16 head" in half_head.dtype
    ids = [5, 17, 300, 42]
    assert half_head.top2_gap(ids) > 0 and half_head.forward_last(ids).dtype == full.forward_last(ids).dtype
    # (a tied embedding stays float for the lookup, so an int4 head adds to memory: it buys speed)
    assert body.weights_bytes < full.weights_bytes and everything.weights_bytes < full.weights_bytes


def test_an_unknown_precision_is_refused(tiny_pair):
    from app.engine.backends.torch_backend import TorchBackend

    with pytest.raises(ValueError, match="unknown precision 'int3'"):
        TorchBackend(tiny_pair["target"], precision="int3")


def test_demo_float32_target_with_int4_self_draft_is_exact(demo):
    """The product's default demo pair on the real model: the float32 reference target and its
    int4 copy as the draft commit exactly the target's own greedy tokens."""
    runner = Runner()
    runner.load(demo["hf"], "torch", draft=DraftChoice.self_draft("int4"), progress=lambda m: None)
    request = ChatRequest(({"role": "user", "content": "Write a haiku about autumn."},), max_tokens=32)
    events = list(runner.chat(request))
    spec = [t for e in events if isinstance(e, Round) for t in e.emitted]
    plain, _ = _run(runner, ChatRequest(request.messages, max_tokens=32, drafter=NO_DRAFT))
    assert spec == plain
    # the int4 copy's own acceptance (measured 0.99-1.00 on this model); prompt lookup beside it
    # drafts as long as its own k says, so the answer's overall rate varies with the clock
    by_model = [e for e in events if isinstance(e, Round) and e.source == "model"]
    assert by_model, "the int4 copy never drafted"
    assert sum(e.accepted for e in by_model) / sum(len(e.drafted) for e in by_model) > 0.8


def test_a_float_target_too_large_is_offered_in_4bit_with_the_figures(demo):
    """The demo's float32 weights (538 MB) with a 4k-token chat do not fit in 500 MB; at int4
    they do: the refusal says so with both sizes and carries the offer, and taking it loads."""
    from app.models.demo import DEMO_REFERENCE
    from app.models.memory import NotEnoughMemory

    runner = Runner()
    runner.free_memory = lambda backend, device: (500_000_000, "RAM")
    with pytest.raises(NotEnoughMemory) as refused:
        runner.load(DEMO_REFERENCE, "torch", draft=NO_DRAFT, progress=lambda m: None)
    message = str(refused.value)
    assert refused.value.fits_at == "int4"
    assert "This pair does not fit" in message and "In 4-bit" in message
    assert "instead of 538 MB" in message and "--precision int4" in message
    loaded = runner.load(DEMO_REFERENCE, "torch", draft=NO_DRAFT, precision="int4", progress=lambda m: None)
    assert loaded.dtype.startswith("int4")

    # too little even for 4 bits: the refusal offers nothing
    runner = Runner()
    runner.free_memory = lambda backend, device: (150_000_000, "RAM")
    with pytest.raises(NotEnoughMemory) as refused:
        runner.load(DEMO_REFERENCE, "torch", draft=NO_DRAFT, progress=lambda m: None)
    assert refused.value.fits_at is None and "In 4-bit" not in str(refused.value)


def test_a_4bit_offer_for_a_target_with_its_4bit_self_draft_drafts_by_lookup(demo):
    """At int4 the demo's int4 self-draft would be the target itself: the offer (and a load that
    asks for it anyway) drafts with prompt lookup, and says why."""
    from app.models.demo import DEMO_REFERENCE
    from app.models.memory import NotEnoughMemory

    runner = Runner()
    runner.free_memory = lambda backend, device: (500_000_000, "RAM")
    with pytest.raises(NotEnoughMemory) as refused:
        runner.load(DEMO_REFERENCE, "torch", draft=DraftChoice.self_draft("int4"), progress=lambda m: None)
    assert refused.value.fits_at == "int4" and refused.value.fits_with_draft == PROMPT_LOOKUP
    assert "prompt lookup as the draft" in str(refused.value) and "--draft ngram" in str(refused.value)
    said = []
    loaded = runner.load(DEMO_REFERENCE, "torch", draft=DraftChoice.self_draft("int4"), precision="int4",
                         progress=said.append)
    assert loaded.draft == PROMPT_LOOKUP and loaded.draft_bytes == 0
    assert any("would be the target itself" in line for line in said)


def test_int4_stacks_the_projections_that_read_one_input(tiny_pair, monkeypatch):
    """q/k/v and gate/up are quantized as one stacked layer each, called as one kernel by the lean
    step: the same logits as each projection quantized alone (per-row groups do not change), and
    transformers' forward reads the same stack through the old names."""
    import torch

    from app.engine.backends.torch_backend import TorchBackend
    from app.models import torch_quantize

    stacked = TorchBackend(tiny_pair["target"], precision="int4")
    layer = stacked.model.model.layers[0]
    assert type(layer.self_attn.k_proj).__name__ == "ProjectionSlice"
    assert type(layer.mlp.up_proj.shared.fused).__name__ == "WeightOnlyInt4Linear"
    products = stacked._lean.layers[0]
    assert products.qkv.kernel is not None and products.gate_up.kernel is not None
    assert products.qkv.act == torch.bfloat16
    monkeypatch.setattr(torch_quantize, "stack_shared_inputs", lambda model: 0)
    alone = TorchBackend(tiny_pair["target"], precision="int4")
    assert type(alone.model.model.layers[0].self_attn.k_proj).__name__ == "WeightOnlyInt4Linear"
    ids = [5, 17, 300, 42, 7, 7, 9]
    want = alone.forward_last(ids)
    torch.testing.assert_close(stacked.forward_last(ids), want, atol=1e-5, rtol=1e-5)
    stacked.step = "transformers"
    stacked.reset()
    torch.testing.assert_close(stacked.forward_last(ids), want, atol=1e-5, rtol=1e-5)
