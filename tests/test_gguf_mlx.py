"""A GGUF opened on MLX becomes MLX quantized layers at the file's own numbers (app/models/gguf_mlx.py),
checked on MLX's CPU build against gguf-py's own dequantization."""

from __future__ import annotations

import json

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.bench.random_gguf import random_blocks
from app.models import gguf_mlx
from app.models.gguf_mlx import (FORMATS, GROUP, MLXQuantized, format_of, mlx_info_lines, mlx_quantized, pack,
                                 read_record, requantize, weight_changes)

Q = gguf.GGMLQuantizationType
EXACT = [k for k, f in FORMATS.items() if f.exact and k != "MXFP4"]
LOSSY = [k for k, f in FORMATS.items() if not f.exact]


def _reference(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, Q[kind]), dtype=np.float32).reshape(rows, cols)


def _mlx_weights(m: MLXQuantized) -> np.ndarray:
    """MLX's own dequantization of the packed arrays, float32."""
    biases = None if m.biases is None else mx.array(m.biases)
    return np.array(mx.dequantize(mx.array(pack(m.q, m.bits)), mx.array(m.scales), biases, group_size=GROUP,
                                  bits=m.bits, mode=m.mode, dtype=mx.float32))


def _mxfp4_blocks(rows: int, cols: int, rng) -> np.ndarray:
    blocks = rng.integers(0, 256, (rows * cols // 32, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(100, 150, rows * cols // 32)  # e8m0 scales 2^-27 .. 2^22
    return blocks.reshape(rows, -1)


def test_mlx_cpu_rounds_the_product_then_the_sum():
    """The claim the exactness argument leans on least (every product below is exact) but the
    measured changes rely on: MLX's CPU dequantize computes fl(fl(s * q) + b), no fused multiply-add."""
    rng = np.random.default_rng(1)
    q = rng.integers(0, 256, (4000, 32), dtype=np.uint8)
    s = rng.uniform(0.5, 1, (4000, 1)).astype(np.float32)
    b = rng.uniform(-100, 100, (4000, 1)).astype(np.float32)
    got = _mlx_weights(MLXQuantized(q, s, b, 8, "affine"))
    two = np.add(np.multiply(s, q, dtype=np.float32), b, dtype=np.float32)
    fused = (s.astype(np.float64) * q + b).astype(np.float32)
    assert (two != fused).any()  # the probe can tell them apart
    np.testing.assert_array_equal(got, two)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packing_is_mlx_bit_stream(bits):
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 2 ** bits, (3, 64), dtype=np.uint8)
    ones, zeros = np.ones((3, 2), np.float32), np.zeros((3, 2), np.float32)
    np.testing.assert_array_equal(_mlx_weights(MLXQuantized(q, ones, zeros, bits, "affine")), q.astype(np.float32))


@pytest.mark.parametrize("kind", EXACT)
def test_exact_types_are_gguf_bit_for_bit(kind):
    """Every code value and random fp16 scales: MLX's weights are gguf's dequantization, the same
    float32 bits wherever the weight is not zero (gguf writes d * 0 with d's sign, MLX +0)."""
    rng = np.random.default_rng(7)
    rows, cols = 16, 512
    raw = random_blocks(kind, rows, cols, rng)
    m = mlx_quantized(kind, raw, rows, cols)
    assert m.bits == format_of(kind).bits and m.q.dtype == np.uint8 and m.scales.dtype == np.float32
    assert int(m.q.max()) < 2 ** m.bits
    got, want = _mlx_weights(m), _reference(kind, raw, rows, cols)
    assert np.array_equal(got, want)
    nonzero = want != 0
    np.testing.assert_array_equal(got.view(np.uint32)[nonzero], want.view(np.uint32)[nonzero])
    np.testing.assert_array_equal(m.dequantize(), got)  # the record's measure is MLX's own formula


def test_mxfp4_is_mlx_mxfp4_exactly():
    rng = np.random.default_rng(3)
    raw = _mxfp4_blocks(8, 256, rng)
    m = mlx_quantized("MXFP4", raw, 8, 256)
    assert m.mode == "mxfp4" and m.biases is None and m.scales.dtype == np.uint8
    got, want = _mlx_weights(m), _reference("MXFP4", raw, 8, 256)
    assert np.array_equal(got, want)
    assert np.array_equal(m.dequantize(), want)


@pytest.mark.parametrize("kind", LOSSY)
def test_groups_of_16_take_8_bits_within_half_a_step(kind):
    """Q6_K and Q2_K (groups of 16, which MLX has not) re-quantized to 8 bits in groups of 32: each
    weight moves by at most half a step of its group's grid ((max - min) / 255), plus float32's
    rounding of the product and the sum."""
    rng = np.random.default_rng(11)
    rows, cols = 16, 512
    raw = random_blocks(kind, rows, cols, rng)
    m = mlx_quantized(kind, raw, rows, cols)
    assert m.bits == 8
    got, want = _mlx_weights(m), _reference(kind, raw, rows, cols)
    g = want.reshape(rows, cols // GROUP, GROUP)
    span = g.max(-1) - g.min(-1)
    bound = m.scales / 2 + 2.0 ** -22 * (span + np.abs(g).max(-1))
    change = np.abs(got - want).reshape(g.shape).max(-1)
    assert (change <= bound).all()
    assert change.max() > 0  # not exact: the test would pass a wrong claim otherwise
    assert (change <= span / 510 * (1 + 1e-5) + 2.0 ** -22 * (span + np.abs(g).max(-1))).all()


def test_requantize_keeps_a_constant_group():
    values = np.full((2, 64), 0.25, np.float32)
    values[1] = -3.0
    np.testing.assert_array_equal(requantize(values).dequantize(), values)


def _write_model(path, fields, types: dict[str, str], hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2,
                 seed=0) -> None:
    """A llama GGUF whose 2-D tensors have random valid blocks of the given types ("attn_q",
    "token_embd", ...; per layer as "0.attn_q" overrides "attn_q"), norms random near 1."""
    from tests.factories import _llama_writer

    rng = np.random.default_rng(seed)
    vocab = len(fields["tokens"])
    writer = _llama_writer(path, fields, layers, 256, hidden, intermediate, heads, kv_heads, 10000.0, 1e-5, vocab)
    head_dim = hidden // heads

    def add(name: str, kind: str, rows: int, cols: int) -> None:
        if kind == "F16":
            writer.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16))
        else:
            writer.add_tensor(name, random_blocks(kind, rows, cols, rng), raw_dtype=Q[kind])

    add("token_embd.weight", types["token_embd"], vocab, hidden)
    writer.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, hidden).astype(np.float32))
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (intermediate, hidden), "ffn_up": (intermediate, hidden), "ffn_down": (hidden, intermediate)}
    for i in range(layers):
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", rng.uniform(0.8, 1.2, hidden).astype(np.float32))
        for name, (rows, cols) in shapes.items():
            add(f"blk.{i}.{name}.weight", types.get(f"{i}.{name}", types.get(name)), rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# Every exactly held type in one tiny model (hidden 256: whole K-quant super-blocks), and one F16 layer.
MODEL_TYPES = {"token_embd": "Q8_0",
               "0.attn_q": "Q4_K", "0.attn_k": "Q5_K", "0.attn_v": "Q3_K", "0.attn_output": "IQ4_XS",
               "0.ffn_gate": "Q4_0", "0.ffn_up": "Q5_0", "0.ffn_down": "Q4_1",
               "1.attn_q": "Q5_1", "1.attn_k": "IQ4_NL", "1.attn_v": "Q8_0", "1.attn_output": "F16",
               "1.ffn_gate": "Q4_K", "1.ffn_up": "Q5_K", "1.ffn_down": "Q3_K"}


@pytest.fixture(scope="module")
def opened(tmp_path_factory, tiny_fields):
    """The tiny model opened on MLX (resolve_model, precision auto) and the float32 reference:
    transformers' own import of the same file, loaded by mlx-lm. (gguf path, mlx folder, reference folder)"""
    from app.models.resolve import resolve_model
    from app.models.transformers_convert import gguf_to_hf_folder

    root = tmp_path_factory.mktemp("gguf-mlx")
    path = root / "tiny.gguf"
    _write_model(path, tiny_fields, MODEL_TYPES)
    reference = gguf_to_hf_folder(path, root / "reference")
    chunk = gguf_mlx.CHUNK_BYTES
    gguf_mlx.CHUNK_BYTES = 48 * 256 * 4  # 48 rows at a time: Q and K (256 and 128 rows) move across chunks
    try:
        folder = resolve_model(path, "mlx", progress=lambda message: None)
    finally:
        gguf_mlx.CHUNK_BYTES = chunk
    return path, folder, reference


def test_opening_a_gguf_on_mlx_makes_quantized_layers_without_float32(opened):
    path, folder, _ = opened
    assert folder.name == "mlx-gguf"
    assert not (folder.parent / "hf").exists()  # no float32 detour
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    modules = dict(model.named_modules())
    expected_bits = {"model.embed_tokens": 8, "model.layers.0.self_attn.q_proj": 4,
                     "model.layers.0.self_attn.k_proj": 5, "model.layers.0.self_attn.v_proj": 8,
                     "model.layers.0.mlp.up_proj": 5, "model.layers.1.mlp.up_proj": 5}
    for module_path, bits in expected_bits.items():
        layer = modules[module_path]
        assert isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)), module_path
        assert (layer.bits, layer.group_size) == (bits, GROUP), module_path
    assert isinstance(modules["model.layers.1.self_attn.o_proj"], nn.Linear)  # the file's F16 layer
    dtypes = {name: v.dtype for name, v in tree_flatten(model.parameters())}
    assert dtypes["model.layers.1.self_attn.o_proj.weight"] == mx.float16
    assert mx.float16 not in {d for n, d in dtypes.items() if n != "model.layers.1.self_attn.o_proj.weight"}
    assert mx.bfloat16 not in dtypes.values()
    record = read_record(folder)
    assert record["types"]["Q4_K"]["exact"] and record["types"]["Q4_K"]["tensors"] == 2
    assert all(entry["max_abs"] == 0 for entry in record["types"].values())
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["model.layers.0.self_attn.k_proj"] == {"group_size": 32, "bits": 5,
                                                                         "mode": "affine"}
    from app.engine.backends import load_backend

    assert load_backend(folder, "mlx").dtype.startswith("int")  # quantized, as the file is


