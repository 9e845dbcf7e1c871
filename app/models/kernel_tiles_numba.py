"""Register tiles for kernels_numba.py's float32 loops: LLVM vector code written out where speed
rests on which values stay in registers, which Numba's loops give no way to say. (The weight
products' tiles, on int8 activations, are int8_tiles_numba.py.)

- dot tiles: out[t, r] = a[r] . x[t] for the screened head (a: int8 codes) and attention's scores
  (a: float32 keys);
- sum tiles: attention's weighted sum of the values.

A tile of T tokens x R rows keeps its T*R sums in registers: each row vector loaded serves T
tokens and each token's vector serves R rows (the layout of the usual AVX2 GEMM micro-kernel).

Exactness: every output element goes through the same operations in the same order in every tile
shape (one 8-lane chain over the row, a fixed tree over the lanes at the end), so a pass of any
width, split into any tiles, gives a token bit for bit what a one-token step gives it.
(llvm.fmuladd is one FMA where the CPU has them and a multiply and an add where not: the choice
is made per type when the code is built, the same for every tile.)
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

LANES = 8  # floats in a vector (one AVX register; two NEON or SSE registers elsewhere)

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


# (tokens, rows) for the dot tiles: T * R sums in registers, each an 8-lane vector until the end;
# the rows of each divide 8, the block the callers step over
DOT_TILES = {6: 2, 5: 2, 4: 2, 3: 4, 2: 4, 1: 8}
DOT_ROWS = tuple(DOT_TILES.get(tokens, 0) for tokens in range(7))
assert all(8 % rows == 0 for rows in DOT_TILES.values())


def module_prefetch(module):
    """llvm.prefetch (address, write 0 / read, locality 0-3, data 1): a hint, no arithmetic."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    declared = module.globals.get("llvm.prefetch.p0i8")
    kind = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    return declared if declared is not None else ir.Function(module, kind, name="llvm.prefetch.p0i8")


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
            if codes:  # the next tile's rows (contiguous after these), `rows` x 8 bytes a step: into L2
                ahead = _at(builder, row_at[0], builder.mul(a_stride_v, ir.Constant(i64, rows)))
                prefetch = module_prefetch(builder.module)

            def step(i, chains):
                if codes:
                    where = _at(builder, ahead, builder.mul(i, ir.Constant(i64, rows)))
                    builder.call(prefetch, [where, ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 2),
                                            ir.Constant(ir.IntType(32), 1)])
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
