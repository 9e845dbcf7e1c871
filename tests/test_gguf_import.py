"""GGUF import: one path for every quantization type, checked against the model it came from."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from app.models.errors import ModelFileError
from app.models.gguf_import import import_gguf, inspect_gguf
from tests.factories import tiny_llama, write_gguf

Q = gguf.GGMLQuantizationType


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_import_matches_the_weights_written(tmp_path, tiny_fields, qtype):
    source = tiny_llama(seed=7)
    write_gguf(source, tmp_path / "m.gguf", tiny_fields, qtype)
    folders = import_gguf(tmp_path / "m.gguf", tmp_path / "out", mlx_variants=())

    imported = load_file(str(folders["hf"] / "model.safetensors"))
    # Q/K rows come back in Hugging Face order: equal to the source up to the quantization,
    # and exactly equal to what the file holds once llama.cpp's permutation is undone.
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
        original = source.state_dict()[name].numpy()
        tolerance = {Q.F32: 0, Q.F16: 2e-3, Q.Q8_0: 0.05, Q.Q4_0: 0.5, Q.Q4_1: 0.5}[qtype]
        assert np.abs(imported[name] - original).max() <= tolerance + 1e-7
    if qtype == Q.F32:
        from transformers import AutoModelForCausalLM

        reloaded = AutoModelForCausalLM.from_pretrained(str(folders["hf"]), dtype=torch.float32)
        ids = [1, 900, 198, 20, 30, 40, 2]
        np.testing.assert_allclose(_logits(reloaded, ids), _logits(source, ids), atol=1e-5)
    config = json.loads((folders["hf"] / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 10000.0  # legacy key that mlx-lm reads
    assert "quantization_config" not in config


def test_imported_folder_loads_on_both_backends_with_equal_logits(tmp_path, tiny_fields):
    source = tiny_llama(seed=11)
    write_gguf(source, tmp_path / "m.gguf", tiny_fields, Q.Q8_0)
    folders = import_gguf(tmp_path / "m.gguf", tmp_path / "out", mlx_variants=("mlx", "mlx-4bit"))
    from app.engine.backends import load_backend

    ids = [1, 900, 198, 300, 301, 302]
    torch_be = load_backend(folders["hf"], "torch")
    mlx_be = load_backend(folders["mlx"], "mlx")
    import mlx.core as mx

    t = torch_be.forward_last(ids).numpy()
    m = np.array(mlx_be.forward_last(ids).astype(mx.float32))
    np.testing.assert_allclose(m, t, atol=1e-4)
    q4 = load_backend(folders["mlx-4bit"], "mlx")
    assert q4.dtype.startswith("int4")
    assert q4.weights_bytes < mlx_be.weights_bytes / 2


def test_reimport_reuses_the_folders(tmp_path, tiny_fields):
    write_gguf(tiny_llama(seed=3), tmp_path / "m.gguf", tiny_fields)
    first = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    stamp = (first["hf"] / "model.safetensors").stat().st_mtime_ns
    again = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert (again["hf"] / "model.safetensors").stat().st_mtime_ns == stamp


def test_truncated_gguf_is_refused_and_leaves_nothing(tmp_path, tiny_fields):
    whole = tmp_path / "whole.gguf"
    write_gguf(tiny_llama(seed=5), whole, tiny_fields)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    out = tmp_path / "out"
    with pytest.raises(ModelFileError) as err:
        import_gguf(cut, out)
    message = str(err.value)
    assert "cut.gguf" in message and "truncated" in message
    assert not out.exists() or not any(out.iterdir())


def test_header_cut_short_is_refused(tmp_path, tiny_fields):
    whole = tmp_path / "whole.gguf"
    write_gguf(tiny_llama(seed=5), whole, tiny_fields)
    cut = tmp_path / "head.gguf"
    cut.write_bytes(whole.read_bytes()[:100])
    with pytest.raises(ModelFileError, match="head.gguf"):
        inspect_gguf(cut)


def test_non_gguf_is_refused_with_its_name(tmp_path):
    fake = tmp_path / "notes.gguf"
    fake.write_text("these are not weights")
    out = tmp_path / "out"
    with pytest.raises(ModelFileError) as err:
        import_gguf(fake, out)
    assert "notes.gguf is not a GGUF file" in str(err.value)
    assert not out.exists()


def test_a_tensor_of_a_type_nothing_reads_is_refused_before_loading_naming_it(tmp_path):
    """Q8_1 (an activation type llama.cpp never writes into model files) has no reader here: the
    check before loading names the tensor and the type."""
    writer = gguf.GGUFWriter(tmp_path / "odd.gguf", "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 40), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"tensor 'blk.0.attn_q.weight' is stored as Q8_1, a type Tandem cannot"):
        inspect_gguf(tmp_path / "odd.gguf")


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_refused_naming_it():
    """What the loader says of a tensor whose bytes are not what its shape and type need (the
    check before loading catches a truncated file; this is the loader's own guard)."""
    from types import SimpleNamespace

    from app.models.gguf_torch import _coded

    tensor = SimpleNamespace(name="blk.3.ffn_down.weight", tensor_type=gguf.GGMLQuantizationType.Q6_K,
                             data=np.zeros((64, 200), np.uint8))  # a Q6_K row of 256 weights takes 210 bytes
    with pytest.raises(ModelFileError, match=r"tensor blk.3.ffn_down.weight \(Q6_K, 64x256\): Q6_K: 12800 bytes"):
        _coded(tensor, None, 64, 256)
