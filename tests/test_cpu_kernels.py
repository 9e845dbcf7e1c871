"""Tandem's 4-bit CPU kernel (app/models/int4_cpu_torch.py, compiled by Numba) and the decoder
layers as one compiled call (app/engine/backends/compiled_layers_torch.py): the file's weights exactly,
the same bits for a token whatever the width of its pass, and the lean step's numbers."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP
from app.models import int4_cpu_torch
from app.bench.random_gguf import random_blocks
from app.models.gguf_blocks import int4_groups
from app.models.gguf_codes import KERNEL_TYPES, NIBBLES32, CodeGroups, Factors, code_groups
from app.models.int4_cpu_torch import CHUNK, CodeBlocks
from tests.test_gguf_own_precision import SUITE, _random_blocks, _speculative_answers

Q = gguf.GGMLQuantizationType

pytestmark = pytest.mark.skipif(bool(int4_cpu_torch.why_not_available()),
                                reason=f"the kernel does not run here: {int4_cpu_torch.why_not_available()}")


def _multiplied(x: np.ndarray) -> np.ndarray:
    """The activations the kernel multiplies for x: each token's int8 codes times their scales, float64."""
    xq, dx = int4_cpu_torch.quantized_activations(x)
    return (xq.reshape(x.shape[0], -1, 32) * dx[..., None].astype(np.float64)).reshape(x.shape)


def _blocks_of(kind: str, rows: int, cols: int, seed: int) -> tuple[CodeBlocks, np.ndarray]:
    raw = random_blocks(kind, rows, cols, np.random.default_rng(seed))
    blocks = CodeBlocks(rows, cols, [(rows, kind)])
    for start in range(0, rows, CHUNK):  # filled a chunk of rows at a time, as the loader does
        blocks.fill(start, code_groups(kind, raw[start:start + CHUNK], min(CHUNK, rows - start), cols))
    reference = gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(rows, cols).astype(np.float32)
    return blocks, reference