def test_loaded_weights_are_the_references(opened):
    """Every quantized layer, dequantized by MLX, is transformers' float32 import of the file exactly
    (the names and llama's Q/K row order included); the F16 layer is its float16 values."""
    from mlx_lm.utils import load_model

    _, folder, reference = opened
    model, _ = load_model(folder)
    ref, _ = load_model(reference)
    ref_params = dict(tree_flatten(ref.parameters()))
    checked = 0
    for name, layer in model.named_modules():
        if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            w = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=layer.bits,
                              dtype=mx.float32)
            assert np.array_equal(np.array(w), np.array(ref_params[f"{name}.weight"])), name
            checked += 1
    assert checked == 14  # the embedding and 13 of the 14 projections
    for name, value in tree_flatten(model.parameters()):
        if not name.endswith((".scales", ".biases")) and value.dtype in (mx.float32, mx.float16):
            assert np.array_equal(np.array(value.astype(mx.float32)), np.array(ref_params[name])), name


def test_logits_match_the_float32_reference(opened):
    """The same weights bit for bit (above), so the logits may differ only where quantized_matmul
    sums in another order than a float32 matmul over the dequantized weights (Metal's kernels: per
    group, scale * sum(x q) + bias * sum(x)). Reordering a float32 dot product of n terms moves it by
    at most about n * 2^-24 of the sum of its terms' magnitudes, n <= 512 here, a few 1e-6 of the
    logits' scale through two layers: the tolerance, 1e-5 of that scale, allows it, and is 60 times
    smaller than what one code of the file one step away does (0.066 of logits up to 105). On MLX's
    CPU build the two agree exactly (measured: 0)."""
    from mlx_lm.utils import load_model

    _, folder, reference = opened
    model, _ = load_model(folder)
    ref, _ = load_model(reference)
    ids = mx.array([[1, 900, 198, 20, 30, 40, 2, 517]])
    got, want = np.array(model(ids)), np.array(ref(ids))
    tolerance = 1e-5 * np.abs(want).max()
    assert np.abs(got - want).max() <= tolerance
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # one code of the embedding (also the tied head) one step away: the tolerance sees it
    layer = model.model.embed_tokens
    w = np.array(layer.weight)
    w[517, 0] ^= np.uint32(1)  # the lowest bit of the first 8-bit code of token 517's row
    layer.weight = mx.array(w)
    assert np.abs(np.array(model(ids)) - want).max() > 10 * tolerance


