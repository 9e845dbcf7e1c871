"""app.models.gguf_codes: every kernel type's codes, scales and offsets give gguf-py's weights bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from app.bench.random_gguf import BLOCK, SCALE_FIELDS, random_blocks
from app.models.gguf_codes import (
    BIAS_OF,
    BITS2_16,
    BITS3_16,
    BITS5_32,
    BITS6_16,
    GRID32,
    BYTES32,
    GROUP_OF,
    KERNEL_TYPES,
    KIND_OF,
    NIBBLES32,
    CodeGroups,
    code_groups,
)

ROWS = 6
COLS = 512  # 2 super-blocks of 256, 16 blocks of 32 a row
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # the types gguf.quants.quantize writes
CODE_RANGE = {  # (min, max) a code of each type can take
    "Q4_0": (0, 15), "Q4_1": (0, 15), "Q4_K": (0, 15),
    "Q5_0": (-16, 15), "Q5_1": (0, 31), "Q5_K": (0, 31), "Q8_0": (-128, 127),
    "Q2_K": (0, 3), "Q3_K": (-4, 3), "Q6_K": (-32, 31), "IQ4_NL": (-127, 113), "IQ4_XS": (-127, 113),
}
HAS_OFFSET = {"Q4_0", "Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"}


def _reference(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols)


def _decode(kind: str, raw: np.ndarray, rows: int = ROWS, cols: int = COLS) -> tuple[CodeGroups, np.ndarray]:
    return code_groups(kind, raw, rows, cols), _reference(kind, raw, rows, cols)


def test_type_tables_match_ggml():
    assert KERNEL_TYPES == ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                            "IQ4_NL", "IQ4_XS")
    assert set(KIND_OF) == set(KERNEL_TYPES) == set(SCALE_FIELDS)
    assert {k for k, v in KIND_OF.items() if v == NIBBLES32} == {"Q4_0", "Q4_1", "Q4_K"}
    assert {k for k, v in KIND_OF.items() if v == BITS5_32} == {"Q5_0", "Q5_1", "Q5_K"}
    assert {k for k, v in KIND_OF.items() if v == BITS6_16} == {"Q6_K"}
    assert {k for k, v in KIND_OF.items() if v == BITS2_16} == {"Q2_K"}
    assert {k for k, v in KIND_OF.items() if v == BITS3_16} == {"Q3_K"}
    assert {k for k, v in KIND_OF.items() if v == BYTES32} == {"Q8_0"}
    assert {k for k, v in KIND_OF.items() if v == GRID32} == {"IQ4_NL", "IQ4_XS"}
    assert GROUP_OF == {NIBBLES32: 32, BYTES32: 32, BITS2_16: 16, BITS5_32: 32, BITS6_16: 16, GRID32: 32,
                        BITS3_16: 16}
    # a packed type's codes plus its bias are its unsigned 2-, 3-, 5- or 6-bit q (CODE_RANGE's low end)
    assert {k: v for k, v in BIAS_OF.items() if v} == {"Q5_0": 16, "Q6_K": 32, "Q3_K": 4}
    bits = {BITS2_16: 2, BITS3_16: 3, BITS5_32: 5, BITS6_16: 6}
    for kind in ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q2_K", "Q3_K"):
        low, high = CODE_RANGE[kind]
        assert low + BIAS_OF[kind] == 0 and high + BIAS_OF[kind] == (1 << bits[KIND_OF[kind]]) - 1
    for name, size in BLOCK.items():
        assert size == GGML_QUANT_SIZES[GGMLQuantizationType[name]], name


@pytest.mark.parametrize("kind", KERNEL_TYPES)
def test_random_blocks_exact(kind):
    raw = random_blocks(kind, ROWS, COLS, np.random.default_rng(1))
    assert raw.dtype == np.uint8 and raw.shape == (ROWS, COLS // BLOCK[kind][0] * BLOCK[kind][1])
    groups, ref = _decode(kind, raw)
    assert np.array_equal(groups.dequantize(), ref)

    group = GROUP_OF[KIND_OF[kind]]
    assert groups.kind == KIND_OF[kind] and groups.group == group
    assert groups.codes.shape == (ROWS, COLS)
    assert groups.codes.dtype == (np.uint8 if groups.kind == NIBBLES32 else np.int8)
    lo, hi = CODE_RANGE[kind]
    assert lo <= groups.codes.min() and groups.codes.max() <= hi
    assert groups.codes.min() == lo and groups.codes.max() == hi  # random blocks reach every end
    assert groups.scale.shape == (ROWS, COLS // group) and groups.scale.dtype == np.float32
    assert (groups.offset is not None) == (kind in HAS_OFFSET)
    if groups.offset is not None:
        assert groups.offset.shape == (ROWS, COLS // group) and groups.offset.dtype == np.float32


@pytest.mark.parametrize("kind", KERNEL_TYPES)
def test_any_finite_fp16_scales_exact(kind):
    """Not only file-like magnitudes: any finite fp16 in the scale fields (subnormals, 65504) still matches."""
    rng = np.random.default_rng(2)
    raw = random_blocks(kind, ROWS, COLS, rng)
    blocks = raw.reshape(-1, BLOCK[kind][1])
    for at in SCALE_FIELDS[kind]:
        bits = rng.integers(0, 1 << 16, size=blocks.shape[0], dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16)  # no inf/nan
        bits[:4] = [0x0001, 0x8001, 0x7BFF, 0xFBFF]  # the smallest subnormals and the largest finite values
        blocks[:, at:at + 2] = bits.view(np.uint8).reshape(-1, 2)
    groups, ref = _decode(kind, raw)
    assert np.array_equal(groups.dequantize(), ref)


@pytest.mark.parametrize("kind", QUANTIZABLE)
def test_real_quantized_weights_exact(kind):
    rng = np.random.default_rng(3)
    weights = (rng.standard_normal((ROWS, COLS)) * 0.02).astype(np.float32)
    weights[0, :32] = 0.0  # an all-zero block: d = 0
    raw = quantize(weights, GGMLQuantizationType[kind])
    groups, ref = _decode(kind, raw)
    assert np.array_equal(groups.dequantize(), ref)
    assert np.abs(ref - weights).max() < 0.02  # these are real quantized weights, not noise


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS"])
def test_raw_shapes_row_slices_and_reader(kind, tmp_path):
    rows = 5
    raw = random_blocks(kind, rows, COLS, np.random.default_rng(4))
    ref = _reference(kind, raw, rows, COLS)
    # flat bytes, and a slice of rows of the mapped tensor
    assert np.array_equal(code_groups(kind, raw.ravel(), rows, COLS).dequantize(), ref)
    assert np.array_equal(code_groups(kind, raw[1:4], 3, COLS).dequantize(), ref[1:4])
    # the bytes as gguf.GGUFReader maps them from a file
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", raw, raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = gguf.GGUFReader(str(path)).tensors
    cols, rows_read = (int(n) for n in tensor.shape)
    assert (rows_read, cols) == (rows, COLS)
    assert np.array_equal(code_groups(tensor.tensor_type.name, tensor.data, rows, cols).dequantize(), ref)
    assert np.array_equal(code_groups(tensor.tensor_type, tensor.data, rows, cols).dequantize(), ref)


def test_wrong_mappings_are_caught():
    """The exactness check can fail: plausible wrong layouts or roundings differ from gguf somewhere."""
    rng = np.random.default_rng(5)
    # Q4_0 with interleaved nibbles (byte j = weights 2j, 2j+1, as some other formats pack them)
    raw = random_blocks("Q4_0", ROWS, COLS, rng)
    groups, ref = _decode("Q4_0", raw)
    pairs = groups.codes.reshape(ROWS, -1, 2, 16).transpose(0, 1, 3, 2).reshape(ROWS, COLS)
    assert not np.array_equal(groups._replace(codes=np.ascontiguousarray(pairs)).dequantize(), ref)
    # Q6_K with its group scales d * sc kept in fp16 (they need up to 18 significant bits)
    raw = random_blocks("Q6_K", ROWS, COLS, rng)
    groups, ref = _decode("Q6_K", raw)
    half = groups.scale.astype(np.float16).astype(np.float32)
    assert not np.array_equal(groups._replace(scale=half).dequantize(), ref)
    # Q3_K with its high bit read uninverted (q = low - 4 * bit; gguf: low - 4 * (1 - bit))
    raw = random_blocks("Q3_K", ROWS, COLS, rng)
    groups, ref = _decode("Q3_K", raw)
    flipped = np.where(groups.codes >= 0, groups.codes - 4, groups.codes + 4).astype(np.int8)
    assert not np.array_equal(groups._replace(codes=flipped).dequantize(), ref)
    # Q4_K's min added instead of subtracted
    raw = random_blocks("Q4_K", ROWS, COLS, rng)
    groups, ref = _decode("Q4_K", raw)
    assert not np.array_equal(groups._replace(offset=-groups.offset).dequantize(), ref)


@pytest.mark.parametrize("kind", KERNEL_TYPES)
def test_products_are_exact_so_regrouping_or_fusing_is_harmless(kind):
    """Every scale * code is exact in float32 (fp16 d: 11 significant bits, times <= 12 more), so gguf's
    order of multiplication cannot matter: Q6_K's d * (sc * q) equals (d * sc) * q, and a fused
    multiply-add (one rounding of scale * code + offset) equals the kernel's two roundings."""
    raw = random_blocks(kind, ROWS, COLS, np.random.default_rng(6))
    groups, ref = _decode(kind, raw)
    g = groups.group
    codes = groups.codes.reshape(ROWS, -1, g)
    exact = groups.scale.astype(np.float64)[:, :, None] * codes
    assert np.array_equal(groups.scale[:, :, None] * codes.astype(np.float32), exact)
    fused = exact if groups.offset is None else exact + groups.offset[:, :, None]
    assert np.array_equal(fused.astype(np.float32).reshape(ROWS, COLS), ref)
    if kind == "Q6_K":
        blocks = raw.reshape(-1, BLOCK[kind][1])
        d = np.ascontiguousarray(blocks[:, 208:210]).view(np.float16).astype(np.float32).reshape(ROWS, -1, 1, 1)
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32).reshape(ROWS, -1, 16, 1)
        regrouped = d * (sc * codes.reshape(ROWS, -1, 16, g).astype(np.float32))
        assert np.array_equal(regrouped.reshape(ROWS, COLS), ref)


def test_negated_subtrahend_is_ieee_subtraction():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(100_000) * np.exp(rng.uniform(-20, 20, 100_000))).astype(np.float32)
    b = (rng.standard_normal(100_000) * np.exp(rng.uniform(-20, 20, 100_000))).astype(np.float32)
    assert np.array_equal(a - b, a + (-b))


def test_errors_name_the_type_and_the_problem():
    raw = random_blocks("Q4_K", 2, 512, np.random.default_rng(8))
    with pytest.raises(ValueError, match="IQ2_XXS"):
        code_groups("IQ2_XXS", raw, 2, 512)
    with pytest.raises(ValueError, match=r"Q4_K.*500 weights.*256"):
        code_groups("Q4_K", raw, 2, 500)
    with pytest.raises(ValueError, match=r"Q4_K.*576 bytes.*3 x 512"):
        code_groups("Q4_K", raw, 3, 512)
    with pytest.raises(ValueError, match=r"Q8_0.*100 bytes"):
        code_groups("Q8_0", np.zeros(100, np.uint8), 1, 64)
