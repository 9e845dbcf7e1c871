"""The products' register tiles: a group of a chunk's weights times int8 activations, with integer
dot products (llama.cpp's route on x86: pmaddubsw, then pmaddwd), written out as LLVM vector code.

Why integers: on a 2-core CPU a float32 pass spends more on turning each 4-bit code into a float
(a mask or shift, a conversion) than on its multiply-add, and a wide verify pass multiplies every
weight by every token. With each token's activations quantized to int8 (int4_cpu_torch.py says
how), one pmaddubsw multiplies 32 codes by 32 activations and adds them in pairs, and a 4-bit code
is used as the byte it already is. Measured on a 16,384 x 2,048 Q4_1 weight (2 threads): 0.75 ms
against 1.08 ms for one token, 1.29 against 2.42 for four.

The layout (CodeBlocks): within a chunk of 64 rows and a group of 16 or 32 weights, the group's
code bytes in "quads": [quad][row][4 bytes], quad q holding bytes 4q..4q+3 of every row. A 32-byte
load is then 8 rows x 4 consecutive bytes, and one broadcast of a token's 4 activations serves
them all: the lanes run over rows (8 per vector), as in the usual AVX2 GEMM micro-kernel, and a
tile of T tokens x V vectors keeps its T x V sums in registers while each code vector loaded serves
the T tokens. For 4-bit codes byte j holds weight j (low nibble) and weight j + 16 (high).

Exactness: integer sums are exact, so the order within a group cannot matter; the group's float
epilogue, acc += fmuladd(scale * dx, isum, offset * sx) (sx: the token's quantized activations of
the group summed, times dx), is the same operations in every tile. A pass of any width gives a
token bit for bit what a one-token step gives it. No sum can saturate: |activation| <= 127, a
4-bit code <= 15, so a 4-bit group's 16-bit partial sums stay within 32 x 15 x 127 = 60,960 split
in two halves of 30,480 (accumulated 8 pmaddubsw at a time, under 32,767); an int8 code's products
are formed as |w| x (x signed by w), within 2 x 128 x 127 = 32,512 a pair, and widened at once.

Where the CPU has no AVX2 the same integer arithmetic is written in plain LLVM vector operations
(LLVM picks the target's instructions): the same sums, bit for bit, because none saturates.
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from app.models.gguf_codes import IQ4_KVALUES
from app.models.kernel_tiles_numba import module_prefetch

CHUNK = 64  # rows a chunk holds
LANES = 8  # rows a vector holds (one 32-bit sum per row)
QUAD = 4  # consecutive code bytes of a row side by side
I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
BYTES, WORDS, SUMS, FLOATS = (ir.VectorType(I8, 32), ir.VectorType(I16, 16), ir.VectorType(I32, LANES),
                              ir.VectorType(F32, LANES))


def _x86_integer_dots() -> bool:
    """Whether the CPU Numba builds for has AVX2's integer dot products: this machine's, unless
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name another (Numba's way to build portable caches: then
    AVX2 only where the named features say +avx2, since LLVM cannot build AVX2's intrinsics for a
    CPU without them). TANDEM_INT8_PORTABLE=1 builds the plain vector code instead (tests compare
    the two)."""
    if os.environ.get("TANDEM_INT8_PORTABLE", "") == "1":
        return False
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return "+avx2" in (config.CPU_FEATURES or "").split(",")
    import llvmlite.binding as llvm

    try:
        return bool(llvm.get_host_cpu_features().get("avx2"))
    except RuntimeError:  # a CPU LLVM cannot describe: the portable code
        return False


AVX2 = _x86_integer_dots()
# how far ahead a tile asks for codes (bytes): measured on a 16,384 x 2,048 Q4_K weight streamed
# from memory, 2 threads, one token / four: none 1.11 / 1.69 ms, 2,048 0.91 / 1.13, 4,096
# 0.85 / 1.14, 8,192 0.88 / 1.24 (prefetching past the end of the codes is harmless: no fault)
PREFETCH = 4096

# (tokens, row vectors) for a tile of 1..6 tokens: 8 independent sums or more where the tokens
# allow, and T x V accumulators plus V code vectors within the 16 registers
TILES = {6: 2, 5: 2, 4: 2, 3: 2, 2: 4, 1: 8}
TILE_VECTORS = tuple(TILES.get(tokens, 0) for tokens in range(7))


def _declared(module, name, result, arguments):
    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, ir.FunctionType(result, arguments), name=name)


def _pairs(builder, wide, count, kind):
    """Adjacent lanes of `wide` (2 * count lanes) added: lanes (0+1, 2+3, ...)."""
    index = ir.VectorType(I32, count)
    even = builder.shuffle_vector(wide, wide, ir.Constant(index, list(range(0, 2 * count, 2))))
    odd = builder.shuffle_vector(wide, wide, ir.Constant(index, list(range(1, 2 * count, 2))))
    return builder.add(even, odd)


def _maddubs(builder, unsigned, signed):
    """16 words: u[2i] s[2i] + u[2i+1] s[2i+1], u as unsigned bytes, s as signed (pmaddubsw)."""
    if AVX2:
        return builder.call(_declared(builder.module, "llvm.x86.avx2.pmadd.ub.sw", WORDS, [BYTES, BYTES]),
                            [unsigned, signed])
    wide = ir.VectorType(I16, 32)
    return _pairs(builder, builder.mul(builder.zext(unsigned, wide), builder.sext(signed, wide)), 16, I16)


def _widen_pairs(builder, words):
    """8 sums: words[2i] + words[2i+1] as int32 (pmaddwd with ones)."""
    if AVX2:
        return builder.call(_declared(builder.module, "llvm.x86.avx2.pmadd.wd", SUMS, [WORDS, WORDS]),
                            [words, ir.Constant(WORDS, [1] * 16)])
    return _pairs(builder, builder.sext(words, ir.VectorType(I32, 16)), LANES, I32)


def _magnitude(builder, codes):
    """|w| of int8 codes, read as unsigned bytes (|-128| = 128)."""
    if AVX2:
        return builder.call(_declared(builder.module, "llvm.abs.v32i8", BYTES, [BYTES, ir.IntType(1)]),
                            [codes, ir.Constant(ir.IntType(1), 0)])
    negative = builder.icmp_signed("<", codes, ir.Constant(BYTES, [0] * 32))
    return builder.select(negative, builder.neg(codes), codes)


def _signed_by(builder, x, codes):
    """x times the sign of each code (0 where the code is 0): psignb."""
    if AVX2:
        return builder.call(_declared(builder.module, "llvm.x86.avx2.psign.b", BYTES, [BYTES, BYTES]), [x, codes])
    zero = ir.Constant(BYTES, [0] * 32)
    flipped = builder.select(builder.icmp_signed("<", codes, zero), builder.neg(x), x)
    return builder.select(builder.icmp_signed("==", codes, zero), zero, flipped)


def _pointer(builder, address, kind):
    return builder.inttoptr(address, kind.as_pointer())


def _at(builder, pointer, index):
    return builder.gep(pointer, [index if isinstance(index, ir.Value) else ir.Constant(I64, index)])


def _splat(builder, value, vector_type):
    one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(I32, 0))
    zeros = ir.Constant(ir.VectorType(I32, vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined), zeros)


def _load(builder, pointer, index, vector_type, align):
    return builder.load(builder.bitcast(_at(builder, pointer, index), vector_type.as_pointer()), align=align)


# The code kinds a tile reads (gguf_codes' NIBBLES32, BYTES32, BITS5_32, BITS6_16, GRID32, BITS2_16, BITS3_16)
NIBBLE_CODES, BYTE_CODES, FIVE_BITS, SIX_BITS, GRID_CODES = "nibbles", "bytes", "five", "six", "grid"
TWO_BITS, THREE_BITS = "two", "three"
# IQ4_NL's and IQ4_XS's non-linear grid (ggml's kvalues_iq4nl): a GRID_CODES nibble is an index into it
GRID = tuple(int(v) for v in IQ4_KVALUES)


def _grid_values(builder, indices):
    """GRID[i] for 32 indices 0..15 (bytes): one pshufb from the table in both 128-bit lanes (AVX2
    builds only: without it kernels_numba looks the values up before the tiles)."""
    table = ir.Constant(BYTES, [v & 255 for v in GRID] * 2)
    return builder.call(_declared(builder.module, "llvm.x86.avx2.pshuf.b", BYTES, [BYTES, BYTES]), [table, indices])


def _byte_shift(builder, vector, bits):
    """Each byte of `vector` shifted left by `bits` (right where negative); bits shifted out are lost."""
    if bits > 0:
        return builder.shl(vector, ir.Constant(BYTES, [bits] * 32))
    if bits < 0:
        return builder.lshr(vector, ir.Constant(BYTES, [-bits] * 32))
    return vector


def _top_bits(builder, plane, quad, mode):
    """The high bits of the codes of nibble quad `quad`, in place (bit 4, or bits 4-5) for the low
    nibbles' weights and for the high nibbles', from the group's plane of high bits (a 32-bit word
    a row, int4_cpu_torch.CodeBlocks says how it is packed)."""
    if mode == FIVE_BITS:  # byte i: bit q = weight 4q+i's fifth bit, bit 4+q = weight 16+4q+i's
        mask, low_shift, high_shift = 0x10, 4 - quad, -quad
    else:  # six: byte i: bits 2q, 2q+1 = weight 4q+i's top pair, bits 4+2q, 5+2q = weight 8+4q+i's
        mask, low_shift, high_shift = 0x30, 4 - 2 * quad, -2 * quad
    keep = ir.Constant(BYTES, [mask] * 32)
    return (builder.and_(_byte_shift(builder, plane, low_shift), keep),
            builder.and_(_byte_shift(builder, plane, high_shift), keep))


def _make_tile(tokens: int, vectors: int, mode: str, length: int):
    """The tile of `tokens` x `vectors` * 8 rows over one group of `length` weights (32, or 16 for
    the K-quants' sub-blocks of 16) and its epilogue:
    acc[t, r] += fmuladd(scale[r] * dx[t], float(sum_j code[r, j] xq[t, j]), offset[r] * sx[t]).

    mode: how the group's codes are stored: NIBBLE_CODES (4-bit, two a byte: weight j and j + 16),
    GRID_CODES (4-bit indices into GRID, packed as NIBBLE_CODES: each looked up, then multiplied
    as int8 codes; AVX2 builds only), BYTE_CODES (int8), FIVE_BITS or SIX_BITS (5- or 6-bit unsigned codes: nibbles
    as NIBBLE_CODES, weight j and j + length / 2 in a byte, then one more quad of high bits; the
    stored code is the code plus `bias`, so the integer sum subtracts bias times the activations'
    integer sum over the group: sum_j (q_j - bias) x_j = sum_j q_j x_j - bias sum_j x_j, the same integer),
    TWO_BITS or THREE_BITS (groups of 16: one quad of bit pairs, byte i holding weights i, 4 + i,
    8 + i and 12 + i; for 3 bits, a word of third bits that two groups share, at `plane`, which the
    tile shifts right by `plane_shift` bits, 0 or 4: int4_cpu_torch.pack_triples; stored code
    q + bias as above).

    Arguments are addresses (an array's .ctypes.data plus the byte offset) and strides:
    codes: the group's quads from the tile's first row; xq: the tile's first token's int8
    activations at the group's first column, xq_stride bytes a token; acc (tokens, 64) float32 from
    the tile's first token and row; scale, offset: float32 from the tile's first row; dx: the tile's
    first token's activation scale for the group, dx_stride floats a token; sx: its quantized
    activations' sum over the group, sx_stride floats a token; xs: that sum as the integer (int32),
    xs_stride int32 a token; bias: as above (FIVE_BITS, SIX_BITS and THREE_BITS only); plane,
    plane_shift: as above (THREE_BITS only)."""
    packed = mode in (NIBBLE_CODES, FIVE_BITS, SIX_BITS)
    crumbs = mode in (TWO_BITS, THREE_BITS)
    biased = mode in (FIVE_BITS, SIX_BITS, THREE_BITS)  # stored codes less a bias
    nibble_quads = length // QUAD // 2
    # the loads of codes a row vector takes
    code_quads = length // QUAD if mode == BYTE_CODES else 1 if crumbs else nibble_quads
    quads = code_quads + (1 if mode in (FIVE_BITS, SIX_BITS) else 0)  # and of the high bits: the group's whole
    half = length // 2  # packed: the high nibble's weight is the low one's + half
    # quads summed in 16 bits before widening, so that no sum leaves int16: a quad adds 4 products
    # per lane, each |code| x 127 at most: 4-bit 4 quads (30,480), 5-bit 2 (31,496), 6-bit 1 (32,004)
    per_widen = {NIBBLE_CODES: 4, FIVE_BITS: 2, SIX_BITS: 1}.get(mode, 1)

    @intrinsic
    def tile(typingctx, codes, xq, xq_stride, acc, scale, offset, dx, dx_stride, sx, sx_stride, xs, xs_stride,
             bias, plane, plane_shift):
        signature = types.void(*(types.int64,) * 15)

        def codegen(context, builder, sig, args):
            (codes_p, xq_p, xq_stride_v, acc_p, scale_p, offset_p, dx_p, dx_stride_v, sx_p, sx_stride_v, xs_p,
             xs_stride_v, bias_v, plane_p, plane_shift_v) = args
            code_b = _pointer(builder, codes_p, I8)
            xq_b = _pointer(builder, xq_p, I8)
            acc_f, scale_f, offset_f, dx_f, sx_f = (_pointer(builder, p, F32)
                                                    for p in (acc_p, scale_p, offset_p, dx_p, sx_p))
            token_at = [_at(builder, xq_b, builder.mul(xq_stride_v, ir.Constant(I64, t))) for t in range(tokens)]
            words = [[None] * vectors for _ in range(tokens)]  # packed codes: 16-bit sums of a few quads
            sums = [[None] * vectors for _ in range(tokens)]  # 32-bit sums

            def add_sum(t, v, value):
                sums[t][v] = value if sums[t][v] is None else builder.add(sums[t][v], value)

            def broadcast(t, column):
                word = builder.load(builder.bitcast(_at(builder, token_at[t], column), I32.as_pointer()), align=1)
                return builder.bitcast(_splat(builder, word, SUMS), BYTES)

            # the codes PREFETCH bytes on (4 groups of a chunk's 4-bit codes) asked for now: the
            # hardware's prefetcher alone left a streamed weight at 17.5 GB/s where 2 threads read 28
            prefetch = module_prefetch(builder.module)
            # (a 3-bit group's tile asks for two quads: its pair's quads lie 0, 256 and 512 bytes on
            # from the first group's, and one quad from each group's codes would leave a third unasked)
            for line in range(0, (2 if mode == THREE_BITS else quads) * QUAD * CHUNK, 64):
                if line % (QUAD * CHUNK) < vectors * QUAD * LANES:  # this tile's rows of each quad
                    builder.call(prefetch, [_at(builder, code_b, PREFETCH + line), ir.Constant(I32, 0),
                                            ir.Constant(I32, 3), ir.Constant(I32, 1)])
            planes = None
            if mode in (FIVE_BITS, SIX_BITS):  # the group's high bits: the quad after its nibbles, a word a row
                planes = [_load(builder, code_b, nibble_quads * QUAD * CHUNK + v * QUAD * LANES, BYTES, 1)
                          for v in range(vectors)]
            if mode == THREE_BITS:  # the third bits of the pair's group in the low nibble of each byte
                shift = _splat(builder, builder.trunc(plane_shift_v, I32), SUMS)
                plane_b = _pointer(builder, plane_p, I8)
                planes = [builder.bitcast(builder.lshr(builder.bitcast(
                    _load(builder, plane_b, v * QUAD * LANES, BYTES, 1), SUMS), shift), BYTES) for v in range(vectors)]
            for q in range(code_quads):
                loaded = [_load(builder, code_b, q * QUAD * CHUNK + v * QUAD * LANES, BYTES, 1) for v in range(vectors)]
                if crumbs:  # bit pairs k: weights 4k..4k+3 of each row (and their third bits in place)
                    for k in range(4):
                        codes_k = [builder.and_(_byte_shift(builder, w, -2 * k), ir.Constant(BYTES, [3] * 32))
                                   for w in loaded]
                        if planes is not None:
                            codes_k = [builder.or_(c, builder.and_(_byte_shift(builder, planes[v], 2 - k),
                                                                   ir.Constant(BYTES, [4] * 32)))
                                       for v, c in enumerate(codes_k)]
                        for t in range(tokens):
                            x_k = broadcast(t, QUAD * k)
                            for v in range(vectors):
                                product = _maddubs(builder, codes_k[v], x_k)
                                words[t][v] = product if words[t][v] is None else builder.add(words[t][v], product)
                    for t in range(tokens):  # a word's 4 pairs of |code| x 127: 4 x 2 x 7 x 127 = 7,112 at most
                        for v in range(vectors):
                            add_sum(t, v, _widen_pairs(builder, words[t][v]))
                elif packed:  # low nibbles: weights 4q..4q+3, high: half+4q..; both unsigned bytes
                    low = [builder.and_(w, ir.Constant(BYTES, [15] * 32)) for w in loaded]
                    high = [builder.lshr(w, ir.Constant(BYTES, [4] * 32)) for w in loaded]
                    if planes is not None:
                        for v in range(vectors):
                            top_low, top_high = _top_bits(builder, planes[v], q, mode)
                            low[v], high[v] = builder.or_(low[v], top_low), builder.or_(high[v], top_high)
                    for t in range(tokens):
                        x_low, x_high = broadcast(t, QUAD * q), broadcast(t, half + QUAD * q)
                        for v in range(vectors):
                            both = builder.add(_maddubs(builder, low[v], x_low), _maddubs(builder, high[v], x_high))
                            words[t][v] = both if words[t][v] is None else builder.add(words[t][v], both)
                            if (q + 1) % per_widen == 0 or q == nibble_quads - 1:
                                add_sum(t, v, _widen_pairs(builder, words[t][v]))
                                words[t][v] = None
                elif mode == GRID_CODES:  # each nibble's grid value, then as int8 codes (two sums: each
                    # pmaddubsw's pairs reach 2 x 127 x 127, so the halves are widened apart)
                    halves = [(_grid_values(builder, builder.and_(w, ir.Constant(BYTES, [15] * 32))),
                               _grid_values(builder, builder.lshr(w, ir.Constant(BYTES, [4] * 32)))) for w in loaded]
                    magnitudes = [(_magnitude(builder, a), _magnitude(builder, b)) for a, b in halves]
                    for t in range(tokens):
                        x_low, x_high = broadcast(t, QUAD * q), broadcast(t, half + QUAD * q)
                        for v in range(vectors):
                            low = _maddubs(builder, magnitudes[v][0], _signed_by(builder, x_low, halves[v][0]))
                            high = _maddubs(builder, magnitudes[v][1], _signed_by(builder, x_high, halves[v][1]))
                            add_sum(t, v, builder.add(_widen_pairs(builder, low), _widen_pairs(builder, high)))
                else:
                    magnitude = [_magnitude(builder, w) for w in loaded]
                    for t in range(tokens):
                        x = broadcast(t, QUAD * q)
                        for v in range(vectors):
                            signed = _signed_by(builder, x, loaded[v])
                            add_sum(t, v, _widen_pairs(builder, _maddubs(builder, magnitude[v], signed)))
            fmuladd = _declared(builder.module, "llvm.fmuladd.v8f32", FLOATS, [FLOATS] * 3)
            for t in range(tokens):
                dx_t = _splat(builder, builder.load(_at(builder, dx_f, builder.mul(dx_stride_v, ir.Constant(I64, t))),
                                                    align=4), FLOATS)
                sx_t = _splat(builder, builder.load(_at(builder, sx_f, builder.mul(sx_stride_v, ir.Constant(I64, t))),
                                                    align=4), FLOATS)
                if biased:  # the stored codes' excess: bias x the group's integer sum
                    xs_t = builder.load(_at(builder, _pointer(builder, xs_p, I32),
                                            builder.mul(xs_stride_v, ir.Constant(I64, t))), align=4)
                    excess = _splat(builder, builder.mul(builder.trunc(bias_v, I32), xs_t), SUMS)
                for v in range(vectors):
                    total = builder.sub(sums[t][v], excess) if biased else sums[t][v]
                    scaled = builder.fmul(_load(builder, scale_f, v * LANES, FLOATS, 4), dx_t)
                    shifted = builder.fmul(_load(builder, offset_f, v * LANES, FLOATS, 4), sx_t)
                    share = builder.call(fmuladd, [scaled, builder.sitofp(total, FLOATS), shifted])
                    into = builder.bitcast(_at(builder, acc_f, t * CHUNK + v * LANES), FLOATS.as_pointer())
                    builder.store(builder.fadd(builder.load(into, align=4), share), into, align=4)
            return context.get_dummy_value()

        return signature, codegen

    return tile


# by code kind (kernels_numba's NIBBLES32, BYTES32, BITS5_32, BITS6_16, GRID32, BITS2_16, BITS3_16), then tokens 1..6
NIBBLE_TILES = {t: _make_tile(t, v, NIBBLE_CODES, 32) for t, v in TILES.items()}
BYTE_TILES = {t: _make_tile(t, v, BYTE_CODES, 32) for t, v in TILES.items()}
FIVE_TILES = {t: _make_tile(t, v, FIVE_BITS, 32) for t, v in TILES.items()}
SIX_TILES = {t: _make_tile(t, v, SIX_BITS, 16) for t, v in TILES.items()}
TWO_TILES = {t: _make_tile(t, v, TWO_BITS, 16) for t, v in TILES.items()}
THREE_TILES = {t: _make_tile(t, v, THREE_BITS, 16) for t, v in TILES.items()}
# (a build without AVX2 has no pshufb: kernels_numba lays the grid's values out as int8 codes and
# runs BYTE_TILES, where a lookup made of compares doubled the build's compile time, 65 to 140 s)
GRID_TILES = {t: _make_tile(t, v, GRID_CODES, 32) for t, v in TILES.items()} if AVX2 else BYTE_TILES
