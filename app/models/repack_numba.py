"""A GGUF tensor's bytes straight into the kernel's layout (int4_cpu_torch.CodeBlocks), compiled.

The reference route decodes a tensor with numpy (gguf_codes.code_groups: codes, scales and
offsets as arrays) and then re-lays those arrays into chunks of 64 rows (CodeBlocks.fill): a
dozen passes over every weight, 7.8 s of a 3B Q4_K_M file's 18 s load on this 2-core CPU. Here
each block of the file is read once and its codes, its integer scales and its fp16 fields are
written where the kernel reads them, rows in parallel. The values are the reference's, bit for
bit (tests/test_repack.py compares every array): the codes are the same integers, and the scales
are the file's own fp16 fields copied as bits, where the reference converts them to float32 and
back (exact for every finite half).

Types: Q4_K and Q6_K (every K-quant preset's bulk), Q5_K (Q5_K_M's), Q3_K and Q2_K (the 2- and 3-bit
presets', for big models on small machines), Q5_0 and Q5_1 (where a row is not whole blocks of 256,
K-quant presets fall back on them), Q8_0, Q4_1 (the demo), Q4_0, IQ4_XS and IQ4_NL: every type the
kernel takes.

The layout written (CodeBlocks): within a chunk of 64 rows, group by group, the code bytes in
quads (bytes 4q..4q+3 of each row, row after row); per chunk and group the rows' scale fields
([chunk][group][level][row] for the integer scales, [chunk][super-block][level][row] for the fp16
d and dmin, [chunk][group][row] for a plain type's fp16 scale and offset).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from app.models import numba_cache
from app.models.gguf_codes import IQ4_KVALUES
from app.models.kernels_numba import _float_of_bits, _half

CHUNK = 64
QUAD = 4
_OPTS = dict(boundscheck=False, nogil=True, cache=numba_cache.install() == "")


@njit(inline="always")
def _quad(j):  # pragma: no cover - compiled
    """Where byte j of a row's group lies from the row's first: bytes 4q..4q+3 of the 64 rows side by
    side, quad after quad (CodeBlocks' layout), the row's own at QUAD * row."""
    return (j >> 2) * (QUAD * CHUNK) + (j & 3)


@njit(inline="always")
def _half_bits(b, at):  # pragma: no cover - compiled
    return b[at] | (b[at + 1] << 8)


@njit(inline="always")
def _scale_min_k4(b, gg):  # pragma: no cover - compiled
    """ggml's get_scale_min_k4: group gg's 6-bit sc and m from a K-quant block's 12 bytes at 4."""
    q = 4
    if gg < 4:
        return b[q + gg] & 63, b[q + gg + 4] & 63
    sc = (b[q + gg + 4] & 0x0F) | ((b[q + gg - 4] >> 6) << 4)
    m = (b[q + gg + 4] >> 4) | ((b[q + gg] >> 6) << 4)
    return sc, m


@njit(inline="always")
def _put_planes(codes, out, u, length, plane_bits):  # pragma: no cover - compiled
    """A row's group of unsigned 5- or 6-bit codes u[:length] stored from `out` as
    int4_cpu_torch.pack_planes lays them: the nibbles of weights j and j + length / 2 in byte j,
    then a word whose byte i holds quad q's high bits at plane_bits * q and 4 + plane_bits * q."""
    half = length // 2
    for j in range(half):
        codes[out + _quad(j)] = (u[j] & 15) | ((u[j + half] & 15) << 4)
    for i in range(QUAD):
        word = 0
        for q in range(half // QUAD):
            word |= ((u[4 * q + i] >> 4) << (plane_bits * q)) | ((u[half + 4 * q + i] >> 4) << (4 + plane_bits * q))
        codes[out + _quad(half + i)] = word


@njit(parallel=True, **_OPTS)
def k_quant(raw, codes, small, supers, codes_at, small_at, supers_at, block, qs_at):  # pragma: no cover - compiled
    """Q4_K (block 144: d, dmin, 12 bytes of sc/m, 128 of nibbles at 16) or Q5_K (block 176: the
    same, with 32 bytes of fifth bits at 16 and the nibbles at 48). Q4_K's codes stay nibbles, two
    to a byte (weight j and j + 16 of a group); Q5_K's are 5-bit codes in their two planes."""
    five = qs_at == 48
    n, nsuper = raw.shape[0], raw.shape[1] // block
    ngroups = nsuper * 8
    per_group = 20 if five else 16
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        u = np.empty(32, np.uint8)
        for sb in range(nsuper):
            b = raw[i, sb * block:(sb + 1) * block]
            for level in range(2):
                supers[supers_at + ((c * nsuper + sb) * 2 + level) * CHUNK + r] = _half_bits(b, 2 * level)
            for gg in range(8):
                g = sb * 8 + gg
                sc, m = _scale_min_k4(b, gg)
                small[small_at + ((c * ngroups + g) * 2) * CHUNK + r] = sc
                small[small_at + ((c * ngroups + g) * 2 + 1) * CHUNK + r] = m
                base, shift = qs_at + 32 * (gg // 2), 4 * (gg % 2)
                out = codes_at + (c * ngroups + g) * per_group * CHUNK + QUAD * r
                if five:
                    for j in range(32):
                        u[j] = ((b[base + j] >> shift) & 15) | (((b[16 + j] >> gg) & 1) << 4)
                    _put_planes(codes, out, u, 32, 1)
                else:
                    for jj in range(16):
                        low = (b[base + jj] >> shift) & 15
                        high = (b[base + jj + 16] >> shift) & 15
                        codes[out + _quad(jj)] = low | (high << 4)


@njit(parallel=True, **_OPTS)
def q6_k(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    """raw (n, row bytes) of Q6_K blocks (210 bytes: 128 of low nibbles, 64 of high pairs, 16 int8
    scales, d). Codes q (q - 32 plus the bias 32) in their two planes, groups of 16."""
    n = raw.shape[0]
    nsuper = raw.shape[1] // 210
    ngroups = nsuper * 16
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        u = np.empty(16, np.uint8)
        for sb in range(nsuper):
            b = raw[i, sb * 210:(sb + 1) * 210]
            supers[supers_at + (c * nsuper + sb) * CHUNK + r] = _half_bits(b, 208)
            for gi in range(16):
                g = sb * 16 + gi
                small[small_at + (c * ngroups + g) * CHUNK + r] = b[192 + gi]  # int8's bits
                for j in range(16):
                    w = gi * 16 + j
                    half, rest = w // 128, w % 128
                    low = (b[half * 64 + rest % 64] >> (4 * (rest // 64))) & 15
                    high = (b[128 + half * 32 + rest % 32] >> (2 * (rest // 32))) & 3
                    u[j] = low | (high << 4)
                _put_planes(codes, codes_at + (c * ngroups + g) * 12 * CHUNK + QUAD * r, u, 16, 2)


@njit(inline="always")
def _q3_k_scale(b, g):  # pragma: no cover - compiled
    """Q3_K's 6-bit scale of group g (0..15) less 32, from its 12 bytes at 96 (gguf_codes._q3_k_scales)."""
    low = (b[96 + g % 8] >> (4 * (g // 8))) & 15
    high = (b[104 + g % 4] >> (2 * (g // 4))) & 3
    return np.int64(low | (high << 4)) - 32


@njit(inline="always")
def _crumb(b, qs_at, w):  # pragma: no cover - compiled
    """Q2_K's or Q3_K's low bit pair of weight w (0..255): 32 bytes a half of 128 weights, shift 2s
    for weights 32s..32s+31 of the half."""
    half, rest = w // 128, w % 128
    return (b[qs_at + half * 32 + rest % 32] >> (2 * (rest // 32))) & 3


@njit(inline="always")
def _third_bit(b, w):  # pragma: no cover - compiled
    """Q3_K's high bit of weight w (0..255): bit w // 32 of mask byte w % 32 (1: q is the pair, 0: the pair - 4)."""
    return (b[w % 32] >> (w // 32)) & 1


@njit(parallel=True, **_OPTS)
def q2_k(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    """raw (n, row bytes) of Q2_K blocks (84 bytes: 16 of 4-bit sc and m, 64 of bit pairs, d,
    dmin). Codes q in 0..3, four a byte (int4_cpu_torch.pack_crumbs: byte i of a group's quad
    holds weights i, 4 + i, 8 + i, 12 + i), groups of 16."""
    n = raw.shape[0]
    nsuper = raw.shape[1] // 84
    ngroups = nsuper * 16
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for sb in range(nsuper):
            b = raw[i, sb * 84:(sb + 1) * 84]
            for level in range(2):
                supers[supers_at + ((c * nsuper + sb) * 2 + level) * CHUNK + r] = _half_bits(b, 80 + 2 * level)
            for gi in range(16):
                g = sb * 16 + gi
                small[small_at + (g + c * ngroups) * 2 * CHUNK + r] = b[gi] & 15
                small[small_at + ((g + c * ngroups) * 2 + 1) * CHUNK + r] = b[gi] >> 4
                out = codes_at + (c * ngroups + g) * QUAD * CHUNK + QUAD * r
                for j in range(QUAD):
                    byte = 0
                    for k in range(4):
                        byte |= _crumb(b, 16, gi * 16 + 4 * k + j) << (2 * k)
                    codes[out + j] = byte


@njit(parallel=True, **_OPTS)
def q3_k(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    """raw (n, row bytes) of Q3_K blocks (110 bytes: 32 of high-bit masks, 64 of bit pairs, 12 of
    6-bit scales, d). Codes q + 4 (q = low pair - 4 + 4 x the mask's bit) as int4_cpu_torch.pack_triples
    lays them: per pair of groups, each one's quad of bit pairs, then a word of their third bits."""
    n = raw.shape[0]
    nsuper = raw.shape[1] // 110
    ngroups = nsuper * 16
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for sb in range(nsuper):
            b = raw[i, sb * 110:(sb + 1) * 110]
            supers[supers_at + (c * nsuper + sb) * CHUNK + r] = _half_bits(b, 108)
            for gi in range(16):
                g = sb * 16 + gi
                small[small_at + (c * ngroups + g) * CHUNK + r] = _q3_k_scale(b, gi)
                pair = codes_at + (c * ngroups // 2 + g // 2) * 3 * QUAD * CHUNK + QUAD * r
                side = g % 2
                for j in range(QUAD):
                    byte = 0
                    for k in range(4):
                        byte |= _crumb(b, 32, gi * 16 + 4 * k + j) << (2 * k)
                    codes[pair + side * QUAD * CHUNK + j] = byte
                    top = codes[pair + 2 * QUAD * CHUNK + j] & (0xF0 if side == 0 else 0x0F)  # the pair's other half
                    for k in range(4):
                        w = gi * 16 + 4 * k + j
                        top |= _third_bit(b, w) << (4 * side + k)
                    codes[pair + 2 * QUAD * CHUNK + j] = top


@intrinsic
def _half_of(typingctx, value):
    """A float32 -> its IEEE half's 16 bits (rounded to nearest; exact where the half holds it)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@njit(parallel=True, **_OPTS)
def plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, block, code_bytes):  # pragma: no cover - compiled
    """A type of blocks of 32 whose code bytes are already the kernel's: Q8_0 (34 bytes: d, 32
    int8), Q4_1 (20 bytes: d, m, 16 bytes whose low nibbles are weights 0..15 and high ones 16..31,
    as the kernel packs weight j and j + 16) or Q4_0 (18 bytes: d and the same 16 bytes; its offset
    is -8 d, which the caller has checked a half holds exactly). The fp16 fields are copied as bits."""
    n = raw.shape[0]
    ngroups = raw.shape[1] // block
    first = block - code_bytes  # the fields before the codes: d, or d and m
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for g in range(ngroups):
            at = g * block
            d_bits = raw[i, at] | (np.uint16(raw[i, at + 1]) << 8)
            scale[scale_at + (c * ngroups + g) * CHUNK + r] = d_bits
            if first == 4:
                offset[offset_at + (c * ngroups + g) * CHUNK + r] = raw[i, at + 2] | (raw[i, at + 3] << 8)
            elif block == 18:
                offset[offset_at + (c * ngroups + g) * CHUNK + r] = _half_of(_half(d_bits) * np.float32(-8.0))
            out = codes_at + (c * ngroups + g) * code_bytes * CHUNK + QUAD * r
            for j in range(code_bytes):
                codes[out + _quad(j)] = raw[i, at + first + j]





@njit(parallel=True, **_OPTS)
def five_plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, block):  # pragma: no cover - compiled
    """Q5_0 (22 bytes: d, 4 bytes qh, 16 of nibbles) or Q5_1 (24 bytes: d, m, qh, nibbles). The
    nibble bytes are already the kernel's (low nibble weight j, high j + 16); the fifth bits (qh's
    bit j for weight j) are re-laid into the plane's word (pack_planes). The fp16 fields as bits."""
    n = raw.shape[0]
    ngroups = raw.shape[1] // block
    first = block - 20  # the fields before qh: d, or d and m
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for g in range(ngroups):
            at = g * block
            scale[scale_at + (c * ngroups + g) * CHUNK + r] = raw[i, at] | (np.uint16(raw[i, at + 1]) << 8)
            if first == 4:
                offset[offset_at + (c * ngroups + g) * CHUNK + r] = raw[i, at + 2] | (np.uint16(raw[i, at + 3]) << 8)
            qh = np.uint32(raw[i, at + first]) | (np.uint32(raw[i, at + first + 1]) << 8) | \
                (np.uint32(raw[i, at + first + 2]) << 16) | (np.uint32(raw[i, at + first + 3]) << 24)
            out = codes_at + (c * ngroups + g) * 20 * CHUNK + QUAD * r
            for j in range(16):
                codes[out + _quad(j)] = raw[i, at + first + 4 + j]
            for k in range(QUAD):
                word = 0
                for q in range(4):
                    word |= (((qh >> (4 * q + k)) & 1) << q) | (((qh >> (16 + 4 * q + k)) & 1) << (4 + q))
                codes[out + _quad(16 + k)] = word


@njit(parallel=True, **_OPTS)
def iq4_nl(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    """IQ4_NL (18 bytes: d, 16 bytes of grid indices, low nibble weight j, high j + 16): the
    indices are the kernel's as they are (GRID32), d copied as bits; no offset."""
    n = raw.shape[0]
    ngroups = raw.shape[1] // 18
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for g in range(ngroups):
            at = g * 18
            scale[scale_at + (c * ngroups + g) * CHUNK + r] = raw[i, at] | (np.uint16(raw[i, at + 1]) << 8)
            out = codes_at + (c * ngroups + g) * 16 * CHUNK + QUAD * r
            for j in range(16):
                codes[out + _quad(j)] = raw[i, at + 2 + j]


@njit(parallel=True, **_OPTS)
def iq4_xs(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    """IQ4_XS (136 bytes: d, scales_h (uint16), scales_l (4 bytes), 128 bytes of grid indices, 16
    a group of 32 as IQ4_NL's): ls - 32 per group as the integer scale (6 bits: low 4 from
    scales_l, high 2 from scales_h), d as the super-block's half; the indices as they are."""
    n = raw.shape[0]
    nsuper = raw.shape[1] // 136
    ngroups = nsuper * 8
    for i in prange(n):
        c, r = i // CHUNK, i % CHUNK
        for sb in range(nsuper):
            b = raw[i, sb * 136:(sb + 1) * 136]
            supers[supers_at + (c * nsuper + sb) * CHUNK + r] = _half_bits(b, 0)
            high_bits = np.int32(b[2]) | (np.int32(b[3]) << 8)
            for gg in range(8):
                g = sb * 8 + gg
                ls = ((np.int32(b[4 + gg // 2]) >> (4 * (gg % 2))) & 15) | (((high_bits >> (2 * gg)) & 3) << 4)
                small[small_at + (c * ngroups + g) * CHUNK + r] = ls - 32  # an int8's bits
                out = codes_at + (c * ngroups + g) * 16 * CHUNK + QUAD * r
                for j in range(16):
                    codes[out + _quad(j)] = b[8 + 16 * gg + j]


# --- Rows as float32, by gguf's own arithmetic (gguf.quants' dequantize_blocks, operation for
# operation, in float32: each product rounded, then the offset subtracted or added; no fused
# multiply-add, as numpy has none). For what reads a tensor's rows as numbers: the output head's
# int8 screen, the rescored rows, the int8-per-row layers. tests/test_repack.py checks the bits.

@njit(parallel=True, **_OPTS)
def k_rows(raw, out, block, qs_at):  # pragma: no cover - compiled
    """Q4_K's or Q5_K's rows (the layouts of k_quant): fl(d * sc) * q - fl(dmin * m)."""
    five = qs_at == 48
    n, nsuper = raw.shape[0], raw.shape[1] // block
    for i in prange(n):
        for sb in range(nsuper):
            b = raw[i, sb * block:(sb + 1) * block]
            d, dmin = _half(np.uint16(_half_bits(b, 0))), _half(np.uint16(_half_bits(b, 2)))
            for gg in range(8):
                sc, m = _scale_min_k4(b, gg)
                scale, offset = d * np.float32(sc), dmin * np.float32(m)
                base, shift = qs_at + 32 * (gg // 2), 4 * (gg % 2)
                at = sb * 256 + gg * 32
                for j in range(32):
                    q = (b[base + j] >> shift) & 15
                    if five:
                        q |= ((b[16 + j] >> gg) & 1) << 4
                    out[i, at + j] = scale * np.float32(q) - offset




@njit(parallel=True, **_OPTS)
def rows_q6_k(raw, out):  # pragma: no cover - compiled
    n, nsuper = raw.shape[0], raw.shape[1] // 210
    for i in prange(n):
        for sb in range(nsuper):
            b = raw[i, sb * 210:(sb + 1) * 210]
            d = _half(np.uint16(_half_bits(b, 208)))
            for gi in range(16):
                sc = np.int8(b[192 + gi])
                scale = d * np.float32(sc)
                for j in range(16):
                    w = gi * 16 + j
                    half, rest = w // 128, w % 128
                    low = (b[half * 64 + rest % 64] >> (4 * (rest // 64))) & 15
                    high = (b[128 + half * 32 + rest % 32] >> (2 * (rest // 32))) & 3
                    out[i, sb * 256 + w] = scale * np.float32((low | (high << 4)) - 32)


@njit(parallel=True, **_OPTS)
def rows_q2_k(raw, out):  # pragma: no cover - compiled
    """Q2_K's rows (q2_k's layout): fl(d * sc) * q - fl(dmin * m)."""
    n, nsuper = raw.shape[0], raw.shape[1] // 84
    for i in prange(n):
        for sb in range(nsuper):
            b = raw[i, sb * 84:(sb + 1) * 84]
            d, dmin = _half(np.uint16(_half_bits(b, 80))), _half(np.uint16(_half_bits(b, 82)))
            for gi in range(16):
                scale, offset = d * np.float32(b[gi] & 15), dmin * np.float32(b[gi] >> 4)
                for j in range(16):
                    w = gi * 16 + j
                    out[i, sb * 256 + w] = scale * np.float32(_crumb(b, 16, w)) - offset


@njit(parallel=True, **_OPTS)
def rows_q3_k(raw, out):  # pragma: no cover - compiled
    """Q3_K's rows (q3_k's layout): fl(d * (sc - 32)) * q, q = low pair - 4 + 4 x the mask's bit."""
    n, nsuper = raw.shape[0], raw.shape[1] // 110
    for i in prange(n):
        for sb in range(nsuper):
            b = raw[i, sb * 110:(sb + 1) * 110]
            d = _half(np.uint16(_half_bits(b, 108)))
            for gi in range(16):
                scale = d * np.float32(_q3_k_scale(b, gi))
                for j in range(16):
                    w = gi * 16 + j
                    q = np.int64(_crumb(b, 32, w)) - 4 + 4 * np.int64(_third_bit(b, w))
                    out[i, sb * 256 + w] = scale * np.float32(q)


@njit(parallel=True, **_OPTS)
def rows_q8_0(raw, out):  # pragma: no cover - compiled
    n, ngroups = raw.shape[0], raw.shape[1] // 34
    for i in prange(n):
        for g in range(ngroups):
            d = _half(np.uint16(raw[i, g * 34] | (np.uint16(raw[i, g * 34 + 1]) << 8)))
            for j in range(32):
                out[i, g * 32 + j] = np.float32(np.int8(raw[i, g * 34 + 2 + j])) * d


@njit(parallel=True, **_OPTS)
def nibble_rows(raw, out, block):  # pragma: no cover - compiled
    """Q4_1's rows (block 20: d, m, 16 bytes of nibbles): fl(d * q) + m; or Q4_0's (block 18: d and
    the nibbles): d * (q - 8). Low nibbles are weights 0..15 of a block, high ones 16..31."""
    n, ngroups = raw.shape[0], raw.shape[1] // block
    first = block - 16
    for i in prange(n):
        for g in range(ngroups):
            at = g * block
            d = _half(np.uint16(raw[i, at] | (np.uint16(raw[i, at + 1]) << 8)))
            m = _half(np.uint16(raw[i, at + 2] | (np.uint16(raw[i, at + 3]) << 8))) if first == 4 else np.float32(0)
            for j in range(16):
                byte = raw[i, at + first + j]
                for half in range(2):
                    q = (byte >> (4 * half)) & 15
                    if first == 4:
                        out[i, g * 32 + 16 * half + j] = d * np.float32(q) + m
                    else:
                        out[i, g * 32 + 16 * half + j] = d * np.float32(np.int8(q) - 8)


@njit(parallel=True, **_OPTS)
def five_rows(raw, out, block):  # pragma: no cover - compiled
    """Q5_0's rows (block 22): d * (q - 16); Q5_1's (block 24): fl(d * q) + m; q's fifth bit is
    qh's bit j for weight j, its nibble as Q4's."""
    n, ngroups = raw.shape[0], raw.shape[1] // block
    first = block - 20
    for i in prange(n):
        for g in range(ngroups):
            at = g * block
            d = _half(np.uint16(raw[i, at] | (np.uint16(raw[i, at + 1]) << 8)))
            m = _half(np.uint16(raw[i, at + 2] | (np.uint16(raw[i, at + 3]) << 8))) if first == 4 else np.float32(0)
            qh = np.uint32(raw[i, at + first]) | (np.uint32(raw[i, at + first + 1]) << 8) | \
                (np.uint32(raw[i, at + first + 2]) << 16) | (np.uint32(raw[i, at + first + 3]) << 24)
            for j in range(16):
                byte = raw[i, at + first + 4 + j]
                for half in range(2):
                    w = 16 * half + j
                    q = np.int32((byte >> (4 * half)) & 15) | np.int32(((qh >> w) & 1) << 4)
                    if first == 4:
                        out[i, g * 32 + w] = d * np.float32(q) + m
                    else:
                        out[i, g * 32 + w] = d * np.float32(q - 16)


# Each type's entry point calls a shared body with its block layout as constants: Numba links the
# body into the caller, and LLVM specializes it on them. Measured on a 8192 x 3072 Q4_K weight in
# memory, 8 alternating runs in one process (2 threads): 1.31 GB/s this way, 0.69 GB/s calling the
# body with the layout as values.

@njit(**_OPTS)
def q4_k(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    k_quant(raw, codes, small, supers, codes_at, small_at, supers_at, 144, 16)


@njit(**_OPTS)
def q5_k(raw, codes, small, supers, codes_at, small_at, supers_at):  # pragma: no cover - compiled
    k_quant(raw, codes, small, supers, codes_at, small_at, supers_at, 176, 48)


@njit(**_OPTS)
def q8_0(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, 34, 32)


@njit(**_OPTS)
def q4_1(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, 20, 16)


@njit(**_OPTS)
def q4_0(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, 18, 16)


@njit(**_OPTS)
def rows_q4_k(raw, out):  # pragma: no cover - compiled
    k_rows(raw, out, 144, 16)


@njit(**_OPTS)
def rows_q5_k(raw, out):  # pragma: no cover - compiled
    k_rows(raw, out, 176, 48)


@njit(**_OPTS)
def rows_q4_1(raw, out):  # pragma: no cover - compiled
    nibble_rows(raw, out, 20)


@njit(**_OPTS)
def rows_q4_0(raw, out):  # pragma: no cover - compiled
    nibble_rows(raw, out, 18)


@njit(**_OPTS)
def q5_0(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    five_plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, 22)


@njit(**_OPTS)
def q5_1(raw, codes, scale, offset, codes_at, scale_at, offset_at):  # pragma: no cover - compiled
    five_plain(raw, codes, scale, offset, codes_at, scale_at, offset_at, 24)


@njit(**_OPTS)
def rows_q5_0(raw, out):  # pragma: no cover - compiled
    five_rows(raw, out, 22)


@njit(**_OPTS)
def rows_q5_1(raw, out):  # pragma: no cover - compiled
    five_rows(raw, out, 24)


@intrinsic
def _bits_of_float(typingctx, value):
    """A float32's 32 bits as an int32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@njit(fastmath=True, **_OPTS)
def _sum_squares(v):  # pragma: no cover - compiled
    """Σ v², in any order (fastmath: vectorized); a norm under the bound's SLACK."""
    total = np.float32(0.0)
    for j in range(v.shape[0]):
        total += v[j] * v[j]
    return total


@njit(parallel=True, **_OPTS)
def screen_rows(rows, codes, scale_bits, error_norm, screen_norm):  # pragma: no cover - compiled
    """The screened head's int8 screen of float32 rows (n, D), rows in parallel: ScreenedHead.fill's
    arithmetic (scale = bfloat16(max|w| / 127), codes = rint(w / scale), each an exact float32
    operation in any order), the same codes and scales bit for bit; the two norms summed in
    float32 in whatever order vectorizes (ScreenedHead's bound has SLACK under it for that)."""
    n, dim = rows.shape
    for i in prange(n):
        row = rows[i]
        amax = np.float32(0.0)
        for j in range(dim):
            amax = max(amax, abs(row[j]))
        amax = max(amax, np.float32(1e-30)) / np.float32(127.0)
        # float32 -> bfloat16, to nearest even (PyTorch's conversion); the top 16 bits kept
        bits = np.int64(_bits_of_float(amax))  # positive and finite: below 2**31
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        scale_bits[i] = np.uint16(bits)
        scale = _float_of_bits(np.int32(bits << 16))
        screen = np.empty(dim, np.float32)
        error = np.empty(dim, np.float32)
        for j in range(dim):
            q = min(max(np.rint(row[j] / scale), np.float32(-127.0)), np.float32(127.0))
            codes[i, j] = np.int8(q)
            screen[j] = q * scale
            error[j] = row[j] - screen[j]
        error_norm[i] = np.sqrt(_sum_squares(error))
        screen_norm[i] = np.sqrt(_sum_squares(screen))


_GRID = IQ4_KVALUES.astype(np.float32)  # IQ4's grid (ggml's kvalues_iq4nl), for the rows below


@njit(parallel=True, **_OPTS)
def rows_iq4_nl(raw, out):  # pragma: no cover - compiled
    """IQ4_NL's rows: d * kvalues[q]."""
    n, ngroups = raw.shape[0], raw.shape[1] // 18
    for i in prange(n):
        for g in range(ngroups):
            d = _half(np.uint16(raw[i, g * 18] | (np.uint16(raw[i, g * 18 + 1]) << 8)))
            for j in range(16):
                byte = raw[i, g * 18 + 2 + j]
                out[i, g * 32 + j] = d * _GRID[byte & 15]
                out[i, g * 32 + 16 + j] = d * _GRID[byte >> 4]


@njit(parallel=True, **_OPTS)
def rows_iq4_xs(raw, out):  # pragma: no cover - compiled
    """IQ4_XS's rows: fl(d * (ls - 32)) * kvalues[q]."""
    n, nsuper = raw.shape[0], raw.shape[1] // 136
    for i in prange(n):
        for sb in range(nsuper):
            b = raw[i, sb * 136:(sb + 1) * 136]
            d = _half(np.uint16(_half_bits(b, 0)))
            high_bits = np.int32(b[2]) | (np.int32(b[3]) << 8)
            for gg in range(8):
                ls = ((np.int32(b[4 + gg // 2]) >> (4 * (gg % 2))) & 15) | (((high_bits >> (2 * gg)) & 3) << 4)
                scale = d * np.float32(ls - 32)
                for j in range(16):
                    byte = b[8 + 16 * gg + j]
                    out[i, sb * 256 + gg * 32 + j] = scale * _GRID[byte & 15]
                    out[i, sb * 256 + gg * 32 + 16 + j] = scale * _GRID[byte >> 4]
