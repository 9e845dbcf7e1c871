"""The compiled half of int4_cpu_torch.py: Numba functions (LLVM, built for the CPU they run on,
kept on disk in Tandem's cache). Importing this module imports Numba; int4_cpu_torch.py imports
it only when the kernel is wanted, and says why where it cannot be.

Two things are compiled here:

- `matmul`: a weight of GGUF codes (CodeBlocks' layout) times activations quantized to int8 per
  token (int4_cpu_torch.py says how);
- `decoder_body`: a Llama-family model's decoder layers for the tokens of one pass, one call
  for the whole stack (norms, the four products, RoPE, the KV write, grouped-query attention,
  the gated MLP, the residual adds). On a 2-core CPU the demo's pass was half dispatch: ~1,300
  PyTorch calls of a few microseconds each around the kernels (docs/performance.md); here there
  is one call, and the threads are shared out inside it.

Every output element is computed by the same operations in the same order whatever the number
of tokens in the pass (the products allow no reassociation; row-local sums may be reordered by
LLVM, but once, at compile time, in the one code path every width takes), so a verify pass gives
each token bit for bit what a one-token step gives it.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types  # noqa: F401 - prange is read by the parallel functions
from numba.extending import intrinsic, overload

from app.models import numba_cache
from app.models.numba_calls import address_of, caller
from app.models.int8_tiles_numba import (AVX2, BYTE_TILES, FIVE_TILES, GRID, GRID_TILES, NIBBLE_TILES, QUAD, SIX_TILES,
                                         THREE_TILES, TILE_VECTORS, TWO_TILES)
from app.models.kernel_tiles_numba import (CODE_DOT_TILES, DOT_ROWS, FLOAT_DOT_TILES, ONE_CODE_DOT, ONE_FLOAT_DOT,
                                          SUM_TILES)

CHUNK = 64
GROUP = 32
HALF = GROUP // 2

# The products: "contract" lets LLVM fuse a multiply and an add into one FMA; no reassociation, so
# a row's sum runs in the order written, the same for one token or many.
# cache: the compiled code is kept in Tandem's cache folder (NUMBA_CACHE_DIR, int4_cpu_torch.py),
# in a frozen bundle through numba_cache.py's locator (where it cannot be added: compiled each start)
_OPTS = dict(boundscheck=False, error_model="numpy", nogil=True, cache=numba_cache.install() == "",
             fastmath={"contract"})
# Row-local work (norms, attention for one query, RoPE): one code path whatever the width, so
# LLVM may reorder a sum to vectorize it and still give every width the same bits.
_ROW_OPTS = dict(_OPTS, fastmath=True)


@intrinsic
def _half(typingctx, bits):
    """An IEEE half's 16 bits (uint16) -> float32: F16C's vcvtph2ps where the CPU has it."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


def widen(value):  # pragma: no cover - replaced in compiled code by the overload below
    raise NotImplementedError


@overload(widen)
def _widen(value):
    if value == types.uint16:
        return lambda value: _half(value)
    return lambda value: np.float32(value)


