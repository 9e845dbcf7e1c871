"""The checks before any weights load: whole files, a supported architecture, enough memory."""

from __future__ import annotations

import json
import shutil

import pytest

from app.models.architecture import check_architecture
from app.models.errors import ModelFileError
from app.models.integrity import check_weights
from app.models.memory import (MIN_CONTEXT, PLANNED_CONTEXT, MemoryEstimate, NotEnoughMemory, check_fits, estimate,
                               free_memory, kv_bytes_per_token, parse_bytes)


@pytest.fixture
def model(tiny_pair, tmp_path):
    return shutil.copytree(tiny_pair["target"], tmp_path / "model")


def _header(path):
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    return length, json.loads(data[8:8 + length])


def test_intact_weights_give_their_byte_count(model):
    length, header = _header(model / "model.safetensors")
    end = max(info["data_offsets"][1] for name, info in header.items() if name != "__metadata__")
    assert check_weights(model) == end == (model / "model.safetensors").stat().st_size - 8 - length


def test_a_truncated_file_is_named_with_its_sizes(model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelFileError, match=r"model.safetensors is truncated: its tensors need .* MB but the file"):
        check_weights(model)


@pytest.mark.parametrize("damage, phrase", [
    (lambda data: (10**9).to_bytes(8, "little") + data[8:], "header is corrupt"),
    (lambda data: data[:8] + b"\xff" * 16 + data[24:], "header is corrupt"),
    (lambda data: data[:5], "cut short"),
])
def test_a_corrupt_header_is_named(model, damage, phrase):
    weights = model / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ModelFileError, match=phrase) as err:
        check_weights(model)
    assert "model.safetensors" in str(err.value)


def test_a_shard_missing_from_the_index_is_a_partial_download(model):
    _, header = _header(model / "model.safetensors")
    names = [n for n in header if n != "__metadata__"]
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelFileError, match=r"partial download: 1 of 2 .*model-00002-of-00002"):
        check_weights(model)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_architectures_the_backends_run(backend):
    for model_type in ("llama", "qwen2", "qwen3"):
        check_architecture({"model_type": model_type}, backend, "m")
    # a multimodal wrapper loads as its text model
    check_architecture({"model_type": "tandem_vlm", "text_config": {"model_type": "qwen3"}}, backend, "m")
    with pytest.raises(ModelFileError, match="“tandem_imaginary” model") as err:
        check_architecture({"model_type": "tandem_imaginary"}, backend, "m")
    assert "llama" in str(err.value)  # what it does support
    with pytest.raises(ModelFileError, match="no model_type"):
        check_architecture({}, backend, "m")


QWEN_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "hidden_size": 3584, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}


def test_the_estimate_counts_weights_as_loaded_and_the_kv_cache():
    # keys and values, 28 layers, 4 KV heads of 128, 2 bytes each
    assert kv_bytes_per_token(QWEN_7B, 2) == 2 * 28 * 4 * 128 * 2
    on_gpu = estimate("target", QWEN_7B, 15_200_000_000, "torch", "cuda:0")
    assert on_gpu.weights == 15_200_000_000 and on_gpu.kv_per_token == 57_344
    as_float32 = estimate("target", QWEN_7B, 15_200_000_000, "torch", "cpu", "float32")
    assert as_float32.weights == 30_400_000_000 and as_float32.kv_per_token == 2 * 57_344
    assert estimate("draft", QWEN_7B, 15_200_000_000, "torch", "cpu", "int4").weights < 6e9
    assert on_gpu.total(4096) == on_gpu.weights + 57_344 * 4096 + int(on_gpu.weights * 0.08)


def test_hybrid_models_count_only_their_attention_layers():
    hybrid = {**QWEN_7B, "layer_types": ["linear_attention"] * 3 + ["full_attention"] * 1 + ["linear_attention"] * 24}
    assert kv_bytes_per_token(hybrid, 2) == kv_bytes_per_token(QWEN_7B, 2) // 28
    interval = {**QWEN_7B, "full_attention_interval": 4}
    assert kv_bytes_per_token(interval, 2) == kv_bytes_per_token(QWEN_7B, 2) // 4


def test_check_fits_refuses_warns_or_passes_with_numbers():
    target = MemoryEstimate("target", 15_000_000_000, 57_344, 32768)
    draft = MemoryEstimate("draft", 1_000_000_000, 12_288, 32768)
    need = target.total(PLANNED_CONTEXT) + draft.total(PLANNED_CONTEXT)
    assert check_fits([target, draft], need * 2, "RAM") is None
    assert "needs about" in check_fits([target, draft], int(need / 0.9), "RAM")
    short = target.total(MIN_CONTEXT) + draft.total(MIN_CONTEXT)
    warning = check_fits([target, draft], short + 1, "RAM")
    assert "only for chats up to about 4,096 tokens" in warning
    with pytest.raises(NotEnoughMemory) as err:
        check_fits([target, draft], 8_000_000_000, "GPU memory on Test GPU")
    message = str(err.value)
    assert "weights 15.0 GB" in message and "only 8.0 GB of GPU memory on Test GPU is free" in message
    assert "the draft" in message


def test_free_memory_can_be_simulated(monkeypatch):
    assert parse_bytes("8GB") == 8_000_000_000 and parse_bytes("512 MiB") == 512 * 2**20 and parse_bytes("1000") == 1000
    monkeypatch.setenv("TANDEM_FREE_MEMORY", "2GB")
    assert free_memory("torch", "cpu")[0] == 2_000_000_000
    monkeypatch.delenv("TANDEM_FREE_MEMORY")
    free, where = free_memory("torch", "cpu")
    assert free > 0 and where == "RAM"
    with pytest.raises(ValueError, match="TANDEM_FREE_MEMORY"):
        parse_bytes("lots")


def test_a_gguf_too_large_to_import_is_refused_before_converting(tiny_pair, monkeypatch, tmp_path):
    from app.models.gguf_import import sha256_of
    from app.paths import models_dir
    from app.models.resolve import resolve_model

    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))  # this test's imports stay here
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes((tiny_pair["target"].parent.parent / "target.gguf").read_bytes())
    cache = models_dir() / f"model-{sha256_of(gguf)[:12]}"
    monkeypatch.setenv("TANDEM_FREE_MEMORY", "1000")
    with pytest.raises(NotEnoughMemory, match=r"model.gguf has \d+ million weights; importing it dequantizes") as err:
        resolve_model(gguf, "torch", progress=lambda m: None, precision="float32")
    assert "only 0.0 GB of memory (as TANDEM_FREE_MEMORY says) is free" in str(err.value)
    assert not cache.exists()  # nothing was converted
    # at the file's own precisions nothing is dequantized: no float32 peak to refuse (the runner's
    # memory check then counts the size it will load)
    own = resolve_model(gguf, "torch", progress=lambda m: None)
    assert own.name == "gguf" and not list(own.glob("*.safetensors"))
    monkeypatch.delenv("TANDEM_FREE_MEMORY")
    float32 = resolve_model(gguf, "torch", progress=lambda m: None, precision="float32")
    assert (float32 / "model.safetensors").is_file()  # fits: imported
