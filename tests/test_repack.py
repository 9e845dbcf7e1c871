"""The file's bytes straight into the kernel's layout (app/models/repack_numba.py, issue 45's load
time): every array the kernel reads equals, bit for bit, what the reference route (gguf_codes'
decoding, then CodeBlocks.fill) holds, so the weights stay gguf's own."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from app.bench.random_gguf import random_blocks
from app.models import int4_cpu_torch
from app.models.gguf_codes import code_groups
from app.models.int4_cpu_torch import CHUNK, REPACKED, CodeBlocks

pytestmark = pytest.mark.skipif(int4_cpu_torch.compiled() is None, reason="Tandem's CPU kernel does not run here")


def _arrays(blocks: CodeBlocks) -> dict[str, np.ndarray]:
    return {name: getattr(blocks, name) for name in CodeBlocks.ARRAYS}


def _reference(parts: list[tuple[int, str]], raws: list[np.ndarray], cols: int) -> CodeBlocks:
    blocks = CodeBlocks(sum(n for n, _ in parts), cols, parts)
    start = 0
    for (n, kind), raw in zip(parts, raws, strict=True):
        blocks.fill(start, code_groups(kind, raw, n, cols))
        start += n
    return blocks


@pytest.mark.parametrize("kind", sorted(REPACKED))
def test_each_type_is_laid_out_as_the_reference_lays_it(kind):
    rows, cols = 2 * CHUNK + 37, 512  # a last chunk only partly filled
    raw = random_blocks(kind, rows, cols, np.random.default_rng(7))
    reference = _reference([(rows, kind)], [raw], cols)
    direct = CodeBlocks(rows, cols, [(rows, kind)])
    assert direct.fill_file(0, kind, raw)
    for name, held in _arrays(reference).items():
        assert np.array_equal(getattr(direct, name), held), name
    # and what the kernel multiplies is gguf's own dequantization, exactly
    expected = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(rows, cols)
    assert np.array_equal(direct.dequantize(), expected.astype(np.float32))


def test_a_stack_of_types_fills_each_part_where_it_was_planned():
    """A fused gate/up or q/k/v of a mixed file: parts of different types side by side."""
    cols = 256
    parts = [(CHUNK, "Q4_K"), (CHUNK, "Q6_K"), (CHUNK + 5, "Q8_0")]
    rng = np.random.default_rng(3)
    raws = [random_blocks(kind, n, cols, rng) for n, kind in parts]
    reference = _reference(parts, raws, cols)
    direct = CodeBlocks(sum(n for n, _ in parts), cols, parts)
    start = 0
    for (n, kind), raw in zip(parts, raws, strict=True):
        assert direct.fill_file(start, kind, raw)
        start += n
    for name, held in _arrays(reference).items():
        assert np.array_equal(getattr(direct, name), held), name


def test_rows_of_another_type_than_planned_are_left_to_the_reference_route():
    cols = 256
    blocks = CodeBlocks(CHUNK, cols, [(CHUNK, "Q4_K")])
    before = {name: array.copy() for name, array in _arrays(blocks).items()}
    assert not blocks.fill_file(0, "Q6_K", random_blocks("Q6_K", CHUNK, cols, np.random.default_rng(1)))
    assert not blocks.fill_file(0, "Q4_0", random_blocks("Q4_0", CHUNK, cols, np.random.default_rng(1)))
    # not a chunk start
    assert not blocks.fill_file(5, "Q4_K", random_blocks("Q4_K", 8, cols, np.random.default_rng(1)))
    assert all(np.array_equal(getattr(blocks, name), array) for name, array in before.items())


def test_a_widened_scale_sends_a_plain_type_the_reference_way():
    """Q8_0's scales are copied as the file's fp16 bits: where an earlier part held a scale that is
    no half (so every scale is float32 now), the bits would be wrong, and the reference route fills."""
    cols = 64
    blocks = CodeBlocks(2 * CHUNK, cols, [(2 * CHUNK, "Q8_0")])
    blocks.widened()
    raw = random_blocks("Q8_0", CHUNK, cols, np.random.default_rng(2))
    assert not blocks.fill_file(0, "Q8_0", raw)


@pytest.mark.parametrize("kind", sorted(REPACKED))
def test_rows_as_float32_are_ggufs_own_dequantization_bit_for_bit(kind):
    """What the head's screen, its rescored rows and the int8-per-row layers read (float_rows),
    compiled, against gguf-py's dequantize: the same bits, every weight."""
    from app.models.int4_cpu_torch import float_rows

    rows, cols = 37, 512
    raw = random_blocks(kind, rows, cols, np.random.default_rng(11))
    expected = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).reshape(rows, cols)
    got = float_rows(kind, raw, cols)
    assert got is not None and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def test_bytes_that_are_not_whole_rows_never_reach_the_compiled_copies():
    """They check no bounds: a row of other length, or another dtype, goes the reference way."""
    from app.models.int4_cpu_torch import float_rows

    raw = random_blocks("Q4_K", CHUNK, 512, np.random.default_rng(4))
    assert float_rows("Q4_K", raw[:, :-1], 512) is None
    assert float_rows("Q4_K", raw, 256) is None
    assert float_rows("Q4_K", raw.view(np.int8), 512) is None
    blocks = CodeBlocks(CHUNK, 256, [(CHUNK, "Q4_K")])
    assert not blocks.fill_file(0, "Q4_K", raw)  # twice the row the weight was planned for


def test_a_q4_0_offset_no_half_holds_is_left_to_the_reference_route():
    """Q4_0's offset is -8 d: for |d| above 8,188 no half holds it, and the reference route widens
    the held offsets to float32; the compiled copy, which writes halves, must not run then."""
    cols = 64
    raw = random_blocks("Q4_0", CHUNK, cols, np.random.default_rng(5))
    raw.reshape(CHUNK, -1, 18)[3, 1, :2] = np.frombuffer(np.float16(9000.0).tobytes(), np.uint8)
    direct = CodeBlocks(CHUNK, cols, [(CHUNK, "Q4_0")])
    assert not direct.fill_file(0, "Q4_0", raw)
    with np.errstate(over="ignore"):  # the reference tries a half first, then widens
        reference = _reference([(CHUNK, "Q4_0")], [raw], cols)
    assert reference.offset.dtype == np.float32  # what the reference did with it