# The kinds of codes a chunk of 64 rows holds (gguf_codes.py: which GGUF type is which)
NIBBLES32, BYTES32, BITS2_16, BITS5_32, BITS6_16, GRID32, BITS3_16 = 0, 1, 2, 3, 4, 5, 6
# meta's columns, a row per chunk: where its codes start (bytes), its scales and offsets (elements;
# offsets -1 where the chunk has none: w = scale * code), its kind, and for two-level scales (the
# K-quants': scale = d * sc, offset = -(dmin * m)) where its integers sc (and m) and its halves d
# (and dmin) start (-1 for one level; then OFFSETS_AT is only a flag, 0 for an offset); and what
# its stored codes exceed the codes by (gguf_codes.BIAS_OF: Q5_0's 16, Q6_K's 32)
CODES_AT, SCALES_AT, OFFSETS_AT, KIND, SMALL_AT, SUPERS_AT, BIAS = 0, 1, 2, 3, 4, 5, 6
# code bytes a row of a group takes, by kind: packed nibbles, then for 5 and 6 bits a word of high
# bits; bit pairs; bit pairs and half a word of third bits (int4_cpu_torch.STORED, which lays them out)
STORED = (HALF, GROUP, QUAD, HALF + 4, HALF // 2 + 4, HALF, QUAD + QUAD // 2)
LENGTH = (GROUP, GROUP, HALF, GROUP, HALF, GROUP, HALF)  # weights a group holds, by kind (gguf_codes.GROUP_OF)
SUPER = 256


ACT_BLOCK = 32  # activations quantized to int8 per token and per 32 columns, each with its own scale


@njit(**_OPTS)
def quantize_activations(x, xq, dx, sx32, sx16, xs32, xs16):  # pragma: no cover - compiled
    """Each token's row of x (tokens, cols) alone, per block of 32 columns: dx = max|x| / 127,
    xq = rint(x * (1 / dx)) as int8 (so |xq| <= 127), and the quantized activations summed per
    group of 32 and of 16, times dx (sx32, sx16: the offsets' share) and as integers (xs32, xs16:
    what the packed codes' bias takes away). A block with a NaN or an
    infinity gets dx NaN (the products it enters are NaN, as in float32) and codes 0; one so small
    that 1 / dx overflows (max|x| under ~4e-37) is taken as zeros (dx 0, codes 0). The same
    operations as int4_cpu_torch.quantized_activations, bit for bit."""
    tokens, blocks = x.shape[0], x.shape[1] // ACT_BLOCK
    for t in range(tokens):
        for b in range(blocks):
            top = np.float32(0.0)
            for j in range(ACT_BLOCK):
                a = abs(x[t, b * ACT_BLOCK + j])
                if a > top or a != a:  # a NaN stays
                    top = a
            d = top / np.float32(127.0)
            if not d < np.float32(np.inf):
                d = np.float32(np.nan)
            inverse = np.float32(1.0) / d if d > 0 else np.float32(0.0)  # (a NaN is not > 0)
            if not inverse < np.float32(np.inf):  # a block under ~4e-37 (1 / d overflows): zeros
                d, inverse = np.float32(0.0), np.float32(0.0)
            low, high = np.int32(0), np.int32(0)  # the two halves' sums: exact, |sum| <= 32 x 127
            for j in range(ACT_BLOCK):
                q = np.int32(np.rint(x[t, b * ACT_BLOCK + j] * inverse)) if inverse > 0 else np.int32(0)
                xq[t, b * ACT_BLOCK + j] = q
                if j < HALF:
                    low += q
                else:
                    high += q
            dx[t, b] = d
            sx32[t, b] = d * np.float32(low + high)
            sx16[t, 2 * b] = d * np.float32(low)
            sx16[t, 2 * b + 1] = d * np.float32(high)
            xs32[t, b] = low + high
            xs16[t, 2 * b] = low
            xs16[t, 2 * b + 1] = high


@njit(**_OPTS)
def activations(x):  # pragma: no cover - compiled
    """x quantized for the products: (xq, dx, sx32, sx16, xs32, xs16) (quantize_activations)."""
    tokens, cols = x.shape
    xq = np.empty((tokens, cols), np.int8)
    dx = np.empty((tokens, cols // ACT_BLOCK), np.float32)
    sx32 = np.empty((tokens, cols // GROUP), np.float32)
    sx16 = np.empty((tokens, cols // HALF), np.float32)
    xs32 = np.empty((tokens, cols // GROUP), np.int32)
    xs16 = np.empty((tokens, cols // HALF), np.int32)
    quantize_activations(x, xq, dx, sx32, sx16, xs32, xs16)
    return xq, dx, sx32, sx16, xs32, xs16


@njit(**_OPTS)
def part_product(codes, scale, offset, small, supers, meta, acts, out, part, parts):  # pragma: no cover - compiled
    """The part-th of `parts` runs of chunks of out (tokens, rows) = x (tokens, cols) @ weight.T,
    x given as its int8 activations `acts` (activations(x)), with its scratch allocated once."""
    chunks, tokens = meta.shape[0], acts[0].shape[0]
    first, last = part * chunks // parts, (part + 1) * chunks // parts
    acc = np.empty((tokens, CHUNK), np.float32)
    scratch = np.empty((2, CHUNK), np.float32)
    values = np.empty(0 if AVX2 else GROUP * CHUNK, np.int8)
    for ch in range(first, last):
        chunk_product(codes, scale, offset, small, supers, meta, acts, out, ch, acc, scratch, values)


_N1, _N2, _N3, _N4, _N5, _N6 = (NIBBLE_TILES[t] for t in range(1, 7))
_B1, _B2, _B3, _B4, _B5, _B6 = (BYTE_TILES[t] for t in range(1, 7))
_C1, _C2, _C3, _C4, _C5, _C6 = (TWO_TILES[t] for t in range(1, 7))
_T1, _T2, _T3, _T4, _T5, _T6 = (THREE_TILES[t] for t in range(1, 7))
_V1, _V2, _V3, _V4, _V5, _V6 = (FIVE_TILES[t] for t in range(1, 7))
_X1, _X2, _X3, _X4, _X5, _X6 = (SIX_TILES[t] for t in range(1, 7))
_G1, _G2, _G3, _G4, _G5, _G6 = (GRID_TILES[t] for t in range(1, 7))
_D1, _D2, _D3, _D4, _D5, _D6 = (CODE_DOT_TILES[t] for t in range(1, 7))
_F1, _F2, _F3, _F4, _F5, _F6 = (FLOAT_DOT_TILES[t] for t in range(1, 7))
_S1, _S2, _S3, _S4, _S5, _S6 = (SUM_TILES[t] for t in range(1, 7))


@njit(inline="always", **_OPTS)
def _tile(args, size, kind):  # pragma: no cover - compiled
    """One register tile of `size` (1..6) tokens over a group of one kind of codes."""
    if kind == NIBBLES32:
        if size == 1:
            _N1(*args)
        elif size == 2:
            _N2(*args)
        elif size == 3:
            _N3(*args)
        elif size == 4:
            _N4(*args)
        elif size == 5:
            _N5(*args)
        else:
            _N6(*args)
    elif kind == GRID32:
        if size == 1:
            _G1(*args)
        elif size == 2:
            _G2(*args)
        elif size == 3:
            _G3(*args)
        elif size == 4:
            _G4(*args)
        elif size == 5:
            _G5(*args)
        else:
            _G6(*args)
    elif kind == BITS5_32:
        if size == 1:
            _V1(*args)
        elif size == 2:
            _V2(*args)
        elif size == 3:
            _V3(*args)
        elif size == 4:
            _V4(*args)
        elif size == 5:
            _V5(*args)
        else:
            _V6(*args)
    elif kind == BITS6_16:
        if size == 1:
            _X1(*args)
        elif size == 2:
            _X2(*args)
        elif size == 3:
            _X3(*args)
        elif size == 4:
            _X4(*args)
        elif size == 5:
            _X5(*args)
        else:
            _X6(*args)
    elif kind == BYTES32:
        if size == 1:
            _B1(*args)
        elif size == 2:
            _B2(*args)
        elif size == 3:
            _B3(*args)
        elif size == 4:
            _B4(*args)
        elif size == 5:
            _B5(*args)
        else:
            _B6(*args)
    elif kind == BITS3_16:
        if size == 1:
            _T1(*args)
        elif size == 2:
            _T2(*args)
        elif size == 3:
            _T3(*args)
        elif size == 4:
            _T4(*args)
        elif size == 5:
            _T5(*args)
        else:
            _T6(*args)
    elif size == 1:
        _C1(*args)
    elif size == 2:
        _C2(*args)
    elif size == 3:
        _C3(*args)
    elif size == 4:
        _C4(*args)
    elif size == 5:
        _C5(*args)
    else:
        _C6(*args)


@njit(inline="always", **_OPTS)
def chunk_product(codes, scale, offset, small, supers, meta, acts, out, ch, acc, scratch,
                  values):  # pragma: no cover - compiled
    """Rows ch * CHUNK.. of out (tokens, rows) = x (tokens, cols) @ the weight's rows, transposed.

    Group by group: the group's scales and offsets for the chunk's 64 rows into `scratch`, then
    register tiles of up to 6 tokens (int8_tiles_numba.py) take its integer dot products with the
    tokens' int8 activations and add the group's share to `acc`, each token's the same operations
    in every tile. values: where a build without AVX2 lays a group's IQ4 grid values out as int8
    codes (CHUNK x 32 bytes; empty with AVX2, whose tiles look them up in registers)."""
    xq, dx, sx32, sx16, xs32, xs16 = acts
    kind = meta[ch, KIND]
    length = LENGTH[kind]
    stored = STORED[kind]
    tokens, groups = xq.shape[0], xq.shape[1] // length
    sx = sx16 if length == HALF else sx32
    xs = xs16 if length == HALF else xs32
    bias = meta[ch, BIAS]
    per_block = ACT_BLOCK // length  # groups an activation block spans
    sb, ob = scratch[0], scratch[1]
    acc[:] = 0
    xq_stride, dx_stride, sx_stride = xq.strides[0], dx.strides[0] // 4, sx.strides[0] // 4
    xs_stride = xs.strides[0] // 4
    xq_at, dx_at, sx_at, acc_at = xq.ctypes.data, dx.ctypes.data, sx.ctypes.data, acc.ctypes.data
    xs_at = xs.ctypes.data
    sb_at, ob_at = sb.ctypes.data, ob.ctypes.data
    codes_at = codes.ctypes.data + meta[ch, CODES_AT]
    scales_at, offsets_at = meta[ch, SCALES_AT], meta[ch, OFFSETS_AT]
    small_at, supers_at = meta[ch, SMALL_AT], meta[ch, SUPERS_AT]
    levels = 2 if offsets_at >= 0 else 1
    per_super = SUPER // length
    if offsets_at < 0:
        ob[:] = 0  # a symmetric type: offset * sums adds nothing
    # (rows are read through slices indexed by the loop's own counter: an index computed from
    # meta is signed, and Numba's wraparound check on it kept LLVM from vectorizing these loops)
    for b in range(groups):
        if small_at >= 0:  # two levels, multiplied as gguf does: fl(d * sc), -fl(dmin * m), exact
            at = small_at + b * levels * CHUNK
            top = supers_at + (b // per_super) * levels * CHUNK
            d, sc = supers[top:top + CHUNK], small[at:at + CHUNK]
            for r in range(CHUNK):
                sb[r] = _half(d[r]) * np.float32(sc[r])
            if offsets_at >= 0:
                dmin, m = supers[top + CHUNK:top + 2 * CHUNK], small[at + CHUNK:at + 2 * CHUNK]
                for r in range(CHUNK):
                    ob[r] = -(_half(dmin[r]) * np.float32(m[r]))
        else:
            row = scale[scales_at + b * CHUNK:scales_at + (b + 1) * CHUNK]
            for r in range(CHUNK):
                sb[r] = widen(row[r])
            if offsets_at >= 0:
                row = offset[offsets_at + b * CHUNK:offsets_at + (b + 1) * CHUNK]
                for r in range(CHUNK):
                    ob[r] = widen(row[r])
        group_at = codes_at + b * stored * CHUNK
        plane_at, plane_shift = 0, 0
        if kind == BITS3_16:  # a pair of groups: each one's quad of bit pairs, then their word of third bits
            pair_at = codes_at + (b // 2) * 3 * QUAD * CHUNK
            group_at = pair_at + (b % 2) * QUAD * CHUNK
            plane_at, plane_shift = pair_at + 2 * QUAD * CHUNK, 4 * (b % 2)
        tile_kind = kind
        if not AVX2 and kind == GRID32:  # no pshufb: the group's grid values as int8 codes, BYTES32's layout
            _grid_values(codes, group_at - codes.ctypes.data, values)
            group_at, tile_kind = values.ctypes.data, BYTES32
        t = 0
        while t < tokens:
            left = tokens - t
            size = 6 if left >= 6 else left
            vectors = TILE_VECTORS[size]
            for v in range(0, 8, vectors):
                r4 = 4 * 8 * v
                _tile((group_at + r4, xq_at + t * xq_stride + b * length, xq_stride,
                       acc_at + 4 * t * CHUNK + r4, sb_at + r4, ob_at + r4,
                       dx_at + 4 * (t * dx_stride + b // per_block), dx_stride,
                       sx_at + 4 * (t * sx_stride + b), sx_stride, xs_at + 4 * (t * xs_stride + b), xs_stride,
                       bias, plane_at + r4, plane_shift), size, tile_kind)
            t += size
    rows = out.shape[1]
    for t in range(tokens):
        for r in range(CHUNK):
            if ch * CHUNK + r < rows:
                out[t, ch * CHUNK + r] = acc[t, r]


_GRID_VALUES = np.array(GRID, np.int8)


@njit(**_OPTS)
def _grid_values(codes, at, values):  # pragma: no cover - compiled
    """A GRID32 group's codes from byte `at` (quads of nibbles: byte i of quad q holds the indices of
    weights 4q+i and 16+4q+i) -> `values` in BYTES32's layout (quad q: weights 4q..4q+3), IQ4's
    grid values: the same int8 codes a BYTES32 chunk of the values would hold."""
    quad = QUAD * CHUNK
    for q in range(4):
        for k in range(quad):
            byte = codes[at + q * quad + k]
            values[q * quad + k] = _GRID_VALUES[byte & 15]
            values[(4 + q) * quad + k] = _GRID_VALUES[byte >> 4]


def _product_types(scale, offset) -> tuple:
    """The argument types part_product is compiled for (product_address), its weight's scales and
    offsets of these dtypes (Numba's: uint16 for halves, or float32): C arrays, activations()'s."""
    acts = types.Tuple((types.int8[:, ::1], *(types.float32[:, ::1],) * 3, *(types.int32[:, ::1],) * 2))
    return (types.uint8[::1], scale[::1], offset[::1], types.int8[::1], types.uint16[::1], types.int64[:, ::1], acts,
            types.float32[:, ::1], types.int64, types.int64)


# part_product(...) at an address (numba_calls.py: the products' code is compiled once, on its own,
# and not again inside each function that runs a product, nor inside each of its prange loops)
_call_product = caller(lambda given: _product_types(given[1].dtype, given[2].dtype))


@functools.cache
def product_address(scale: np.dtype, offset: np.dtype) -> int:
    """Where part_product's code starts for a weight whose scales and offsets are of these types
    (halves as uint16, or float32): what `matmul` and `decoder_body` call."""
    return address_of(part_product, _product_types(numba.from_dtype(np.dtype(scale)),
                                                   numba.from_dtype(np.dtype(offset))))


@njit(parallel=True, **_OPTS)
def _product(product_at, codes, scale, offset, small, supers, meta, acts, out, parts):  # pragma: no cover - compiled
    """out (tokens, rows) = the activations' tokens @ weight.T, runs of chunks shared out between
    threads: part_product at product_at (product_address(scale.dtype, offset.dtype)). One prange
    loop that every product runs (each loop is compiled as a function of its own)."""
    runs = min(parts, meta.shape[0])
    for part in prange(runs):
        _call_product(product_at, codes, scale, offset, small, supers, meta, acts, out, part, runs)


@njit(**_OPTS)
def matmul(codes, scale, offset, small, supers, meta, x, out, parts, product_at):  # pragma: no cover - compiled
    """out (tokens, rows) = x (tokens, cols) @ weight.T, x quantized to int8 per token (once),
    runs of chunks shared out between threads; product_at: product_address(scale.dtype, offset.dtype)."""
    _product(product_at, codes, scale, offset, small, supers, meta, activations(x), out, parts)


@intrinsic
def _float_of_bits(typingctx, bits):
    """An int32's 32 bits read as a float32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(**_OPTS)  # its own flags, not its callers' fastmath: reassociating would undo the split ln 2
def _exp(x):  # pragma: no cover - compiled
    """e^x in float32 by Cephes' expf (a degree-6 polynomial on x - n ln 2, times 2^n built in the
    exponent's bits): within 1.3 ulp (measured) where e^x is a normal float up to x = 88.37, x
    clamped to +-88.376 beyond (0 below, 2.4e38 above: attention's weights take the low end; SiLU's
    e^-g the high one for g < -88.4, where g / (1 + e^-g) is -0 either way). Written in arithmetic so
    LLVM vectorizes the loops that call it: libm's expf is a call per element (the SiLU of a
    17-token pass made 780,000 of them)."""
    x = min(max(x, np.float32(-88.3762626647949)), np.float32(88.3762626647949))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * _float_of_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(**_ROW_OPTS)
def _rms_norm(x, weight, eps, out):  # pragma: no cover - compiled
    """transformers' LlamaRMSNorm in float32, row by row."""
    for t in range(x.shape[0]):
        total = np.float32(0.0)
        for i in range(x.shape[1]):
            total += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(x.shape[1]) + eps)
        for i in range(x.shape[1]):
            out[t, i] = weight[i] * (x[t, i] * scale)


@njit(**_ROW_OPTS)
def _rope(v, cos, sin):  # pragma: no cover - compiled
    """transformers' apply_rotary_pos_emb on one head's row v (hd,): v * cos + rotate_half(v) * sin."""
    half = v.shape[0] // 2
    for i in range(half):
        a, b = v[i], v[i + half]
        v[i] = a * cos[i] - b * sin[i]
        v[i + half] = b * cos[i + half] + a * sin[i + half]


@njit(**_ROW_OPTS)
def _attend_group(qkv, t, first_head, count, keys, values, upto, scaling, attn, scores):  # pragma: no cover - compiled
    """Query heads first_head.. (count of them, one KV head's group) of token t, in qkv (n, ...),
    against positions 0..upto-1 of that KV head's keys and values (capacity, hd) -> attn[t, ...].
    scores (group, >= upto): scratch. Register tiles (kernel_tiles_numba.py): each key and value
    row read once serves up to 6 of the group's queries; each score one fixed 8-lane chain and
    tree, each output one fixed chain, whatever the tile."""
    hd = keys.shape[1]
    f = 4  # bytes a float
    q_at = qkv.ctypes.data + f * (t * qkv.strides[0] // f + first_head * hd)
    k_at, v_at, s_at = keys.ctypes.data, values.ctypes.data, scores.ctypes.data
    s_stride = scores.strides[0] // f
    out_at = attn.ctypes.data + f * (t * attn.strides[0] // f + first_head * hd)
    q0 = 0
    while q0 < count:  # scores = q . k, in blocks of 8 positions
        size = min(6, count - q0)
        block = DOT_ROWS[size]
        p = 0
        while p + 8 <= upto:
            for r in range(p, p + 8, block):
                args = (k_at + f * r * hd, hd, q_at + f * q0 * hd, hd, hd, s_at + f * (q0 * s_stride + r), s_stride)
                if size == 6:
                    _F6(*args)
                elif size == 5:
                    _F5(*args)
                elif size == 4:
                    _F4(*args)
                elif size == 3:
                    _F3(*args)
                elif size == 2:
                    _F2(*args)
                else:
                    _F1(*args)
            p += 8
        for r in range(p, upto):
            for g in range(q0, q0 + size):
                ONE_FLOAT_DOT(k_at + f * r * hd, hd, q_at + f * g * hd, hd, hd, s_at + f * (g * s_stride + r), s_stride)
        q0 += size
    for g in range(count):  # softmax, as transformers' eager attention in float32
        row = scores[g]
        top = np.float32(-np.inf)
        for p in range(upto):
            row[p] = row[p] * scaling
            top = max(top, row[p])
        total = np.float32(0.0)
        for p in range(upto):
            e = _exp(row[p] - top)
            row[p] = e
            total += e
        for p in range(upto):
            row[p] = row[p] / total
    q0 = 0
    while q0 < count:  # attn = weights @ values, 16 columns a tile
        size = min(6, count - q0)
        for c in range(0, hd, 16):
            args = (v_at + f * c, hd, s_at + f * q0 * s_stride, s_stride, upto, out_at + f * (q0 * hd + c), hd)
            if size == 6:
                _S6(*args)
            elif size == 5:
                _S5(*args)
            elif size == 4:
                _S4(*args)
            elif size == 3:
                _S3(*args)
            elif size == 2:
                _S2(*args)
            else:
                _S1(*args)
        q0 += size


# _attend_group's arguments: keys and values any layout (it reads them by address and row stride)
_ATTEND_TYPES = (types.float32[:, ::1], types.int64, types.int64, types.int64, types.float32[:, :], types.float32[:, :],
                 types.int64, types.float32, types.float32[:, ::1], types.float32[:, ::1])
_call_attend = caller(lambda given: _ATTEND_TYPES)  # called by address, as the products are


@functools.cache
def attend_address() -> int:
    """Where _attend_group's code starts: what decoder_body's and _attend_tree's loops call."""
    return address_of(_attend_group, _ATTEND_TYPES)


def addresses(products: list[tuple[np.dtype, np.dtype]]) -> np.ndarray:
    """decoder_body's `addresses`: each product's product_address (by its scales' and offsets'
    dtypes, in the order qkv, o, gate_up, down), then attend_address."""
    return np.array([*(product_address(scale, offset) for scale, offset in products), attend_address()], np.int64)


@njit(**_ROW_OPTS)
def _place(qkv_out, t, kh, q_width, kv_width, head_dim, keys, values, slot):  # pragma: no cover - compiled
    """Token t's key and value of KV head kh (from the pass's q/k/v rows) into `slot`."""
    base = q_width + kh * head_dim
    for i in range(head_dim):
        keys[kh, slot, i] = qkv_out[t, base + i]
        values[kh, slot, i] = qkv_out[t, base + kv_width + i]


@njit(parallel=True, **_ROW_OPTS)
def _attend_tree(qkv_out, parent, start, heads, kv_heads, head_dim, keys, values, scaling,
                 attn, attend_at):  # pragma: no cover - compiled
    """Attention of a token tree's pass (decoder_body's `parent`), each token bit for bit as a
    one-token step along its path would attend: over the context, then its path's keys and values
    in order, contiguous from `start`, the very rows and length `_attend_group` reads in that step.
    Each KV head takes the tokens in order and puts each token's path in place before it attends
    (rows that already hold the path's tokens are not copied again: siblings share their
    ancestors). Then every token's
    key and value go to start + t, the pass's own order, which StaticKV.keep compacts after the
    verdict."""
    n = parent.shape[0]
    group = heads // kv_heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    depth = np.empty(n, np.int64)
    for t in range(n):
        depth[t] = 0 if parent[t] < 0 else depth[parent[t]] + 1
    scores = np.empty((kv_heads, group, start + n), np.float32)
    for kh in prange(kv_heads):
        placed = np.full(n, -1, np.int64)  # the token whose key and value sit at start + d
        for t in range(n):
            u = t
            while u >= 0:  # the whole path: a shallower row may have been another branch's since
                if placed[depth[u]] != u:
                    _place(qkv_out, u, kh, q_width, kv_width, head_dim, keys, values, start + depth[u])
                    placed[depth[u]] = u
                u = parent[u]
            _call_attend(attend_at, qkv_out, t, kh * group, group, keys[kh], values[kh], start + depth[t] + 1,
                         scaling, attn, scores[kh])
        for t in range(n):
            _place(qkv_out, t, kh, q_width, kv_width, head_dim, keys, values, start + t)


@njit(**_OPTS)
def _arrays_of(product, layer):  # pragma: no cover - compiled
    """A layer's CodeBlocks arrays, from a product's tuple of typed lists (one per array)."""
    return product[0][layer], product[1][layer], product[2][layer], product[3][layer], product[4][layer], \
        product[5][layer]


@njit(parallel=True, **_ROW_OPTS)
def decoder_body(x, store, start, cos, sin, norms, eps, qk_norms, qk_eps, heads, kv_heads, head_dim,
                 scaling, inner, qkv, o, gate_up, down, final_norm, out, parts, parent,
                 addresses):  # pragma: no cover - compiled
    """x (n, D) float32, the residual stream of tokens at positions start..start+n-1, through every
    layer; keys and values written into store (layers, 2, kv_heads, capacity, hd); out (n, D): the
    final norm's output; inner: the MLP's width; parts: runs of chunks per product (the threads).
    norms (layers, 2, D): each layer's input and post-attention norm weights;
    qk_norms (layers, 2, hd) (Qwen3's per-head q/k norms) or (0, 2, hd) for none; cos/sin (n, hd).
    Each product (qkv, o, gate_up, down) is a tuple of typed lists, one per CodeBlocks array
    (CodeBlocks.ARRAYS), one entry per layer: each layer's product may hold any GGUF types, chunk
    by chunk.
    parent: empty for a causal pass; for a token tree's pass (app/engine/tree.py) (n,): token t's
    parent in the pass, t - 1 for the first tokens, read in order, and an earlier token for the
    tree's nodes (`_attend_tree`).
    addresses: where the compiled products and attention are (`addresses()`)."""
    n, width = x.shape
    group = heads // kv_heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    h = np.empty((n, width), np.float32)
    attn = np.empty((n, q_width), np.float32)
    for layer in range(len(qkv[0])):
        _rms_norm(x, norms[layer, 0], eps, h)
        h_acts = activations(h)
        qkv_out = np.empty((n, q_width + 2 * kv_width), np.float32)
        codes, scale, offset, small, supers, meta = _arrays_of(qkv, layer)
        _product(addresses[0], codes, scale, offset, small, supers, meta, h_acts, qkv_out, parts)
        keys, values = store[layer, 0], store[layer, 1]
        for t in range(n):
            for kh in range(heads + kv_heads):
                v = qkv_out[t, kh * head_dim:(kh + 1) * head_dim]
                if qk_norms.shape[0]:
                    weight = qk_norms[layer, 0] if kh < heads else qk_norms[layer, 1]
                    row = v.reshape((1, head_dim))
                    _rms_norm(row, weight, qk_eps, row)
                _rope(v, cos[t], sin[t])
            if not parent.shape[0]:  # (a tree's pass places its keys and values in _attend_tree)
                for kh in range(kv_heads):
                    _place(qkv_out, t, kh, q_width, kv_width, head_dim, keys, values, start + t)
        if parent.shape[0]:
            _attend_tree(qkv_out, parent, start, heads, kv_heads, head_dim, keys, values, scaling, attn, addresses[4])
        else:
            scores = np.empty((n * kv_heads, group, start + n), np.float32)
            for job in prange(n * kv_heads):
                t, kh = job // kv_heads, job % kv_heads
                _call_attend(addresses[4], qkv_out, t, kh * group, group, keys[kh], values[kh], start + t + 1,
                             scaling, attn, scores[job])
        y = np.empty((n, width), np.float32)
        attn_acts = activations(attn)
        codes, scale, offset, small, supers, meta = _arrays_of(o, layer)
        _product(addresses[1], codes, scale, offset, small, supers, meta, attn_acts, y, parts)
        x += y
        _rms_norm(x, norms[layer, 1], eps, h)
        h_acts = activations(h)
        gu_out = np.empty((n, 2 * inner), np.float32)
        codes, scale, offset, small, supers, meta = _arrays_of(gate_up, layer)
        _product(addresses[2], codes, scale, offset, small, supers, meta, h_acts, gu_out, parts)
        act = np.empty((n, inner), np.float32)
        for t in range(n):
            for i in range(inner):
                g = gu_out[t, i]
                act[t, i] = g / (np.float32(1.0) + _exp(-g)) * gu_out[t, inner + i]
        act_acts = activations(act)
        codes, scale, offset, small, supers, meta = _arrays_of(down, layer)
        _product(addresses[3], codes, scale, offset, small, supers, meta, act_acts, y, parts)
        x += y
    _rms_norm(x, final_norm, eps, out)


@njit(parallel=True, **_OPTS)
def screen(codes, scales, x, out, parts):  # pragma: no cover - compiled
    """out (tokens, rows) = x (tokens, width) @ (codes * scales[:, None]).T: the screened head's
    int8 pass (screened_head_torch.py) in float32, runs of rows shared out between threads. Each
    row's sum is one fixed chain whatever the number of tokens (kernel_tiles_numba's dot tiles), so
    every width gives a token the same bits; the sum's rounding is inside the head's bound
    (SCREEN_SUM_ROUNDING). width: a multiple of 8."""
    rows = codes.shape[0]
    parts = min(parts, rows)
    for part in prange(parts):
        _screen_rows(codes, scales, x, out, part * rows // parts, (part + 1) * rows // parts)


@njit(**_OPTS)
def _screen_rows(codes, scales, x, out, first, last):  # pragma: no cover - compiled
    tokens, width = x.shape
    a_stride, x_stride, out_stride = codes.strides[0], x.strides[0] // 4, out.strides[0] // 4
    a_at, x_at, out_at = codes.ctypes.data, x.ctypes.data, out.ctypes.data
    v = first
    while v + 8 <= last:  # blocks of 8 rows, each read by every token tile while it is in L1
        t = 0
        while t < tokens:
            left = tokens - t
            size = 6 if left >= 6 else left
            block = DOT_ROWS[size]
            for r in range(v, v + 8, block):
                args = (a_at + r * a_stride, a_stride, x_at + 4 * t * x_stride, x_stride, width,
                        out_at + 4 * (t * out_stride + r), out_stride)
                if size == 6:
                    _D6(*args)
                elif size == 5:
                    _D5(*args)
                elif size == 4:
                    _D4(*args)
                elif size == 3:
                    _D3(*args)
                elif size == 2:
                    _D2(*args)
                else:
                    _D1(*args)
            t += size
        v += 8
    for r in range(v, last):
        for t in range(tokens):
            ONE_CODE_DOT(a_at + r * a_stride, a_stride, x_at + 4 * t * x_stride, x_stride, width,
                         out_at + 4 * (t * out_stride + r), out_stride)
    for t in range(tokens):
        for r in range(first, last):
            out[t, r] = out[t, r] * scales[r]


@njit(parallel=True, **_OPTS)
def screen_candidates(screen, row_bound, h_norm, slack, limit):  # pragma: no cover - compiled
    """The screened head's rule on its float32 pass (screened_head_torch.py): row v of token t can
    be t's argmax unless screen[t, v] + bound < max_u (screen[t, u] - bound_u), with
    bound_v = row_bound[v] |h_t| + slack; rows from `limit` on are padding. Returns the (token,
    row) pairs that can, token by token, rows in order: what PyTorch's five passes over the
    (tokens, vocabulary) screen and a nonzero() gave, in two passes that stay in the cache."""
    tokens = screen.shape[0]
    counts = np.zeros(tokens + 1, np.int64)
    floors = np.empty(tokens, np.float32)
    for t in prange(tokens):
        h = h_norm[t]
        floor = np.float32(-np.inf)
        for v in range(limit):
            low = screen[t, v] - (row_bound[v] * h + slack)
            if low > floor:
                floor = low
        floors[t] = floor
        count = 0
        for v in range(limit):
            if screen[t, v] + (row_bound[v] * h + slack) >= floor:
                count += 1
        counts[t + 1] = count
    starts = np.cumsum(counts)
    pos = np.empty(starts[tokens], np.int64)
    rows = np.empty(starts[tokens], np.int64)
    for t in prange(tokens):
        h, floor, at = h_norm[t], floors[t], starts[t]
        for v in range(limit):
            if screen[t, v] + (row_bound[v] * h + slack) >= floor:
                pos[at] = t
                rows[at] = v
                at += 1
    return pos, rows


Q8_BLOCK = 2 + GROUP  # GGUF's Q8_0: an fp16 scale, then 32 int8 codes


@njit(**_OPTS)
def _q8_weight(row, i):  # pragma: no cover - compiled
    """Weight i of a Q8_0 row's bytes: scale * code, exact in float32 (11 + 8 significant bits),
    the value of gguf's own dequantization."""
    at = (i // GROUP) * Q8_BLOCK
    scale = _half(np.uint16(row[at]) | (np.uint16(row[at + 1]) << np.uint16(8)))
    return scale * np.float32(np.int8(row[at + 2 + i % GROUP]))


@njit(parallel=True, **_OPTS)
def q8_rows(data, ids, out):  # pragma: no cover - compiled
    """out (n, cols) = rows `ids` of a Q8_0 tensor's bytes (rows, cols / 32 * 34), dequantized:
    the embedding's lookup, reading only those rows of the memory-mapped file."""
    for k in prange(ids.shape[0]):
        row = data[ids[k]]
        for i in range(out.shape[1]):
            out[k, i] = _q8_weight(row, i)


@njit(parallel=True, **_OPTS)
def q8_dots(data, pos, rows, h, out):  # pragma: no cover - compiled
    """out[k] = h[pos[k]] . row rows[k] of a Q8_0 tensor, from its bytes: the screened head's exact
    rescoring of its candidates (a few a token on real text, hundreds on odd states), without
    dequantizing them into a table first.
    Each weight is gguf's value (scale * code, exact in float32), summed in order in one chain (no
    reassociation: a few pairs a token make its latency nothing), so a pair's value never depends
    on the pairs around it."""
    for k in prange(pos.shape[0]):
        row, x = data[rows[k]], h[pos[k]]
        total = np.float32(0.0)
        for b in range(x.shape[0] // GROUP):
            at = b * Q8_BLOCK
            scale = _half(np.uint16(row[at]) | (np.uint16(row[at + 1]) << np.uint16(8)))
            for i in range(GROUP):
                total += (scale * np.float32(np.int8(row[at + 2 + i]))) * x[b * GROUP + i]
        out[k] = total
