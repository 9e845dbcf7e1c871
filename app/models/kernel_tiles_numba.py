"""Register tiles for kernels_numba.py: LLVM vector code written out, for the two loops whose speed
rests on which values stay in registers, which Numba's loops give no way to say.

A wide pass (a verify of 8-17 tokens) multiplies every decoded weight by every token. Written as
Numba loops, each fused multiply-add loaded both its operands (a decoded weight vector and a token's
activation), so a core did about one FMA a cycle of the two it can: the demo's 17-token pass cost
seven one-token steps. Here a tile of T tokens x R vectors of 8 rows keeps its T*R sums in
registers: each weight vector loaded serves T tokens and each activation broadcast serves R
vectors (the layout of the usual AVX2 GEMM micro-kernel, 6 x 16).

Exactness: every output element goes through the same operations in the same order in every tile
shape: s = d_0 x_0, then s = fmuladd(d_j, x_j, s) for j = 16, 1, 17, 2, ..., 31 (ORDER), one chain,
so a pass of any width, split into any tiles, gives a token bit for bit what a one-token step
gives it. (llvm.fmuladd is one FMA where the CPU has them and a multiply and an add where not: the
choice is made per type when the code is built, the same for every tile.)
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LANES = 8  # floats in a vector (one AVX register; two NEON or SSE registers elsewhere)
GROUP = 32  # weights a 4-bit group holds: the chain's length
HALF = GROUP // 2  # bytes a row of a group takes
CHUNK = 64  # rows a decoded group holds (the stride of `decoded` and of the accumulators)

# (tokens, row vectors) for a tile of 1..6 tokens: at least 8 independent chains where the tokens
# allow (an FMA's latency is 4-5 cycles, two issue a cycle) and about the 16 registers there are
# (3 x 4 and 1 x 8 may hold a 17th vector a moment: a matter of speed, not of the result)
TILES = {6: 2, 5: 2, 4: 2, 3: 4, 2: 4, 1: 8}
# the same indexed by the tile's tokens, for the compiled callers (which step over rows by it)
TILE_VECTORS = tuple(TILES.get(tokens, 0) for tokens in range(7))

_F32 = ir.FloatType()
_VEC = ir.VectorType(_F32, LANES)


def _pointer(builder, address, kind):
    return builder.inttoptr(address, kind.as_pointer())


def _splat(builder, value):
    vector = builder.insert_element(ir.Constant(_VEC, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    return builder.shuffle_vector(vector, ir.Constant(_VEC, ir.Undefined), zeros)


def _load_vector(builder, floats, index):
    address = builder.gep(floats, [ir.Constant(ir.IntType(64), index)])
    return builder.load(builder.bitcast(address, _VEC.as_pointer()), align=4)


def _fmuladd(module):
    name = f"llvm.fmuladd.v{LANES}f32"
    declared = module.globals.get(name)
    return declared if declared is not None else ir.Function(module, ir.FunctionType(_VEC, [_VEC] * 3), name=name)


def _at(builder, floats, index):
    return builder.gep(floats, [index])


# The chain's order over a group's 32 weights: byte j holds weight j (its low nibble) and weight
# j + 16 (its high one), so the two are taken together, which lets a one-token tile decode a byte in
# registers and use both halves at once
ORDER = tuple(k // 2 if k % 2 == 0 else HALF + k // 2 for k in range(GROUP))


def _make_group_tile(tokens: int, vectors: int, length: int = GROUP, packed: str = ""):
    """The tile of `tokens` x `vectors` * 8 rows for one group of `length` weights (32, or 16 for
    the K-quants' sub-blocks of 16), with its epilogue:
    acc[t, r] += scale[r] * s[t, r] + offset[r] * sums[t] (kernels_numba.chunk_product's rule).

    Arguments are addresses (an array's .ctypes.data plus the byte offset) and strides in floats:
    decoded (length, 64) floats from the tile's first row, or with `packed` the group's codes as
    stored, decoded here in registers (a one-token step: nothing to share a decode with): "nibbles"
    (16, 64) bytes of 4-bit codes, "bytes" (length, 64) int8 codes; x from the tile's first token at
    the group's first column, x_stride floats a token; acc (tokens, 64) from the tile's first token
    and row; scale, offset: the tile's first row; sums: the tile's first token, sums_stride floats a
    token."""
    order = ORDER if length == GROUP else tuple(range(length))

    @intrinsic
    def group_tile(typingctx, decoded, x, x_stride, acc, scale, offset, sums, sums_stride):
        signature = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                               types.int64, types.int64)

        def codegen(context, builder, sig, args):
            decoded_p, x_p, x_stride_v, acc_p, scale_p, offset_p, sums_p, sums_stride_v = args
            decoded_f = _pointer(builder, decoded_p, ir.IntType(8) if packed else _F32)
            x_f = _pointer(builder, x_p, _F32)
            acc_f = _pointer(builder, acc_p, _F32)
            scale_f = _pointer(builder, scale_p, _F32)
            offset_f = _pointer(builder, offset_p, _F32)
            sums_f = _pointer(builder, sums_p, _F32)
            fmuladd = _fmuladd(builder.module)
            rows = [_at(builder, x_f, builder.mul(x_stride_v, ir.Constant(ir.IntType(64), t)))
                    for t in range(tokens)]
            chains = [[None] * vectors for _ in range(tokens)]
            nibbles = {}
            for j in order:
                if packed == "nibbles":
                    weights = [_nibble(builder, decoded_f, j, v, nibbles) for v in range(vectors)]
                elif packed == "bytes":
                    weights = [_byte(builder, decoded_f, j, v) for v in range(vectors)]
                else:
                    weights = [_load_vector(builder, decoded_f, j * CHUNK + v * LANES) for v in range(vectors)]
                for t in range(tokens):
                    xj = _splat(builder, builder.load(_at(builder, rows[t], ir.Constant(ir.IntType(64), j)), align=4))
                    for v in range(vectors):
                        chains[t][v] = _chained(builder, weights[v], xj, chains[t][v])
            for t in range(tokens):
                total = _splat(builder, builder.load(
                    _at(builder, sums_f, builder.mul(sums_stride_v, ir.Constant(ir.IntType(64), t))), align=4))
                for v in range(vectors):
                    into = builder.bitcast(_at(builder, acc_f, ir.Constant(ir.IntType(64), t * CHUNK + v * LANES)),
                                           _VEC.as_pointer())
                    scaled = builder.call(fmuladd, [_load_vector(builder, scale_f, v * LANES), chains[t][v],
                                                    builder.fmul(_load_vector(builder, offset_f, v * LANES), total)])
                    builder.store(builder.fadd(builder.load(into, align=4), scaled), into, align=4)
            return context.get_dummy_value()

        return signature, codegen

    return group_tile


def _nibble(builder, codes, j, v, held):
    """Weight j of rows 8v..8v+7 as floats, from the bytes (16, 64): the low nibble of byte j for
    j < 16, else the high nibble of byte j - 16 (the bytes are loaded once for both)."""
    column = j % HALF
    if (column, v) not in held:
        address = builder.gep(codes, [ir.Constant(ir.IntType(64), column * CHUNK + v * LANES)])
        loaded = builder.load(builder.bitcast(address, ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
        held[column, v] = builder.zext(loaded, ir.VectorType(ir.IntType(32), LANES))
    wide = held[column, v]
    if j < HALF:
        value = builder.and_(wide, ir.Constant(wide.type, [15] * LANES))
    else:
        value = builder.lshr(wide, ir.Constant(wide.type, [4] * LANES))
    return builder.sitofp(value, _VEC)


def _byte(builder, codes, j, v):
    """Weight j of rows 8v..8v+7 as floats, from int8 codes (length, 64): byte j of each row."""
    address = builder.gep(codes, [ir.Constant(ir.IntType(64), j * CHUNK + v * LANES)])
    loaded = builder.load(builder.bitcast(address, ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
    return builder.sitofp(loaded, _VEC)  # signed: the codes are int8


GROUP_TILES = {tokens: _make_group_tile(tokens, vectors) for tokens, vectors in TILES.items()}
GROUP16_TILES = {tokens: _make_group_tile(tokens, vectors, 16) for tokens, vectors in TILES.items()}
# one token, the whole chunk, from the codes as stored: 4-bit codes in groups of 32, int8 codes in
# groups of 32 and of 16
PACKED_STEP = _make_group_tile(1, CHUNK // LANES, packed="nibbles")
BYTES_STEP = _make_group_tile(1, CHUNK // LANES, packed="bytes")
BYTES16_STEP = _make_group_tile(1, CHUNK // LANES, 16, packed="bytes")
# 2-6 tokens (a pass of one token tile: a verify of k <= 5 drafts) from the codes as stored, each
# weight vector decoded in registers once for the tile's tokens: no round trip through `decoded`
PACKED_TILES = {t: _make_group_tile(t, TILES[t], packed="nibbles") for t in range(2, 7)}
BYTES_TILES = {t: _make_group_tile(t, TILES[t], packed="bytes") for t in range(2, 7)}
BYTES16_TILES = {t: _make_group_tile(t, TILES[t], 16, packed="bytes") for t in range(2, 7)}


# (tokens, rows) for the dot tiles: T * R sums in registers, each an 8-lane vector until the end;
# the rows of each divide 8, the block the callers step over
DOT_TILES = {6: 2, 5: 2, 4: 2, 3: 4, 2: 4, 1: 8}
DOT_ROWS = tuple(DOT_TILES.get(tokens, 0) for tokens in range(7))
assert all(8 % rows == 0 for rows in DOT_TILES.values()) and all(8 % v == 0 for v in TILES.values())


def _hsum(builder, vector):
    """The 8 lanes of a vector summed in one fixed order: (0+4, 1+5, 2+6, 3+7), then pairs."""
    width = LANES
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(vector, vector,
                                     ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
        high = builder.shuffle_vector(vector, vector, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                                  list(range(width, 2 * width))))
        vector = builder.fadd(low, high)
    return builder.extract_element(vector, ir.Constant(ir.IntType(32), 0))


def _chained(builder, weights, x, chain):
    """The chain's rule: its first term a product, every later one fmuladd(weights, x, chain)."""
    if chain is None:
        return builder.fmul(weights, x)
    return builder.call(_fmuladd(builder.module), [weights, x, chain])


def _chains_over(builder, step, stride, stop, tokens: int, width: int):
    """The tokens x width chains after step(i, chains) for i = 0, stride, 2 stride, ... < stop
    (stop > 0): the first step outside the loop, so every chain starts with a product; the chains
    kept in allocas between iterations (LLVM holds them in registers)."""
    from numba.core import cgutils

    i64 = ir.IntType(64)
    first = [[None] * width for _ in range(tokens)]
    step(ir.Constant(i64, 0), first)
    slots = [[cgutils.alloca_once(builder, _VEC) for _ in range(width)] for _ in range(tokens)]
    for t in range(tokens):
        for r in range(width):
            builder.store(first[t][r], slots[t][r])
    with cgutils.for_range_slice(builder, ir.Constant(i64, stride), stop, ir.Constant(i64, stride), intp=i64) as (i, _):
        chains = [[builder.load(slots[t][r]) for r in range(width)] for t in range(tokens)]
        step(i, chains)
        for t in range(tokens):
            for r in range(width):
                builder.store(chains[t][r], slots[t][r])
    return [[builder.load(slots[t][r]) for r in range(width)] for t in range(tokens)]


def _make_dot_tile(tokens: int, rows: int, codes: bool):
    """out[t * out_stride + r] = sum_i a[r, i] x[t, i] for a tile of `tokens` x `rows`, i over
    `width` (a multiple of 8): a's rows are int8 codes (the screened head) or float32 (attention's
    keys). Each sum is an 8-lane vector chain over the row, a fixed tree over the lanes at the end.

    Arguments: addresses of a's first row (a_stride elements a row), of x's first token (x_stride
    floats a token) and of out's first element, width, out_stride."""
    element = ir.IntType(8) if codes else _F32
    size = 1 if codes else 4

    @intrinsic
    def dot_tile(typingctx, a, a_stride, x, x_stride, width, out, out_stride):
        signature = types.void(*(types.int64,) * 7)

        def codegen(context, builder, sig, args):
            a_p, a_stride_v, x_p, x_stride_v, width_v, out_p, out_stride_v = args
            i64 = ir.IntType(64)
            a_e = _pointer(builder, a_p, element)
            x_f = _pointer(builder, x_p, _F32)
            out_f = _pointer(builder, out_p, _F32)
            row_at = [_at(builder, a_e, builder.mul(a_stride_v, ir.Constant(i64, r))) for r in range(rows)]
            token_at = [_at(builder, x_f, builder.mul(x_stride_v, ir.Constant(i64, t))) for t in range(tokens)]

            def step(i, chains):
                weights = []
                for r in range(rows):
                    vector_type = ir.VectorType(element, LANES)
                    loaded = builder.load(builder.bitcast(_at(builder, row_at[r], i), vector_type.as_pointer()),
                                          align=size)
                    weights.append(builder.sitofp(loaded, _VEC) if codes else loaded)
                for t in range(tokens):
                    xs = builder.load(builder.bitcast(_at(builder, token_at[t], i), _VEC.as_pointer()), align=4)
                    for r in range(rows):
                        chains[t][r] = _chained(builder, weights[r], xs, chains[t][r])

            sums = _chains_over(builder, step, LANES, width_v, tokens, rows)
            for t in range(tokens):
                for r in range(rows):
                    where = builder.add(builder.mul(out_stride_v, ir.Constant(i64, t)), ir.Constant(i64, r))
                    builder.store(_hsum(builder, sums[t][r]), _at(builder, out_f, where), align=4)
            return context.get_dummy_value()

        return signature, codegen

    return dot_tile


CODE_DOT_TILES = {tokens: _make_dot_tile(tokens, rows, True) for tokens, rows in DOT_TILES.items()}
FLOAT_DOT_TILES = {tokens: _make_dot_tile(tokens, rows, False) for tokens, rows in DOT_TILES.items()}
ONE_CODE_DOT = _make_dot_tile(1, 1, True)  # rows left over at the end of a run
ONE_FLOAT_DOT = _make_dot_tile(1, 1, False)


def _make_sum_tile(tokens: int, vectors: int):
    """out[t, 8v..8v+7] = sum_p a[p, 8v..8v+7] x[t, p] for p < count, in order: attention's
    weighted sum of the values, for `tokens` queries and `vectors` * 8 of a value's columns.

    Arguments: addresses of a's first row (a_stride floats a row), of x's first token (x_stride
    floats a token) and of out's first element (out_stride floats a token), count >= 1."""

    @intrinsic
    def sum_tile(typingctx, a, a_stride, x, x_stride, count, out, out_stride):
        signature = types.void(*(types.int64,) * 7)

        def codegen(context, builder, sig, args):
            a_p, a_stride_v, x_p, x_stride_v, count_v, out_p, out_stride_v = args
            i64 = ir.IntType(64)
            a_f, x_f, out_f = (_pointer(builder, p, _F32) for p in (a_p, x_p, out_p))
            token_at = [_at(builder, x_f, builder.mul(x_stride_v, ir.Constant(i64, t))) for t in range(tokens)]

            def step(p, chains):
                row = _at(builder, a_f, builder.mul(a_stride_v, p))
                columns = [_load_vector(builder, row, v * LANES) for v in range(vectors)]
                for t in range(tokens):
                    xp = _splat(builder, builder.load(_at(builder, token_at[t], p), align=4))
                    for v in range(vectors):
                        chains[t][v] = _chained(builder, columns[v], xp, chains[t][v])

            sums = _chains_over(builder, step, 1, count_v, tokens, vectors)
            for t in range(tokens):
                row = _at(builder, out_f, builder.mul(out_stride_v, ir.Constant(i64, t)))
                for v in range(vectors):
                    into = builder.bitcast(_at(builder, row, ir.Constant(i64, v * LANES)), _VEC.as_pointer())
                    builder.store(sums[t][v], into, align=4)
            return context.get_dummy_value()

        return signature, codegen

    return sum_tile


# two vectors (16 columns) a tile: every head size in use is a multiple of 16; the same operations
# per element whatever the tile, as above
SUM_TILES = {tokens: _make_sum_tile(tokens, 2) for tokens in range(1, 7)}
