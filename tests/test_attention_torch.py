"""A verify pass on the CPU reads a grouped-query model's KV cache as it is: no copy of the cache
repeated up to the query heads' count at every layer (app/models/attention_torch.py), and the
same logits as transformers' own SDPA path."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa

from app.engine.backends.torch_backend import TorchBackend
from app.models.attention_torch import BRANCHES_ON_SDPA, NAME, use_on_cpu


@pytest.fixture
def repeats(monkeypatch):
    calls = []
    real = sdpa.repeat_kv

    def counting(hidden, n_rep):
        calls.append(tuple(hidden.shape))
        return real(hidden, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", counting)
    return calls


def _verify_logits(backend: TorchBackend, width: int) -> torch.Tensor:
    prompt = [(7 + 13 * i) % 500 + 3 for i in range(40)]
    with torch.inference_mode():
        backend.reset()
        backend.prefill(prompt)
        return torch.cat([backend._forward(backend._ids([11 + i + j for j in range(width)]), width)
                          for i in range(3)])


@pytest.mark.parametrize("width", [2, 4])
def test_a_cpu_verify_pass_reads_the_grouped_cache_without_repeating_it(tiny_pair, repeats, width):
    # transformers' forward (a family the lean step does not cover attends this way)
    backend = TorchBackend(tiny_pair["target"], device="cpu", step="transformers")
    config = backend.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped: the case this is for
    assert config._attn_implementation == NAME
    ours = _verify_logits(backend, width)
    assert repeats == []
    backend.model.set_attn_implementation("sdpa")  # transformers' own path: the cache repeated per layer
    theirs = _verify_logits(backend, width)
    assert len(repeats) >= 2 * config.num_hidden_layers  # keys and values, every layer, every pass
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_only_a_cpu_model_on_sdpa_is_switched(tiny_pair):
    backend = TorchBackend(tiny_pair["target"], device="cpu")
    backend.model.set_attn_implementation("eager")
    assert not use_on_cpu(backend.model, torch.device("cpu")) and backend.model.config._attn_implementation == "eager"
    backend.model.set_attn_implementation("sdpa")
    assert not use_on_cpu(backend.model, torch.device("cuda"))  # CUDA's fast kernels take no mask with GQA
    assert backend.model.config._attn_implementation == "sdpa"


def test_the_families_left_alone_are_those_whose_code_branches_on_the_name_sdpa():
    """A model whose own code compares its attention's name with "sdpa" (Gemma 4 trims its input
    before its KV-shared layers only then) would behave differently under another name."""
    import re
    from pathlib import Path

    import transformers

    compared = re.compile(r"""_attn_implementation\s*(?:==|!=)\s*["']sdpa["']"""
                          r"""|_attn_implementation\s+(?:not\s+)?in\s*[(\[{][^)\]}]*["']sdpa["']""")
    models = Path(transformers.__file__).parent / "models"
    found = {folder.name for folder in models.iterdir() if folder.is_dir()
             and any(compared.search(f.read_text(encoding="utf-8")) for f in folder.glob("modeling_*.py"))}
    assert "gemma4" in found  # the scan finds what it is for
    assert found == BRANCHES_ON_SDPA


def test_a_family_that_branches_on_the_name_keeps_it(tiny_pair, monkeypatch):
    import app.models.attention_torch as attention

    backend = TorchBackend(tiny_pair["target"], device="cpu")
    backend.model.set_attn_implementation("sdpa")
    monkeypatch.setattr(attention, "BRANCHES_ON_SDPA", frozenset({"llama"}))
    assert not use_on_cpu(backend.model, torch.device("cpu")) and backend.model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(attention, "BRANCHES_ON_SDPA", frozenset())
    assert use_on_cpu(backend.model, torch.device("cpu")) and backend.model.config._attn_implementation == NAME