@pytest.mark.parametrize("kind", KERNEL_TYPES)
def test_the_kernel_holds_and_multiplies_the_files_weights(kind):
    from app.models.gguf_codes import FACTORED_TYPES, GROUP_OF, KIND_OF, OFFSET_TYPES

    blocks, reference = _blocks_of(kind, 2 * CHUNK, 512, seed=5)
    levels = 2 if kind in OFFSET_TYPES else 1
    if kind in FACTORED_TYPES:  # the file's two levels: an integer per group, an fp16 per 256 weights
        groups = 2 * CHUNK * 512 // GROUP_OF[KIND_OF[kind]]
        assert blocks.scale.size == 0 and blocks.small.size == groups * levels
        assert blocks.supers.size == 2 * CHUNK * 2 * levels
    else:  # the file's fp16 fields as halves
        assert blocks.scale.dtype == np.uint16 and blocks.small.size == blocks.supers.size == 0
    np.testing.assert_array_equal(blocks.dequantize(), reference)  # the file's weights, bit for bit
    x = np.random.default_rng(1).standard_normal((5, 512)).astype(np.float32)
    activations = _multiplied(x)
    expected = activations @ reference.T.astype(np.float64)
    got = blocks.matmul(x)
    assert got.dtype == np.float32 and got.shape == (5, 2 * CHUNK)
    # the file's weights times the int8 activations, integer sums exact, float32 the rest: within the
    # summation bound, n 2^-24 sum |w x| (Higham's gamma_n)
    bound = 512 * 2.0 ** -24 * (np.abs(activations) @ np.abs(reference).T.astype(np.float64))
    assert np.all(np.abs(got - expected) <= bound)
    # and the float32 activations' product within what rounding them to int8 moves: dx / 2 an activation
    dx = int4_cpu_torch.quantized_activations(x)[1]
    moved = (np.repeat(dx, 32, axis=1).astype(np.float64) / 2) @ np.abs(reference).T.astype(np.float64)
    assert np.all(np.abs(got - x.astype(np.float64) @ reference.T.astype(np.float64)) <= moved + bound)
    swapped, _ = _blocks_of(kind, 2 * CHUNK, 512, seed=6)  # the check can fail
    assert np.abs(swapped.matmul(x) - expected).max() > 0.1 * np.abs(expected).max()


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "IQ4_XS", "Q3_K", "Q2_K"])
def test_every_width_gives_each_token_the_bits_one_token_gives(kind):
    """Batch invariance: a verify pass of n tokens and n one-token steps agree bit for bit, through
    every register tile (up to 6 tokens, any mix of them up to 17) and the one-token step that
    decodes its codes in registers (speculation is exact only if they do), for 4-bit codes and
    int8 codes in groups of 32 and 16; a last chunk of rows only partly filled included."""
    blocks, reference = _blocks_of(kind, 3 * CHUNK - 24, 256, seed=8)
    x = np.random.default_rng(2).standard_normal((17, 256)).astype(np.float32)
    alone = np.stack([blocks.matmul(x[i:i + 1])[0] for i in range(17)])
    expected = _multiplied(x) @ reference.T.astype(np.float64)
    assert np.abs(alone - expected).max() <= 1e-5 * np.abs(expected).max()  # the step itself is right
    for width in range(1, 18):
        np.testing.assert_array_equal(blocks.matmul(np.ascontiguousarray(x[:width])), alone[:width])


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q3_K", "Q2_K"])
def test_two_three_five_and_six_bit_codes_are_held_at_the_files_size_and_their_extremes_multiply_exactly(kind):
    """The 2-, 3-, 5- and 6-bit types keep their codes packed as the file has them (0.25, 0.375,
    0.625 and 0.75 bytes a weight, not a byte), planes that unpack to the very codes; and the
    integer sums at their extremes (every stored code at 0 or at its top, activations of +-127,
    where a 16-bit partial sum comes closest to its limit) come out exact: the kernel's sum of
    code x 127 over the row. Q3_K's neighbouring groups share a word of third bits, so a row of
    alternating groups (one at the top, the next at 0) must keep them apart."""
    from app.models.gguf_codes import BIAS_OF, GROUP_OF, KIND_OF
    from app.models.int4_cpu_torch import CODE_BITS, PACKING

    kind_code, cols = KIND_OF[kind], 512
    bits, length, bias = CODE_BITS[kind_code], GROUP_OF[kind_code], BIAS_OF[kind]
    stored = np.random.default_rng(4).integers(0, 1 << bits, (3, 8, length), dtype=np.uint8)
    pack, unpack = PACKING[kind_code]
    packed = pack(stored)
    assert packed.size == stored.size * bits // 8
    np.testing.assert_array_equal(unpack(packed), stored)
    blocks, _ = _blocks_of(kind, 2 * CHUNK, cols, seed=3)
    assert blocks.codes.nbytes == 2 * CHUNK * cols * bits // 8
    top = (1 << bits) - 1
    alternating = np.tile(np.repeat([top, 0], length), cols // (2 * length)) - bias
    rows = (np.full((CHUNK, cols), -bias), np.full((CHUNK, cols), top - bias), alternating[None].repeat(CHUNK, 0))
    for codes in rows:
        codes = codes.astype(np.int8)
        ones = np.ones((CHUNK, cols // length), np.float32)
        weight = CodeBlocks(CHUNK, cols, [(CHUNK, kind)])
        if kind in ("Q5_K", "Q6_K", "Q3_K", "Q2_K"):  # two levels: d = 1 per 256 weights, sc = 1 (and m = 0)
            levels = 2 if kind in ("Q5_K", "Q2_K") else 1
            supers = np.zeros((CHUNK, cols // 256, levels), np.float32)
            supers[..., 0] = 1
            smalls = np.zeros((CHUNK, cols // length, levels), np.int8)
            smalls[..., 0] = 1
            groups = CodeGroups(kind_code, codes, ones, -0 * ones if levels == 2 else None, Factors(supers, smalls))
        else:
            groups = CodeGroups(kind_code, codes, ones, 0 * ones if kind == "Q5_1" else None)
        weight.fill(0, groups)
        np.testing.assert_array_equal(weight.dequantize(), codes.astype(np.float32))
        for sign in (1, -1):
            got = weight.matmul(np.full((3, cols), sign * 127, np.float32))
            assert np.all(got == sign * 127 * int(codes[0].astype(np.int64).sum())), (codes[0, :2], sign, got[0, :4])
        if codes[0, 0] != codes[0, -1]:  # each group alone: only its own third bits count
            x = np.zeros((2, cols), np.float32)
            for g in range(cols // length):
                x[:] = 0
                x[:, g * length:(g + 1) * length] = 127
                assert np.all(weight.matmul(x) == 127 * length * int(codes[0, g * length])), g
    with pytest.raises(ValueError, match=f"{bits}-bit"):  # a code the kind cannot hold
        CodeBlocks(CHUNK, cols, [(CHUNK, kind)]).fill(0, groups._replace(codes=codes + np.int8(1 << bits)))


@pytest.mark.parametrize("kind", ["IQ4_NL", "IQ4_XS"])
def test_iq4_indices_are_held_as_the_file_holds_them_and_every_grid_value_multiplies_exactly(kind):
    """IQ4's 4-bit indices stay packed two a byte (0.5 bytes a weight, where their int8 grid values
    took 1), each looked up in the kernel: a row of each grid value times activations of +-127
    gives exactly 127 x 32 x the value (the largest pairs, 2 x 127 x 127, come close to int16's
    limit), and a value off the grid is refused."""
    from app.models.gguf_codes import GROUP_OF, IQ4_KVALUES, KIND_OF

    blocks, _ = _blocks_of(kind, 2 * CHUNK, 512, seed=3)
    assert blocks.codes.nbytes == 2 * CHUNK * 512 // 2
    kind_code, cols = KIND_OF[kind], 32 * 16
    codes = np.repeat(IQ4_KVALUES, 32)[None, :].repeat(CHUNK, axis=0)  # group g: grid value g
    ones = np.ones((CHUNK, cols // GROUP_OF[kind_code]), np.float32)
    factors = None
    if kind == "IQ4_XS":  # d = 1 per 256 weights, ls - 32 = 1 per group
        factors = Factors(np.ones((CHUNK, cols // 256, 1), np.float32), np.ones((CHUNK, cols // 32, 1), np.int8))
    weight = CodeBlocks(CHUNK, cols, [(CHUNK, kind)])
    weight.fill(0, CodeGroups(kind_code, codes, ones, None, factors))
    for sign in (1, -1):
        x = np.zeros((2, cols), np.float32)
        for g in range(16):  # one group's activations at a time: the product is that value's
            x[:] = 0
            x[:, 32 * g:32 * (g + 1)] = sign * 127
            assert np.all(weight.matmul(x) == sign * 127 * 32 * int(IQ4_KVALUES[g])), (g, sign)
    off = codes.copy()
    off[0, 0] = 0  # not a grid value
    with pytest.raises(ValueError, match="grid"):
        CodeBlocks(CHUNK, cols, [(CHUNK, kind)]).fill(0, CodeGroups(kind_code, off, ones, None, factors))


def test_each_tokens_activations_are_quantized_alone_as_written_in_numpy():
    """The compiled quantization (what the products multiply) is int4_cpu_torch's numpy rule bit for
    bit, on rows with ties at .5, zeros, a block too small to scale, a huge value, a NaN and an
    infinity; a block's codes are within 127 and its values dx * xq within dx / 2 of the
    activations; a row's result does not depend on the rows beside it; a NaN or an infinity makes
    its block's products NaN, not others'."""
    compiled = int4_cpu_torch.compiled()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1, :32] = 0  # an all-zero block: scale 0, codes 0
    x[1, 32:64] *= np.float32(1e-38)  # 1 / scale overflows: taken as zeros
    x[2, :32] = np.arange(32, dtype=np.float32) * 4 - 62.5  # scale 1 (max 127 at the end): halves
    x[2, 31] = 127  # every other value a tie, rounded to even
    x[2, 32:64] *= 1e30
    x[3, 5], x[4, 40] = np.nan, np.inf
    reference_q, reference_d = int4_cpu_torch.quantized_activations(x)
    xq, dx, sx32, sx16, xs32, xs16 = compiled.activations(x)
    np.testing.assert_array_equal(xq, reference_q)
    np.testing.assert_array_equal(dx, reference_d)  # NaN where a block holds a NaN or an infinity
    assert np.isnan(dx[3, 0]) and np.isnan(dx[4, 1]) and np.isfinite(dx[3, 1:]).all() and dx[1, 0] == dx[1, 1] == 0
    assert dx[2, 0] == 1 and np.array_equal(xq[2, :4], [-62, -58, -54, -50])  # -62.5 -> -62, -58.5 -> -58
    assert not xq[1, 32:64].any()
    assert np.abs(xq.astype(np.int32)).max() <= 127
    blocks = xq.reshape(6, 3, 32).astype(np.float64)
    np.testing.assert_array_equal(sx32, (dx * blocks.sum(axis=2)).astype(np.float32))
    np.testing.assert_array_equal(sx16[:, 0::2], (dx * blocks[..., :16].sum(axis=2)).astype(np.float32))
    np.testing.assert_array_equal(sx16[:, 1::2], (dx * blocks[..., 16:].sum(axis=2)).astype(np.float32))
    # the integer sums the packed codes' bias takes away
    np.testing.assert_array_equal(xs32, blocks.sum(axis=2))
    np.testing.assert_array_equal(xs16[:, 0::2], blocks[..., :16].sum(axis=2))
    np.testing.assert_array_equal(xs16[:, 1::2], blocks[..., 16:].sum(axis=2))
    fine = np.isfinite(dx) & (dx > 0)
    assert np.abs(x.reshape(6, 3, 32)[dx == 0]).max() < 4e-37  # only the zero and the tiny block
    moved = np.abs(blocks * dx[..., None] - x.reshape(6, 3, 32))[fine]
    assert np.all(moved <= (dx[fine] / 2 * (1 + 1e-6))[:, None])
    alone = compiled.activations(np.ascontiguousarray(x[5:6]))
    np.testing.assert_array_equal(alone[0][0], xq[5])
    weight, _ = _blocks_of("Q8_0", CHUNK, 96, seed=4)
    y = weight.matmul(x)
    assert np.isnan(y[3]).all() and np.isnan(y[4]).all() and np.isfinite(y[[0, 1, 2, 5]]).all()


_PORTABLE_RUN = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from tests.test_cpu_kernels import _blocks_of
from app.models import int4_cpu_torch, int8_tiles_numba
assert not int8_tiles_numba.AVX2
x = np.random.default_rng(7).standard_normal((7, 256)).astype(np.float32)
kinds = ("Q4_K", "Q8_0", "Q6_K", "Q5_0", "IQ4_NL", "Q3_K", "Q2_K")
np.save(sys.argv[1], np.stack([_blocks_of(kind, 2 * 64, 256, seed=11)[0].matmul(x) for kind in kinds]))
"""


def test_the_portable_build_of_the_products_gives_the_same_bits(tmp_path):
    """Where a CPU has no AVX2 the integer dot products are plain LLVM vector code: the same sums,
    since none saturates, so the same bits as the x86 build (built here in a process of its own, in
    a cache folder of its own), for 4-bit codes (wide and narrow codes near the bounds included)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from app.models import int8_tiles_numba

    if not int8_tiles_numba.AVX2:
        pytest.skip("this CPU runs the portable build already")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, TANDEM_INT8_PORTABLE="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", _PORTABLE_RUN.format(root=root), str(tmp_path / "out.npy")], env=env,
                   check=True, timeout=600)
    x = np.random.default_rng(7).standard_normal((7, 256)).astype(np.float32)
    kinds = ("Q4_K", "Q8_0", "Q6_K", "Q5_0", "IQ4_NL", "Q3_K", "Q2_K")
    here = np.stack([_blocks_of(kind, 2 * CHUNK, 256, seed=11)[0].matmul(x) for kind in kinds])
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), here)


def test_a_named_cpu_without_avx2_gets_the_portable_products():
    """NUMBA_CPU_NAME / NUMBA_CPU_FEATURES (Numba's portable caches) decide, not this machine: LLVM
    cannot build AVX2's intrinsics for a CPU without them."""
    import os
    import subprocess
    import sys

    ask = "from app.models import int8_tiles_numba; print(int8_tiles_numba.AVX2)"
    for env, expected in (({"NUMBA_CPU_NAME": "generic"}, "False"),
                          ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma"}, "True")):
        done = subprocess.run([sys.executable, "-c", ask], env=dict(os.environ, **env), capture_output=True,
                              text=True, timeout=120, check=True)
        assert done.stdout.strip() == expected, (env, done.stdout, done.stderr)


def test_a_stack_of_parts_of_different_types_is_one_product():
    """Q4_K_M's q/k/v: q and k Q4_K, v Q6_K in some layers; each part's rows as its own type."""
    rng = np.random.default_rng(9)
    parts = [("Q4_K", CHUNK), ("Q4_K", CHUNK), ("Q6_K", 2 * CHUNK), ("Q8_0", CHUNK)]
    raws = [random_blocks(kind, rows, 512, rng) for kind, rows in parts]
    blocks = CodeBlocks(5 * CHUNK, 512, [(rows, kind) for kind, rows in parts])
    at = 0
    for (kind, rows), raw in zip(parts, raws, strict=True):
        blocks.fill(at, code_groups(kind, raw, rows, 512))
        at += rows
    reference = np.concatenate([gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(rows, 512)
                                for (kind, rows), raw in zip(parts, raws, strict=True)])
    np.testing.assert_array_equal(blocks.dequantize(), reference)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    alone = np.stack([blocks.matmul(x[i:i + 1])[0] for i in range(7)])
    np.testing.assert_array_equal(blocks.matmul(x), alone)
    expected = _multiplied(x) @ reference.T.astype(np.float64)
    assert np.abs(alone - expected).max() <= 1e-5 * np.abs(expected).max()
    with pytest.raises(ValueError, match="planned for other codes"):  # a part filled with the wrong type
        blocks.fill(0, code_groups("Q8_0", raws[3], CHUNK, 512))


def test_a_scale_that_is_no_half_widens_what_was_held_without_changing_it():
    rows, cols = 2 * CHUNK, 64
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    halves = rng.random((rows, 2), dtype=np.float32).astype(np.float16).astype(np.float32)
    blocks = CodeBlocks(rows, cols, [(rows, "Q4_1")])
    blocks.fill(0, CodeGroups(NIBBLES32, codes[:CHUNK], halves[:CHUNK], -8 * halves[:CHUNK]))
    assert blocks.scale.dtype == np.uint16
    odd = halves[CHUNK:] * np.float32(1.0001)  # not representable as halves
    blocks.fill(CHUNK, CodeGroups(NIBBLES32, codes[CHUNK:], odd, -8 * odd))
    assert blocks.scale.dtype == np.float32
    scale = np.concatenate([halves[:CHUNK], odd])
    expected = CodeGroups(NIBBLES32, codes, scale, -8 * scale)
    np.testing.assert_array_equal(blocks.dequantize(), expected.dequantize())


def test_turned_off_it_says_so_and_pytorchs_kernel_runs(monkeypatch):
    from app.models.gguf_layers_torch import GGUFInt4Linear

    monkeypatch.setattr(int4_cpu_torch, "_COMPILED", None)
    monkeypatch.setattr(int4_cpu_torch, "_WHY_NOT", None)
    monkeypatch.setenv("TANDEM_INT4_KERNEL", "off")
    assert int4_cpu_torch.why_not_available() == "turned off by TANDEM_INT4_KERNEL"
    assert "does not run here: turned off" in int4_cpu_torch.int4_kernel_words()
    raw = _random_blocks("Q4_1", 64, 128, seed=3)
    layer = GGUFInt4Linear.from_groups(int4_groups("Q4_1", raw, 64, 128), torch.bfloat16)
    assert layer.packed.shape == (64, 64) and "PyTorch's kernel" in repr(layer)


# The decoder layers as one compiled call, on a model whose projections are GGUF codes ------------

def _codes(weight: torch.Tensor, kind: str) -> CodeGroups:
    """A float weight as the codes of a GGUF type's kind: "Q4_1" 4-bit codes in groups of 32 with
    an fp16 scale and minimum; "Q5_1" 5-bit ones (int8 codes, groups of 32, scale and minimum);
    "Q6_K" signed 6-bit ones in groups of 16, scaled in two levels (an fp16 d per 256 weights
    times an int8 per group)."""
    from app.models.gguf_codes import GROUP_OF, KIND_OF, Factors

    length = GROUP_OF[KIND_OF[kind]]
    w = weight.detach().numpy().reshape(weight.shape[0], -1, length)
    half = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    if kind == "Q8_0":
        d = half(np.abs(w).max(-1) / 127)
        codes = np.clip(np.round(w / np.where(d == 0, 1, d)[..., None]), -127, 127).astype(np.int8)
        return CodeGroups(KIND_OF[kind], codes.reshape(weight.shape), d, None)
    if kind == "Q6_K":
        rows, groups = w.shape[:2]
        amax = np.abs(w).max(-1)  # (rows, groups)
        d = half(amax.reshape(rows, -1, 16).max(-1) / (31 * 127))  # (rows, supers)
        sc = np.clip(np.round(amax / 31 / np.repeat(d, 16, axis=1)), -128, 127).astype(np.int8)
        scale = np.repeat(d, 16, axis=1) * sc.astype(np.float32)
        codes = np.clip(np.round(w / np.where(scale == 0, 1, scale)[..., None]), -32, 31).astype(np.int8)
        return CodeGroups(KIND_OF[kind], codes.reshape(weight.shape), scale, None,
                          Factors(d[..., None], sc[..., None]))
    top = 15 if kind == "Q4_1" else 31
    low, high = w.min(-1), w.max(-1)
    d, m = half((high - low) / top), half(low)
    codes = np.clip(np.round((w - m[..., None]) / d[..., None]), 0, top).astype(np.uint8 if top == 15 else np.int8)
    return CodeGroups(KIND_OF[kind], codes.reshape(weight.shape), d, m)


def _quantized(model: torch.nn.Module, mixed: bool = False) -> torch.nn.Module:
    """`model` with every projection on Tandem's kernel, q/k/v and gate/up stacked as the GGUF
    loader stacks them: all Q4_1-like codes, or `mixed` as a K-quant preset mixes them (v as 8-bit
    codes and down as Q6_K's two-level 6-bit ones on every other layer, gate/up's up part and o in
    5-bit groups of 32)."""
    from app.models.fused_projections_torch import GROUPS, install
    from app.models.gguf_layers_torch import GGUFCodesLinear

    def layer_of(weights: list[torch.Tensor], kinds: list[str]) -> GGUFCodesLinear:
        rows, cols = sum(w.shape[0] for w in weights), weights[0].shape[1]
        layer = GGUFCodesLinear(rows, cols, [(w.shape[0], kind) for w, kind in zip(weights, kinds, strict=True)])
        at, i = 0, 0
        while i < len(weights):  # parts of one kind are filled together (a part may be under a chunk)
            j = i + 1
            while j < len(weights) and kinds[j] == kinds[i]:
                j += 1
            layer.fill(at, _codes(torch.cat(weights[i:j]), kinds[i]))
            at += sum(w.shape[0] for w in weights[i:j])
            i = j
        return layer

    for i, layer in enumerate(model.model.layers):
        more_bits = mixed and i % 2 == 0
        kinds = {"q_proj": "Q4_1", "k_proj": "Q4_1", "v_proj": "Q8_0" if more_bits else "Q4_1",
                 "gate_proj": "Q4_1", "up_proj": "Q5_1" if mixed else "Q4_1",
                 "o_proj": "Q5_1" if mixed else "Q4_1", "down_proj": "Q6_K" if more_bits else "Q4_1"}
        for attr, parts in GROUPS.items():
            owner = getattr(layer, attr)
            install(owner, parts, layer_of([getattr(owner, part).weight for part in parts], [kinds[p] for p in parts]))
        layer.self_attn.o_proj = layer_of([layer.self_attn.o_proj.weight], [kinds["o_proj"]])
        layer.mlp.down_proj = layer_of([layer.mlp.down_proj.weight], [kinds["down_proj"]])
    return model


def _tiny(kind: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(4)
    shape = dict(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    if kind == "wide-group":  # 8 query heads a KV head: more than one attention tile of 6 queries
        shape.update(num_attention_heads=8, num_key_value_heads=1)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=32, **shape))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return _quantized(model.eval(), mixed=kind == "mixed")


@pytest.mark.parametrize("kind", ["llama", "qwen3", "wide-group", "mixed"])
@torch.inference_mode()
def test_the_compiled_layers_compute_what_the_lean_step_and_transformers_compute(kind):
    from app.engine.backends.lean_step_torch import LeanStep

    model = _tiny(kind)
    lean = LeanStep(model)
    assert lean.native is not None, lean.native_note
    ids = torch.tensor([[(7 + 31 * i) % 300 for i in range(24)]])
    results = {}
    for body in ("native", "pytorch"):
        native = lean.native
        if body == "pytorch":
            lean.native = None  # the lean step's PyTorch body, on the same 4-bit kernel per product
        kv = lean.new_cache()
        prefill = lean.forward(ids[:, :16], kv, 16, hidden=True)
        kv.appended(16)
        verify = lean.forward(ids[:, 16:], kv, 8, hidden=True)
        results[body] = (prefill, verify)
        lean.native = native
    reference = model(ids).logits[0].float()  # transformers' forward over the same modules

    def near(a, b):
        """Every product quantizes its activations to int8, so where two bodies round a norm or a
        softmax differently by an ulp, an activation may round to the next code (dx / 2 away): the
        three agree to about 1% (measured: bit for bit on Llama, 0.9-1.2% on the mean with Qwen3's
        q/k norms), where a wrong wire (no RoPE, a wrong head, a missed norm) moves everything."""
        return (a - b).abs().max() <= 5e-2 * b.abs().max() and (a - b).abs().mean() <= 3e-2 * b.abs().mean()

    for (logits, hidden), (torch_logits, torch_hidden) in zip(results["native"], results["pytorch"], strict=True):
        assert near(hidden, torch_hidden) and near(logits, torch_logits)
    logits = torch.cat([results["native"][0][0], results["native"][1][0]])
    assert near(logits, reference)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("kind", ["llama", "wide-group", "mixed"])
@torch.inference_mode()
def test_a_verify_pass_gives_each_token_the_bits_of_its_own_step(kind):
    """The final norm's output, bit for bit (the head after it is the model's own: a GGUF's
    screened head keeps the property, the tiny model's float32 Linear need not); 20 positions,
    so attention takes whole blocks of 8 keys and a remainder."""
    from app.engine.backends.lean_step_torch import LeanStep

    lean = LeanStep(_tiny(kind))
    ids = torch.tensor([[(5 + 17 * i) % 300 for i in range(20)]])
    kv = lean.new_cache()
    lean.forward(ids[:, :12], kv, 1)
    kv.appended(12)
    _, verify = lean.forward(ids[:, 12:], kv, 8, hidden=True)
    steps = []
    for i in range(12, 20):
        _, hidden = lean.forward(ids[:, i:i + 1], kv, 1, hidden=True)
        kv.appended(1)
        steps.append(hidden)
    assert torch.equal(verify, torch.cat(steps))


def test_why_the_compiled_layers_do_not_run_is_said():
    from app.engine.backends.lean_step_torch import LeanStep
    from tests.factories import tiny_llama

    lean = LeanStep(tiny_llama(3))  # float32 Linear layers: no 4-bit kernel
    assert lean.native is None
    assert lean.native_note == "not every projection is a GGUF weight on the compiled kernel"


@pytest.fixture(scope="module")
def wide_q4(tmp_path_factory, tiny_fields):
    """A tiny Llama as a Q4_1 GGUF whose every projection has whole chunks of rows (the compiled
    layers run it); the embedding Q8_0."""
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    root = tmp_path_factory.mktemp("wide_q4")
    model = tiny_llama(seed=23, hidden=128, heads=4, kv_heads=2)
    write_gguf(model, root / "m.gguf", tiny_fields, Q.Q4_1, embedding_qtype=Q.Q8_0)
    return import_gguf(root / "m.gguf", root / "import", mlx_variants=())["hf"]


def test_on_the_compiled_layers_speculation_writes_exactly_what_the_target_writes_alone(wide_q4):
    """Token for token, with no near-tie allowance: every pass is batch invariant on this path."""
    from app.runner import Runner

    answers = {}
    for draft in (PROMPT_LOOKUP, NO_DRAFT):
        runner = Runner()
        loaded = runner.load(wide_q4, "torch", draft=draft, precision="gguf", progress=lambda m: None)
        assert "decoder layers as one compiled call" in loaded.dtype
        answers[draft] = _speculative_answers(runner, SUITE[5:7], max_tokens=80)  # copy prompts: long drafts
    assert sum(len(tokens) for _, tokens in answers[PROMPT_LOOKUP]) >= 120
    assert answers[PROMPT_LOOKUP] == answers[NO_DRAFT]


@pytest.mark.parametrize("file_type", ["Q3_K_M", "Q2_K"])
def test_a_two_or_three_bit_preset_runs_packed_as_one_compiled_call_and_speculates_exactly(tmp_path, file_type):
    """llama.cpp's Q3_K_M and Q2_K presets (random blocks at its per-tensor types: Q3_K or Q2_K
    beside Q4_K / Q5_K by layer, the tied head Q6_K): every projection on the kernel, the 2- and
    3-bit codes held packed (`models info`'s words), the decoder layers one compiled call, and
    speculation token for token what the target writes alone."""
    from app.bench.gguf_model_files import LlamaShape, write_random_llama
    from app.engine.events import Round
    from app.engine.sampling import SamplingParams
    from app.models.gguf_import import import_gguf
    from app.runner import ChatRequest, Runner
    from tests.test_gguf_gpu_layers import VOCAB

    shape = LlamaShape("tiny", hidden=256, layers=3, heads=4, kv_heads=2, head_dim=64, intermediate=512, tied=True)
    types = write_random_llama(tmp_path / "m.gguf", shape, file_type, np.random.default_rng(9), tokenizer=VOCAB)
    low = "Q3_K" if file_type == "Q3_K_M" else "Q2_K"
    assert types["blk.1.attn_q.weight"] == low and types["token_embd.weight"] == "Q6_K"
    assert {types[f"blk.{i}.attn_v.weight"] for i in range(3)} == ({"Q5_K", "Q4_K"} if low == "Q3_K" else {"Q3_K"})
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "import", mlx_variants=())["hf"]
    answers, widest = {}, 0
    for draft in (PROMPT_LOOKUP, NO_DRAFT):
        runner = Runner()
        loaded = runner.load(folder, "torch", draft=draft, precision="gguf", progress=lambda m: None)
        assert "decoder layers as one compiled call" in loaded.dtype
        assert ("int3 g16 from Q3_K" if low == "Q3_K" else "int2 g16 from Q2_K") in loaded.dtype
        answers[draft] = []
        for prompt in ("a1 b2 a1 b2 a1 b2 a1 b2", "abc abc abc abc"):
            request = ChatRequest(({"role": "user", "content": prompt},), max_tokens=40,
                                  params=SamplingParams(temperature=0.0))
            rounds = [event for event in runner.chat(request) if isinstance(event, Round)]
            answers[draft].append([t for r in rounds for t in r.emitted])
            widest = max([widest] + [len(r.emitted) for r in rounds])
    assert answers[PROMPT_LOOKUP] == answers[NO_DRAFT]
    assert widest > 1  # some verify pass took more than one token


def test_the_first_gguf_load_of_a_process_says_it_prepares_the_kernel(tiny_q4, monkeypatch):
    from app.engine.backends.torch_backend import TorchBackend

    monkeypatch.setattr(int4_cpu_torch, "_COMPILED", None)  # as in a fresh process
    monkeypatch.setattr(int4_cpu_torch, "_WHY_NOT", None)
    said: list[str] = []
    TorchBackend(tiny_q4[0], precision="gguf", progress=said.append)
    assert any("CPU kernel for GGUF weights" in message for message in said)
    said.clear()
    TorchBackend(tiny_q4[0], precision="gguf", progress=said.append)  # decided: nothing to say
    assert not any("CPU kernel for GGUF weights" in message for message in said)


def test_the_cache_folder_follows_both_compiled_modules(tmp_path, monkeypatch):
    """Numba keys a cached function on its own file only: an edit of the tiles' module alone must
    still give the kernels a fresh cache folder, or stale code would run."""
    import shutil
    from pathlib import Path

    here = Path(int4_cpu_torch.__file__).resolve().parent
    for name in ("kernels_numba.py", "kernel_tiles_numba.py", "repack_numba.py"):
        shutil.copy(here / name, tmp_path / name)
    monkeypatch.setattr(int4_cpu_torch, "__file__", str(tmp_path / "int4_cpu_torch.py"))
    before = int4_cpu_torch._sources_version()
    assert before == int4_cpu_torch._sources_version()
    with open(tmp_path / "kernel_tiles_numba.py", "a") as f:
        f.write("# edited\n")
    edited = int4_cpu_torch._sources_version()
    assert edited != before
    with open(tmp_path / "repack_numba.py", "a") as f:  # the repacking's own cached functions too
        f.write("# edited\n")
    assert int4_cpu_torch._sources_version() != edited


def test_an_earlier_versions_cache_folder_goes_after_a_day_and_nothing_else(tmp_path):
    import os
    import time

    now = time.time()
    folders = {"aaaaaaaaaaaa": now - 3 * 86400, "bbbbbbbbbbbb": now - 3600, "cccccccccccc": now - 3 * 86400,
               "not-a-version": now - 3 * 86400}
    for name, when in folders.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.nbi").write_bytes(b"x")
        os.utime(tmp_path / name / "index.nbi", (when, when))
        os.utime(tmp_path / name, (when, when))
    os.utime(tmp_path / "aaaaaaaaaaaa" / "index.nbi", (now - 60, now - 60))  # written a minute ago: in use
    removed = int4_cpu_torch.prune_versions(tmp_path, keep="cccccccccccc", now=now)
    assert removed == []  # the kept version stays however old; the rest are recent or not ours
    os.utime(tmp_path / "aaaaaaaaaaaa" / "index.nbi", (now - 2 * 86400, now - 2 * 86400))
    assert int4_cpu_torch.prune_versions(tmp_path, keep="cccccccccccc", now=now) == ["aaaaaaaaaaaa"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["bbbbbbbbbbbb", "cccccccccccc", "not-a-version"]
    assert int4_cpu_torch.prune_versions(tmp_path / "missing", keep="cccccccccccc") == []


def test_the_compiled_exp_is_within_2_ulp_where_attention_and_silu_use_it():
    """kernels_numba._exp (Cephes' expf, vectorizable) against e^x in float64: attention's
    weights take x <= 0, SiLU's gate any x; 0 far below, no inf or NaN above."""
    from numba import njit

    kernels = int4_cpu_torch.compiled()
    exp = kernels._exp

    @njit(fastmath=True)  # as its callers are compiled: _exp must keep its own flags inside them
    def apply(x, out):
        for i in range(x.shape[0]):
            out[i] = exp(x[i])

    x = np.concatenate([np.linspace(-87.0, 88.0, 400_001), [-1e4, -200.0, 0.0, 200.0]]).astype(np.float32)
    out = np.empty_like(x)
    apply(x, out)
    ref = np.exp(x[:-4].astype(np.float64))
    ulp = np.abs(out[:-4] - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 2.0, ulp.max()
    assert out[-4] == 0.0 and out[-3] == 0.0 and out[-2] == 1.0
    assert np.isfinite(out[-1]) and out[-1] > 1e38


def test_a_gguf_load_says_which_layer_it_reads_and_when_it_prepares_the_compiled_call(wide_q4):
    """What the window's status line and the CLI show while a model loads, in order."""
    from app.engine.backends.torch_backend import TorchBackend

    said: list[str] = []
    TorchBackend(wide_q4, precision="gguf", progress=said.append)
    reading = [m for m in said if m.startswith("Reading the weights of m: layer ")]
    assert reading and reading[0] == "Reading the weights of m: layer 1 of 2 ..."
    assert said.index("Preparing the decoder layers' compiled call ...") > said.index(reading[-1])