def test_import_variants_skip_the_float32_folder():
    from app.models.gguf_import import MLX_GGUF_VARIANT, import_variants

    assert import_variants((MLX_GGUF_VARIANT,), None) == (MLX_GGUF_VARIANT,)
    assert import_variants(("mlx",), None) == ("hf", "mlx")


def test_info_says_what_each_type_becomes_and_the_largest_change(tmp_path):
    """A file of Q6_K, Q2_K, Q4_K and an F32 tensor: `models info` words on MLX, the change
    measured with check (0 for Q4_K, between 0 and the bound for the others)."""
    rng = np.random.default_rng(5)
    writer = gguf.GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    for kind in ("Q6_K", "Q2_K", "Q4_K"):
        writer.add_tensor(f"blk.0.{kind.lower()}.weight", random_blocks(kind, 8, 512, rng), raw_dtype=Q[kind])
    writer.add_tensor("output_norm.weight", np.ones(512, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    changes = weight_changes(tmp_path / "types.gguf")
    assert changes["Q4_K"].max_abs == 0 and changes["Q4_K"].exact
    for kind in ("Q6_K", "Q2_K"):
        assert not changes[kind].exact and 0 < changes[kind].max_rel < 1 / 255
    lines = "\n".join(mlx_info_lines(tmp_path / "types.gguf", check=True))
    assert "Q6_K" in lines and "8-bit affine, groups of 32" in lines and "(measured)" in lines
    assert "exact (mx.dequantize gives gguf's dequantization)" in lines
    assert "at most 1/510" in "\n".join(mlx_info_lines(tmp_path / "types.gguf"))


def test_files_whose_tensors_are_rearranged_fall_back_with_a_reason(tmp_path):
    from app.models.gguf_mlx import unsupported_reason

    assert unsupported_reason("llama") is None and unsupported_reason("gemma3") is None
    assert "re-arranged" in unsupported_reason("qwen2moe")
    writer = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "llama")
    writer.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((4, 8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "ffn_gate_exps" in unsupported_reason("llama", tmp_path / "moe.gguf")


def test_models_info_says_what_each_type_becomes_on_mlx_where_mlx_is_the_default(tiny_q4, capsys, monkeypatch):
    from app.cli import main
    from app.engine import backends
    from app.models.gguf_import import gguf_source

    source = gguf_source(tiny_q4[0])
    assert main(["models", "info", str(source)]) == 0
    assert "on MLX" not in capsys.readouterr().out  # PyTorch's machine: its own lines only
    monkeypatch.setattr(backends, "default_backend", lambda: "mlx")
    assert main(["models", "info", str(source)]) == 0
    out = capsys.readouterr().out
    assert "on MLX (precision auto)" in out
    q4 = [line for line in out.splitlines() if line.startswith("Q4_0")]
    assert len(q4) == 2 and "4-bit affine, groups of 32" in q4[1] and "exact" in q4[1]  # PyTorch's, then MLX's
