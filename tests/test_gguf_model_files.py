"""The benchmark's GGUF files (app/bench/gguf_model_files.py): random-weight Llamas written at the
per-tensor types llama.cpp's quantizer picks, readable by gguf's own reader, with finite scales."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from app.bench.gguf_model_files import (LlamaShape, file_facts, tensor_type, type_map, use_more_bits,
                                        write_random_llama)
from app.bench.random_gguf import SCALE_FIELDS

TINY_VOCAB = {"tokens": ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(61)], "types": [3, 3, 3] + [1] * 61,
              "merges": [], "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}


def _read(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _check_blocks(tensor) -> None:
    """Every scale field a finite, normal fp16; the weights finite, of about 1/sqrt(cols)."""
    kind = tensor.tensor_type.name
    cols = int(tensor.shape[0])
    if kind == "F32":
        assert np.all(tensor.data == 1.0)
        return
    block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type][1]
    blocks = np.asarray(tensor.data).reshape(-1, block_bytes)
    for at in SCALE_FIELDS[kind]:
        scales = np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16).astype(np.float32)
        assert np.all(np.isfinite(scales)) and np.all(np.abs(scales) >= 2.0 ** -14), (tensor.name, at)
    weights = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    assert np.all(np.isfinite(weights))
    spread = float(np.sqrt(np.mean(weights.astype(np.float64) ** 2)))
    assert 0.5 / np.sqrt(cols) < spread < 8.0 / np.sqrt(cols), (tensor.name, spread)


def test_tiny_q4_k_m_has_llama_cpps_types_per_tensor(tmp_path):
    """A 2-layer tied Llama, hidden 256 (one K-quant block a row): Q4_K everywhere but the tied
    embedding (the head's Q6_K) and attn_v / ffn_down in the last layer (llama.cpp's more-bits
    layers: the first and last eighth, every third between)."""
    shape = LlamaShape("tiny", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, tied=True)
    path = tmp_path / "tiny.gguf"
    written = write_random_llama(path, shape, "Q4_K_M", np.random.default_rng(0), tokenizer=TINY_VOCAB)
    tensors = _read(path)
    assert {name: t.tensor_type.name for name, t in tensors.items()} == written
    assert "output.weight" not in tensors
    assert written["token_embd.weight"] == "Q6_K"
    assert written["blk.1.attn_v.weight"] == written["blk.1.ffn_down.weight"] == "Q6_K"
    assert written["blk.0.attn_v.weight"] == written["blk.0.ffn_down.weight"] == "Q4_K"
    assert {written[f"blk.{i}.{n}.weight"] for i in (0, 1) for n in ("attn_q", "attn_k", "attn_output", "ffn_gate",
                                                                     "ffn_up")} == {"Q4_K"}
    assert written["output_norm.weight"] == written["blk.0.attn_norm.weight"] == "F32"
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [512, 256]  # ggml's order: cols, rows
    assert list(tensors["token_embd.weight"].shape) == [256, 64]
    for tensor in tensors.values():
        _check_blocks(tensor)
    reader = gguf.GGUFReader(path)
    assert reader.fields["llama.rope.freq_base"].contents() == 500000.0
    assert reader.fields["tokenizer.ggml.tokens"].contents() == TINY_VOCAB["tokens"]
    facts = file_facts(path, kv_tokens=512)
    assert facts.tied and facts.kv_bytes == 2 * 2 * 2 * 64 * 512 * 4
    assert facts.pass_bytes == sum(int(t.n_bytes) for t in tensors.values()) + facts.kv_bytes


def test_untied_head_and_more_bits_layers(tmp_path):
    """An untied head is Q6_K and the embedding keeps the default Q4_K; with 8 layers the more-bits
    layers are 0, 3, 6 and 7 (n/8 = 1, 7n/8 = 7, (i - 1) % 3 == 2). Q8_0 is Q8_0 throughout."""
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    shape = LlamaShape("untied", hidden=256, layers=8, heads=4, kv_heads=1, head_dim=64, intermediate=256, tied=False)
    path = tmp_path / "untied.gguf"
    written = write_random_llama(path, shape, "Q4_K_M", np.random.default_rng(1), tokenizer=TINY_VOCAB)
    tensors = _read(path)
    assert tensors["output.weight"].tensor_type.name == "Q6_K"
    assert tensors["token_embd.weight"].tensor_type.name == "Q4_K"
    assert [i for i in range(8) if written[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert [i for i in range(8) if written[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
    facts = file_facts(path, kv_tokens=512)
    embedding = int(tensors["token_embd.weight"].n_bytes)
    assert not facts.tied and facts.pass_bytes == facts.weight_bytes - embedding + facts.kv_bytes
    assert set(type_map(shape, "Q8_0", 64).values()) == {"Q8_0", "F32"}


def test_the_two_and_three_bit_presets_mix_types_as_llama_cpp_does():
    """Q3_K_M: attn_v Q5_K in the first two layers then Q4_K, ffn_down Q5_K in the first
    sixteenth then Q4_K, attn_output Q4_K, the rest Q3_K. Q2_K: attn_v Q4_K where 4 query heads
    or more share a KV head (else Q3_K), ffn_down and attn_output Q3_K, the rest Q2_K. Both keep
    the head Q6_K, and a row that is not whole blocks of 256 falls back to IQ4_NL."""
    shape = LlamaShape("s", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, intermediate=8192, tied=True)
    q3 = type_map(shape, "Q3_K_M", 64)
    assert [q3[f"blk.{i}.attn_v.weight"] for i in range(4)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert [q3[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q5_K", "Q4_K", "Q4_K"]
    assert q3["blk.9.attn_output.weight"] == "Q4_K" and q3["blk.9.ffn_up.weight"] == q3["blk.0.attn_q.weight"] == "Q3_K"
    q2 = type_map(shape, "Q2_K", 64)
    assert q2["blk.3.attn_v.weight"] == "Q4_K"  # 32 heads / 8 KV heads
    assert q2["blk.3.ffn_down.weight"] == q2["blk.3.attn_output.weight"] == "Q3_K"
    assert q2["blk.3.ffn_gate.weight"] == q2["blk.3.attn_k.weight"] == "Q2_K"
    assert q2["token_embd.weight"] == q3["token_embd.weight"] == "Q6_K"
    narrow = dict(layer=3, layers=16, tied=True, n_gqa=2)
    assert tensor_type("blk.3.attn_v.weight", "Q2_K", cols=2048, **narrow) == "Q3_K"
    assert tensor_type("blk.3.attn_q.weight", "Q2_K", cols=576, **narrow) == "IQ4_NL"


@pytest.mark.parametrize(("file_type", "default", "more_bits"), [("Q4_K_M", "Q5_0", "Q8_0"), ("Q5_K_M", "Q5_1", "Q8_0"),
                                                                   ("IQ4_XS", "IQ4_NL", "IQ4_NL")])
def test_rows_not_whole_k_blocks_fall_back_as_llama_cpp_does(file_type, default, more_bits):
    """The demo's hidden size (576) is not whole blocks of 256: llama.cpp falls back to the
    32-weight types (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL), and the tied
    head to Q8_0; a 1536-wide ffn_down keeps its K-quant."""
    common = dict(layers=30, tied=True, n_gqa=3)
    assert tensor_type("blk.5.attn_q.weight", file_type, cols=576, layer=5, **common) == default
    assert tensor_type("blk.0.attn_v.weight", file_type, cols=576, layer=0, **common) == more_bits
    assert tensor_type("token_embd.weight", file_type, cols=576, layer=-1, **common) == "Q8_0"
    wide = tensor_type("blk.9.ffn_down.weight", file_type, cols=1536, layer=9, **common)
    assert wide == {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", "IQ4_XS": "IQ4_XS"}[file_type]
