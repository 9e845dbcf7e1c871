"""The compiled half of int4_cpu_torch.py: Numba functions (LLVM, built for the CPU they run on,
kept on disk in Tandem's cache). Importing this module imports Numba; int4_cpu_torch.py imports
it only when the kernel is wanted, and says why where it cannot be.

Two things are compiled here:

- `matmul`: a 4-bit weight (Int4Blocks' layout) times float32 activations;
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

import sys

import numpy as np
from llvmlite import ir
from numba import njit, prange, types  # noqa: F401 - prange is read by the parallel functions
from numba.extending import intrinsic, overload

CHUNK = 64
GROUP = 32
HALF = GROUP // 2

# The products: "contract" lets LLVM fuse a multiply and an add into one FMA; no reassociation, so
# a row's sum runs in the order written, the same for one token or many.
# cache: the compiled code is kept in Tandem's cache folder (NUMBA_CACHE_DIR, int4_cpu_torch.py);
# a frozen bundle has no source files for Numba to key its cache on, so it compiles at each start
_OPTS = dict(boundscheck=False, error_model="numpy", nogil=True, cache=not getattr(sys, "frozen", False),
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


@njit(**_OPTS)
def part_product(codes, scale, offset, x, out, part, parts):  # pragma: no cover - compiled
    """The part-th of `parts` runs of chunks of out (tokens, rows) = x (tokens, cols) @ weight.T,
    with its scratch allocated once for the run."""
    chunks, tokens = codes.shape[0], x.shape[0]
    first, last = part * chunks // parts, (part + 1) * chunks // parts
    decoded = np.empty((GROUP, CHUNK), np.float32)
    acc = np.empty((tokens, CHUNK), np.float32)
    scratch = np.empty((2, CHUNK), np.float32)
    groups = codes.shape[1]
    sums = np.empty((tokens, groups), np.float32)  # each group's activations summed, for the offsets
    for t in range(tokens):
        for b in range(groups):
            total = np.float32(0.0)
            for j in range(GROUP):
                total += x[t, b * GROUP + j]
            sums[t, b] = total
    for ch in range(first, last):
        chunk_product(codes, scale, offset, x, sums, out, ch, decoded, acc, scratch)


@njit(**_OPTS)
def chunk_product(codes, scale, offset, x, sums, out, ch, decoded, acc, scratch):  # pragma: no cover - compiled
    """Rows ch * CHUNK.. of out (tokens, rows) = x (tokens, cols) @ the weight's rows, transposed.

    Group by group: the group's 32 x CHUNK weights are decoded once into `decoded` (L1-sized),
    then each token's 32 activations are held while one loop over the rows sums all 32 products
    of a row in two chains of FMAs, even and odd (written out, so the sums stay in registers and
    LLVM vectorizes across rows). The order of that sum is fixed in the code: one token or many, the same bits."""
    groups = codes.shape[1]
    tokens = x.shape[0]
    sb, ob = scratch[0], scratch[1]
    acc[:] = 0
    for b in range(groups):
        for j in range(HALF):  # byte j holds weight j (low nibble) and weight j + 16 (high)
            column = codes[ch, b, j]
            for r in range(CHUNK):
                f = np.float32(column[r])
                h = np.floor(f * np.float32(0.0625))
                decoded[j + HALF, r] = h
                decoded[j, r] = f - np.float32(16.0) * h
        scale_row, offset_row = scale[ch, b], offset[ch, b]
        for r in range(CHUNK):
            sb[r] = widen(scale_row[r])
            ob[r] = widen(offset_row[r])
        base = b * GROUP
        for t in range(tokens):
            x0  = x[t, base + 0]
            x1  = x[t, base + 1]
            x2  = x[t, base + 2]
            x3  = x[t, base + 3]
            x4  = x[t, base + 4]
            x5  = x[t, base + 5]
            x6  = x[t, base + 6]
            x7  = x[t, base + 7]
            x8  = x[t, base + 8]
            x9  = x[t, base + 9]
            x10 = x[t, base + 10]
            x11 = x[t, base + 11]
            x12 = x[t, base + 12]
            x13 = x[t, base + 13]
            x14 = x[t, base + 14]
            x15 = x[t, base + 15]
            x16 = x[t, base + 16]
            x17 = x[t, base + 17]
            x18 = x[t, base + 18]
            x19 = x[t, base + 19]
            x20 = x[t, base + 20]
            x21 = x[t, base + 21]
            x22 = x[t, base + 22]
            x23 = x[t, base + 23]
            x24 = x[t, base + 24]
            x25 = x[t, base + 25]
            x26 = x[t, base + 26]
            x27 = x[t, base + 27]
            x28 = x[t, base + 28]
            x29 = x[t, base + 29]
            x30 = x[t, base + 30]
            x31 = x[t, base + 31]
            total = sums[t, b]
            into = acc[t]
            for r in range(CHUNK):
                even = decoded[0, r] * x0
                odd = decoded[1, r] * x1
                even = even + decoded[2, r] * x2
                odd = odd + decoded[3, r] * x3
                even = even + decoded[4, r] * x4
                odd = odd + decoded[5, r] * x5
                even = even + decoded[6, r] * x6
                odd = odd + decoded[7, r] * x7
                even = even + decoded[8, r] * x8
                odd = odd + decoded[9, r] * x9
                even = even + decoded[10, r] * x10
                odd = odd + decoded[11, r] * x11
                even = even + decoded[12, r] * x12
                odd = odd + decoded[13, r] * x13
                even = even + decoded[14, r] * x14
                odd = odd + decoded[15, r] * x15
                even = even + decoded[16, r] * x16
                odd = odd + decoded[17, r] * x17
                even = even + decoded[18, r] * x18
                odd = odd + decoded[19, r] * x19
                even = even + decoded[20, r] * x20
                odd = odd + decoded[21, r] * x21
                even = even + decoded[22, r] * x22
                odd = odd + decoded[23, r] * x23
                even = even + decoded[24, r] * x24
                odd = odd + decoded[25, r] * x25
                even = even + decoded[26, r] * x26
                odd = odd + decoded[27, r] * x27
                even = even + decoded[28, r] * x28
                odd = odd + decoded[29, r] * x29
                even = even + decoded[30, r] * x30
                odd = odd + decoded[31, r] * x31
                s = even + odd
                into[r] = into[r] + (sb[r] * s + ob[r] * total)
    rows = out.shape[1]
    for t in range(tokens):
        for r in range(CHUNK):
            if ch * CHUNK + r < rows:
                out[t, ch * CHUNK + r] = acc[t, r]


@njit(parallel=True, **_OPTS)
def matmul(codes, scale, offset, x, out, parts):  # pragma: no cover - compiled
    """out (tokens, rows) = x (tokens, cols) @ weight.T, runs of chunks shared out between threads."""
    parts = min(parts, codes.shape[0])
    for part in prange(parts):
        part_product(codes, scale, offset, x, out, part, parts)


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
def _attend(q, keys, values, upto, scaling, out, scores):  # pragma: no cover - compiled
    """One query head (hd,) against positions 0..upto-1 of its KV head -> out (hd,)."""
    top = np.float32(-np.inf)
    for p in range(upto):
        s = np.float32(0.0)
        for i in range(q.shape[0]):
            s += q[i] * keys[p, i]
        s *= scaling
        scores[p] = s
        top = max(top, s)
    total = np.float32(0.0)
    for p in range(upto):
        e = np.exp(scores[p] - top)
        scores[p] = e
        total += e
    out[:] = 0
    for p in range(upto):
        w = scores[p] / total
        for i in range(q.shape[0]):
            out[i] = out[i] + w * values[p, i]


@njit(parallel=True, **_ROW_OPTS)
def decoder_body(x, store, start, cos, sin, norms, eps, qk_norms, qk_eps, heads, kv_heads, head_dim,
                 scaling, inner, qkv_c, qkv_s, qkv_o, o_c, o_s, o_o, gu_c, gu_s, gu_o, down_c, down_s, down_o,
                 final_norm, out, parts):  # pragma: no cover - compiled
    """x (n, D) float32, the residual stream of tokens at positions start..start+n-1, through every
    layer; keys and values written into store (layers, 2, kv_heads, capacity, hd); out (n, D): the
    final norm's output; inner: the MLP's width; parts: runs of chunks per product (the threads).
    norms (layers, 2, D): each layer's input and post-attention norm weights;
    qk_norms (layers, 2, hd) (Qwen3's per-head q/k norms) or (0, 2, hd) for none; cos/sin (n, hd).
    The products' arrays are typed lists, one Int4Blocks field per layer."""
    n, width = x.shape
    group = heads // kv_heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    h = np.empty((n, width), np.float32)
    attn = np.empty((n, q_width), np.float32)
    for layer in range(len(qkv_c)):
        _rms_norm(x, norms[layer, 0], eps, h)
        codes, scale, offset = qkv_c[layer], qkv_s[layer], qkv_o[layer]
        qkv = np.empty((n, q_width + 2 * kv_width), np.float32)
        for part in prange(min(parts, codes.shape[0])):
            part_product(codes, scale, offset, h, qkv, part, min(parts, codes.shape[0]))
        keys, values = store[layer, 0], store[layer, 1]
        for t in range(n):
            for kh in range(heads + kv_heads):
                v = qkv[t, kh * head_dim:(kh + 1) * head_dim]
                if qk_norms.shape[0]:
                    weight = qk_norms[layer, 0] if kh < heads else qk_norms[layer, 1]
                    row = v.reshape((1, head_dim))
                    _rms_norm(row, weight, qk_eps, row)
                _rope(v, cos[t], sin[t])
            for kh in range(kv_heads):
                base = q_width + kh * head_dim
                for i in range(head_dim):
                    keys[kh, start + t, i] = qkv[t, base + i]
                    values[kh, start + t, i] = qkv[t, base + kv_width + i]
        scores = np.empty((n * heads, start + n), np.float32)
        for job in prange(n * heads):
            t, head = job // heads, job % heads
            kh = head // group
            _attend(qkv[t, head * head_dim:(head + 1) * head_dim], keys[kh], values[kh], start + t + 1,
                    scaling, attn[t, head * head_dim:(head + 1) * head_dim], scores[job])
        codes, scale, offset = o_c[layer], o_s[layer], o_o[layer]
        y = np.empty((n, width), np.float32)
        for part in prange(min(parts, codes.shape[0])):
            part_product(codes, scale, offset, attn, y, part, min(parts, codes.shape[0]))
        x += y
        _rms_norm(x, norms[layer, 1], eps, h)
        codes, scale, offset = gu_c[layer], gu_s[layer], gu_o[layer]
        gate_up = np.empty((n, 2 * inner), np.float32)
        for part in prange(min(parts, codes.shape[0])):
            part_product(codes, scale, offset, h, gate_up, part, min(parts, codes.shape[0]))
        act = np.empty((n, inner), np.float32)
        for t in range(n):
            for i in range(inner):
                g = gate_up[t, i]
                act[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, inner + i]
        codes, scale, offset = down_c[layer], down_s[layer], down_o[layer]
        for part in prange(min(parts, codes.shape[0])):
            part_product(codes, scale, offset, act, y, part, min(parts, codes.shape[0]))
        x += y
    _rms_norm(x, final_norm, eps, out)


@njit(parallel=True, **_ROW_OPTS)
def screen(codes, scales, x, out, parts):  # pragma: no cover - compiled
    """out (tokens, rows) = x (tokens, width) @ (codes * scales[:, None]).T: the screened head's
    int8 pass (screened_head_torch.py) in float32. Each row's sum is one loop whatever the number
    of tokens (LLVM vectorizes it; its order is fixed at compile time), so every width gives a
    token the same bits; the sum's rounding is inside the head's bound (SCREEN_SUM_ROUNDING)."""
    rows, width = codes.shape
    tokens = x.shape[0]
    parts = min(parts, rows)
    for part in prange(parts):
        weights = np.empty(width, np.float32)  # the row's codes as floats, once for all tokens
        for v in range(part * rows // parts, (part + 1) * rows // parts):
            row = codes[v]
            for i in range(width):
                weights[i] = np.float32(row[i])
            for t in range(tokens):
                xt = x[t]
                s = np.float32(0.0)
                for i in range(width):
                    s += weights[i] * xt[i]
                out[t, v] = s * scales[v]
