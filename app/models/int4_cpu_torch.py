"""Tandem's CPU matrix product for GGUF weights, compiled by Numba (LLVM) for the machine it runs on:
every common GGUF type's codes as the file has them (gguf_codes.py: 4-bit codes in groups of 32,
int8 codes in groups of 32 or 16), times activations quantized to int8 per token. (The file keeps
its first name: it began with the 4-bit types.)

Why: PyTorch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`, tinygemm's layout) has its fast
path in AVX-512; on an AVX2 CPU it read the demo's 4-bit weights at ~5 GB/s, 12 ms of a 35 ms
step, where llama.cpp reads the same file at ~9 GB/s (docs/performance.md), and its int8 kernel
has no group scales at all. This kernel computes, per group b of a row r and token t,

    y[t, r] = sum over b: fl(scale[r, b] * dx[t, b]) * sum_j q[r, b, j] xq[t, b, j] + offset[r, b] * sx[t, b]

with the inner sums in integers (int8_tiles_numba.py), which is the file's weights
w = scale * q + offset times the token's quantized activations dx * xq (sx: their sum over the
group). The scales are the file's own (fp16 fields as halves; the K-quants' two levels, multiplied
here in float32 as gguf does), so no weight moves, where PyTorch's layout rounds them to bfloat16.

Activations: each token's row is quantized alone, per block of 32 columns, to int8 with one
float32 scale dx = max|x| / 127 (llama.cpp's Q8_0 rule, rounding to nearest even): an activation
moves by at most dx / 2. Quantizing a token alone keeps every verify pass exact (below).

Layout (CodeBlocks): rows in chunks of CHUNK; each chunk holds, group by group, its codes in quads
(bytes 4q..4q+3 of every row side by side, row after row), and a chunk is one contiguous stretch
of memory (the prefetcher streams it). Chunks are shared out between threads.

Batch invariance: a token's activations are quantized from its own row only, its integer sums are
exact, and every output row adds its groups' shares in the same order whatever the number of
tokens, so a verify pass of n tokens gives each token bit for bit what a one-token step gives it.
That is what exact speculation needs (PyTorch's batched kernel rounds by width: the GGUF near-tie
threshold in tests/test_gguf_own_precision.py exists for it).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
from functools import partial
from pathlib import Path

import numpy as np

from app.models.gguf_codes import (BIAS_OF, BITS2_16, BITS3_16, BITS5_32, BITS6_16, BLOCK_SIZES, BYTES32,
                                   FACTORED_TYPES, GRID32, GROUP_OF, IQ4_KVALUES, KIND_OF, NIBBLES32, OFFSET_TYPES)

log = logging.getLogger(__name__)

CHUNK = 64  # rows a chunk holds (kernels_numba.CHUNK, which this module must not import eagerly)
GROUP = 32
HALF = GROUP // 2
QUAD = 4  # a row's consecutive code bytes side by side in the layout
ACT_BLOCK = 32  # columns of a token's activations that share one int8 scale

_COMPILED = None
_WHY_NOT: str | None = None


def why_not_available() -> str:
    """"" where the kernel runs here, else why not (Numba missing, or it fails to build here)."""
    compiled()
    return _WHY_NOT or ""


def decided() -> bool:
    """Whether this process has built (or failed to build) the kernel already."""
    return _COMPILED is not None or _WHY_NOT is not None


def _probe_the_rest(module) -> None:
    """Build (or load) and run once the head's and the Q8_0 rows' functions too, so that a CPU
    LLVM cannot build them for turns the kernel off here, with its reason, not a pass later."""
    codes = np.ones((9, 16), np.int8)
    x = np.ones((2, 16), np.float32)
    screen = np.empty((2, 9), np.float32)
    module.screen(codes, np.ones(9, np.float32), x, screen, 1)
    pos, rows = module.screen_candidates(screen, np.zeros(9, np.float32), np.ones(2, np.float32), np.float32(0), 9)
    q8 = np.zeros((1, 34), np.uint8)
    q8[0, 1], q8[0, 2:] = 0x3C, 2  # scale 1.0 (fp16 0x3C00), codes 2
    row = np.empty((1, 32), np.float32)
    module.q8_rows(q8, np.zeros(1, np.int64), row)
    dot = np.empty(1, np.float32)
    module.q8_dots(q8, np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones((1, 32), np.float32), dot)
    if not (np.all(screen == 16) and len(rows) == 18 and np.all(row == 2) and dot[0] == 64):
        raise ArithmeticError("the compiled head or Q8_0 rows computed a known value wrongly")


def _sources_version() -> str:
    """A digest of the compiled modules' sources. Numba keys a cached function on its own file's
    time stamp only, not on the files it calls into: an edit of kernel_tiles_numba.py alone would
    leave kernels_numba's cached code stale. A folder per version of both keeps them together."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    # (gguf_codes.py: the IQ4 grid the compiled tiles and copies hold)
    sources = ("kernels_numba.py", "kernel_tiles_numba.py", "int8_tiles_numba.py", "repack_numba.py", "gguf_codes.py",
               "numba_calls.py")
    for name in sources:
        try:
            digest.update((here / name).read_bytes())
        except OSError:  # a frozen bundle without sources: its entries are stamped by its executable
            digest.update(name.encode())
    # the products' portable build (int8_tiles_numba.py) is other code from the same sources
    digest.update(os.environ.get("TANDEM_INT8_PORTABLE", "").encode())
    return digest.hexdigest()[:12]


STALE_S = 24 * 3600  # a version's folder unused this long is an earlier Tandem's (or an edit's)


def prune_versions(base: Path, keep: str, now: float | None = None) -> list[str]:
    """Remove the cache folders of other versions of the sources (`_sources_version` names) that
    nothing has written to for STALE_S: an update leaves its predecessor's compiled code behind
    (2-11 MB each), and a day's grace spares a second Tandem of another version still running.
    Best effort; the names removed."""
    import re
    import shutil
    import time

    now = time.time() if now is None else now
    removed = []
    try:
        folders = [f for f in base.iterdir() if f.is_dir() and f.name != keep and re.fullmatch(r"[0-9a-f]{12}", f.name)]
    except OSError:
        return removed
    for folder in folders:
        try:
            newest = max([folder.stat().st_mtime] + [f.stat().st_mtime for f in folder.iterdir()])
            if now - newest > STALE_S:
                shutil.rmtree(folder)
                removed.append(folder.name)
        except OSError:  # in use, or gone already: another day
            continue
    return removed


def _cache_typed_lists() -> None:
    """numba.typed.List builds its lists through two functions of Numba's own compiled for each item
    type and never cached: 0.2 s a type, 0.8 s for the decoder's lists (compiled_layers_torch.py) at
    every load. Cached in the same folder as the kernels (best effort: Numba's internals)."""
    from app.models import numba_cache

    if numba_cache.install():  # no folder to cache in: Numba would write beside its own sources
        return
    try:
        from numba.typed import typedlist

        for helper in (typedlist._make_list, typedlist._append):
            if type(helper._cache).__name__ == "NullCache":
                helper.enable_caching()
    except Exception as exc:  # noqa: BLE001 - another Numba, or no place to cache: compiled each load, as before
        log.info("numba.typed.List's helpers are compiled at each load: %s", exc)


def compiled():
    """The module of compiled functions (kernels_numba), built on first use; None where it cannot be."""
    global _COMPILED, _WHY_NOT
    if decided():
        return _COMPILED
    if os.environ.get("TANDEM_INT4_KERNEL", "").lower() in ("0", "off", "torch"):
        _WHY_NOT = "turned off by TANDEM_INT4_KERNEL"
        return None
    try:
        from app.paths import cache_dir

        import torch

        # Numba's OpenMP pool starts with one thread per core and sets that count in the OpenMP
        # runtime it shares with PyTorch: PyTorch's own count (OMP_NUM_THREADS, the user's
        # setting) is put back after the first parallel call
        chosen = torch.get_num_threads()
        import numba

        # a threading layer that takes calls from several threads at once (OpenMP or TBB; the
        # window and the server may decode on different threads): Numba's own work queue aborts
        # the process on that, and where no safe layer exists the first call fails here instead
        numba.config.THREADING_LAYER = "threadsafe"
        # the cache folder (read when the module's functions are decorated), one per version of
        # the sources, under the user's NUMBA_CACHE_DIR where one is set
        own = not os.environ.get("NUMBA_CACHE_DIR")
        base = Path(os.environ.get("NUMBA_CACHE_DIR") or cache_dir() / "numba")
        from app.models import numba_cache

        # one that cannot be written: a temporary folder, or none; never the program's own (numba_cache.py)
        moved = numba_cache.use_folder(base / _sources_version())
        if own:  # (a user's NUMBA_CACHE_DIR may hold anything: only Tandem's own folder is pruned)
            prune_versions(base, _sources_version())
        if moved:
            log.warning("%s", moved)
        elif why := numba_cache.install():  # a frozen bundle's cache (numba_cache.py)
            log.warning("The compiled CPU kernels are compiled at each start, not cached: %s", why)
        module = importlib.import_module("app.models.kernels_numba")
        _cache_typed_lists()
        from app.models.gguf_codes import BYTES32, NIBBLES32, CodeGroups

        # compiles (or loads from the cache) and runs once: codes 9 at scale 1 and offset -8, times
        # activations of 127 (int8 exactly, scale 1): 32 x 127 x (9 - 8)
        probe = CodeBlocks.of(CodeGroups(NIBBLES32, np.full((CHUNK, GROUP), 9, np.uint8),
                                         np.ones((CHUNK, 1), np.float32), np.full((CHUNK, 1), -8, np.float32)), "Q4_1")
        _COMPILED = module
        # and int8 codes at their extreme, -128, times activations of -127 (the sign trick's edge)
        low = CodeBlocks.of(CodeGroups(BYTES32, np.full((CHUNK, GROUP), -128, np.int8),
                                       np.ones((CHUNK, 1), np.float32), None), "Q8_0")
        try:
            right = (np.all(probe.matmul(np.full((1, GROUP), 127, np.float32)) == GROUP * 127)
                     and np.all(low.matmul(np.full((1, GROUP), -127, np.float32)) == GROUP * 128 * 127))
        finally:
            torch.set_num_threads(chosen)
        if not right:
            raise ArithmeticError("the compiled kernel computed a known product wrongly")
        _probe_the_rest(module)
    except Exception as exc:  # noqa: BLE001 - no Numba, or LLVM cannot build here: PyTorch's kernel
        _COMPILED = None
        _WHY_NOT = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else 'no message'}"
    return _COMPILED


def int4_scales() -> str:
    """How a 4-bit layer's scales are held on this machine, for `models info`."""
    if why_not_available():
        return "bfloat16 scales"
    return "the file's scales exactly (fp16; float32 for Q4_K)"


def int4_kernel_words() -> str:
    """Which kernels run a GGUF's layers on this machine's CPU, for `models info`."""
    why = why_not_available()
    if why:
        return (f"linear layers run on PyTorch's int4 (tinygemm) and int8 kernels on the CPU (Tandem's "
                f"4-bit kernel does not run here: {why})")
    return ("linear layers of every common GGUF type run on Tandem's CPU kernel (compiled by Numba for this "
            "CPU: the file's weights times each token's activations in int8; the decoder layers as one call "
            "where every projection is on it)")


def threads() -> int:
    """Runs of chunks a product is cut into: one per thread PyTorch uses (the user's setting,
    OMP_NUM_THREADS), and Numba's threads set to match. Numba keeps a pool of its own (one
    thread per core by default); a pool thread left without work spins in OpenMP's wait, so on
    2 cores a second pool beside PyTorch's single thread halved the speed of both."""
    import numba
    import torch

    count = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != count:
        numba.set_num_threads(count)
    return count


def quantized_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the kernel multiplies for activations x (tokens, cols) float32: (xq int8, dx float32
    (tokens, cols / 32)), each token's row per block of 32 columns with dx = max|x| / 127 and
    xq = rint(x * (1 / dx)); the activations are then dx * xq. A block with a NaN or an infinity
    has dx NaN and codes 0, one whose 1 / dx overflows dx 0 and codes 0. In numpy, the same
    operations as kernels_numba.quantize_activations (tests compare the bits)."""
    tokens, cols = x.shape
    blocks = x.reshape(tokens, cols // ACT_BLOCK, ACT_BLOCK).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        top = np.abs(blocks).max(axis=2)
        d = top / np.float32(127.0)
        d[~(d < np.inf)] = np.nan
        usable = d > 0  # (a NaN is not)
        inverse = np.where(usable, np.float32(1.0) / np.where(usable, d, np.float32(1.0)), np.float32(0.0))
        tiny = ~(inverse < np.inf)  # 1 / d overflows (max|x| under ~4e-37): the block is taken as zeros
        d[tiny], inverse[tiny] = 0, 0
        usable &= ~tiny
        q = np.where(usable[..., None], np.rint(blocks * inverse[..., None].astype(np.float32)), 0)
    return q.astype(np.int8).reshape(tokens, cols), d.astype(np.float32)


# GGUF types whose bytes repack_numba copies straight into the layout: its function for the copy,
# and for the rows as float32
REPACKED = {"Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k", "Q8_0": "q8_0", "Q4_1": "q4_1", "Q4_0": "q4_0",
            "Q5_0": "q5_0", "Q5_1": "q5_1", "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs", "Q2_K": "q2_k", "Q3_K": "q3_k"}
ROWS = {kind: f"rows_{name}" for kind, name in REPACKED.items()}


def float_rows(kind: str, raw: np.ndarray, cols: int) -> np.ndarray | None:
    """Rows of a GGUF tensor of type `kind` (raw: (n, row bytes) uint8) as float32 (n, cols), by
    gguf's own arithmetic, compiled (repack_numba.rows_*); None where that does not run here (the
    caller uses gguf's dequantize, the same numbers)."""
    if kind not in REPACKED or not _whole_rows(kind, raw, cols) or compiled() is None:
        return None
    out = np.empty((raw.shape[0], cols), np.float32)
    getattr(_repacker(), ROWS[kind])(raw, out)
    return out


def screen_rows(rows: np.ndarray, codes: np.ndarray, scale_bits: np.ndarray, error_norm: np.ndarray,
                screen_norm: np.ndarray) -> None:
    """The screened head's int8 screen of float32 rows, compiled (repack_numba.screen_rows); the
    outputs are views of the head's buffers, written in place."""
    _repacker().screen_rows(rows, codes, scale_bits, error_norm, screen_norm)


def _halves_hold_minus_8d(raw: np.ndarray) -> bool:
    """Whether every Q4_0 block's offset -8 d is a finite half (d finite, |8 d| <= 65504): then
    the compiled copy writes the same half the reference route keeps."""
    d = np.ascontiguousarray(raw.reshape(raw.shape[0], -1, 18)[:, :, :2]).view(np.float16).astype(np.float32)
    return bool(np.all(np.isfinite(d)) and np.all(np.abs(d) * 8 <= 65504))


def _whole_rows(kind: str, raw: np.ndarray, cols: int) -> bool:
    """Whether raw is (n, the bytes of `cols` weights of type `kind`) uint8: the compiled copies
    check no bounds, so nothing else reaches them."""
    per_block, block_bytes = BLOCK_SIZES[kind]
    return (raw.ndim == 2 and raw.dtype == np.uint8 and cols > 0 and cols % per_block == 0
            and raw.shape[1] == cols // per_block * block_bytes)


def _planned_for(meta: np.ndarray, kind: int, has_offset: bool, factored: bool) -> bool:
    """Whether chunks (rows of CodeBlocks.meta) were laid out for codes of `kind`, with or without
    offsets, with one-level scales or two."""
    return bool(np.all(meta[:, 3] == kind) and np.all((meta[:, 2] >= 0) == has_offset)
                and np.all((meta[:, 4] >= 0) == factored))


def _repacker():
    """repack_numba, imported once the kernel is compiled (its cache folder is chosen then)."""
    return importlib.import_module("app.models.repack_numba")


# code bytes a row of a group takes, by kind: packed nibbles, then for 5 and 6 bits a 4-byte word of
# the codes' high bits; 2 bits a quad of bit pairs; 3 bits a quad of bit pairs and half the word of
# third bits a pair of groups shares (kernels_numba's STORED)
STORED = {NIBBLES32: HALF, BYTES32: GROUP, BITS2_16: QUAD, BITS5_32: HALF + QUAD, BITS6_16: HALF // 2 + QUAD,
          GRID32: HALF, BITS3_16: QUAD + QUAD // 2}
CODE_BITS = {BITS5_32: 5, BITS6_16: 6, BITS2_16: 2, BITS3_16: 3}  # the kinds held unsigned, less their bias
SUPER = 256  # weights a K-quant super-block holds (its fp16 d and dmin)


def pack_planes(codes: np.ndarray, plane_bits: int) -> np.ndarray:
    """Unsigned codes (..., length) of 4 + plane_bits bits (length 32 for 5-bit, 16 for 6-bit) ->
    their stored bytes (..., length / 2 + 4): byte j of the nibbles holds weight j (low nibble) and
    weight j + length / 2 (high); then a word of the high bits, whose byte i holds, for nibble quad
    q (weights 4q + i and length / 2 + 4q + i), the first's high bits at bit plane_bits * q and the
    second's at 4 + plane_bits * q. The kernel's tiles take a quad's high bits with one shift and
    one mask for all its lanes (int8_tiles_numba._top_bits)."""
    half = codes.shape[-1] // 2
    nibbles = (codes[..., :half] & 15) | ((codes[..., half:] & 15) << 4)
    top = codes >> 4
    word = np.zeros((*codes.shape[:-1], QUAD), np.uint8)
    for q in range(half // QUAD):
        for i in range(QUAD):
            word[..., i] |= top[..., 4 * q + i] << (plane_bits * q)
            word[..., i] |= top[..., half + 4 * q + i] << (4 + plane_bits * q)
    return np.concatenate([nibbles, word], axis=-1).astype(np.uint8)


def unpack_planes(stored: np.ndarray, plane_bits: int) -> np.ndarray:
    """pack_planes' inverse: stored bytes (..., length / 2 + 4) -> the unsigned codes (..., length)."""
    half = stored.shape[-1] - QUAD
    nibbles, word = stored[..., :half], stored[..., half:]
    mask = (1 << plane_bits) - 1
    low, high = (nibbles & 15).astype(np.uint8), (nibbles >> 4).astype(np.uint8)
    for q in range(half // QUAD):
        for i in range(QUAD):
            low[..., 4 * q + i] |= ((word[..., i] >> (plane_bits * q)) & mask) << 4
            high[..., 4 * q + i] |= ((word[..., i] >> (4 + plane_bits * q)) & mask) << 4
    return np.concatenate([low, high], axis=-1)


def pack_crumbs(codes: np.ndarray) -> np.ndarray:
    """2-bit codes (..., 16) -> their stored quad (..., 4): byte i holds weights i, 4 + i, 8 + i and
    12 + i at bits 0-1, 2-3, 4-5 and 6-7, so that one shift and one mask give a tile the codes of
    four consecutive weights in every lane (int8_tiles_numba's TWO_BITS)."""
    crumbs = codes.reshape(*codes.shape[:-1], 4, QUAD).astype(np.uint8)  # [k][i]: weight 4k + i
    return (crumbs[..., 0, :] | (crumbs[..., 1, :] << 2) | (crumbs[..., 2, :] << 4)
            | (crumbs[..., 3, :] << 6)).astype(np.uint8)


def unpack_crumbs(stored: np.ndarray) -> np.ndarray:
    """pack_crumbs' inverse: (..., 4) bytes -> the codes (..., 16)."""
    crumbs = np.stack([(stored >> (2 * k)) & 3 for k in range(4)], axis=-2)  # [k][i]
    return crumbs.reshape(*stored.shape[:-1], 16).astype(np.uint8)


def pack_triples(codes: np.ndarray) -> np.ndarray:
    """3-bit codes (..., groups, 16), an even number of groups -> their stored bytes (...,
    groups / 2, 12), a pair of groups at a time: the first's low bit pairs as pack_crumbs lays
    them out, the second's, then a word of their third bits, whose byte i holds, for k = 0..3, the
    first group's weight 4k + i's at bit k and the second's at bit 4 + k (a tile shifts the word
    right by 0 or 4, then one shift and one mask put a quad's third bits in place)."""
    pairs = codes.reshape(*codes.shape[:-2], codes.shape[-2] // 2, 2, 4, QUAD).astype(np.uint8)  # [pair][g][k][i]
    low = [pack_crumbs((pairs[..., g, :, :] & 3).reshape(*pairs.shape[:-3], 16)) for g in (0, 1)]
    top = pairs >> 2
    word = np.zeros((*pairs.shape[:-3], QUAD), np.uint8)
    for g in (0, 1):
        for k in range(4):
            word |= top[..., g, k, :] << (4 * g + k)
    return np.concatenate([low[0], low[1], word], axis=-1)


def unpack_triples(stored: np.ndarray) -> np.ndarray:
    """pack_triples' inverse: (..., pairs, 12) bytes -> the codes (..., 2 * pairs, 16)."""
    word = stored[..., 2 * QUAD:]
    groups = []
    for g in (0, 1):
        low = unpack_crumbs(stored[..., g * QUAD:(g + 1) * QUAD])
        top = np.stack([(word >> (4 * g + k)) & 1 for k in range(4)], axis=-2).reshape(low.shape)
        groups.append(low | (top << 2))
    return np.stack(groups, axis=-2).reshape(*stored.shape[:-2], 2 * stored.shape[-2], 16).astype(np.uint8)


# the kinds held unsigned (CODE_BITS): how a row's groups (..., groups, length) become their stored
# bytes (..., units, bytes a unit) and back, a unit a group or (3 bits) a pair of groups
PACKING = {BITS5_32: (partial(pack_planes, plane_bits=1), partial(unpack_planes, plane_bits=1)),
           BITS6_16: (partial(pack_planes, plane_bits=2), partial(unpack_planes, plane_bits=2)),
           BITS2_16: (pack_crumbs, unpack_crumbs), BITS3_16: (pack_triples, unpack_triples)}


def grid_indices(values: np.ndarray) -> np.ndarray:
    """IQ4's grid values (int8) -> their indices 0..15; ValueError for a value not on the grid."""
    found = np.minimum(np.searchsorted(IQ4_KVALUES, values.astype(np.int8)), 15)  # the grid ascends
    if values.size and not np.array_equal(IQ4_KVALUES[found], values.astype(np.int8)):
        raise ValueError("codes that are not values of IQ4's grid")
    return found.astype(np.uint8)


class CodeBlocks:
    """One (rows, cols) weight in the kernel's layout, filled a block of rows at a time.

    Rows come in chunks of CHUNK; a chunk holds one GGUF type's codes (gguf_codes.py: 4-bit codes
    in groups of 32, int8 codes in groups of 32 or of 16), with per group and row a scale, and an
    offset where the type has one: w = scale * code + offset. The scales are the file's own: its
    fp16 fields as halves, or for the super-block types (K-quants, IQ4_XS) the two levels the file
    stores, an fp16 d (and dmin) per 256 weights and an integer sc (and m) per group, which the
    kernel multiplies in float32 (exact: the same bits as gguf's products, 4.6 bits a Q4_K weight
    where float32 products would take 6). A stacked product (q/k/v, gate/up) may hold parts of
    different types, a segment of chunks each. Within a chunk, group by group, the code bytes lie in
    quads: bytes 4q..4q+3 of every row side by side, row after row, so that one 32-byte load is 8
    rows x 4 codes for the integer dot products (int8_tiles_numba.py), and a chunk is one
    contiguous stretch of memory (the prefetcher streams it). The arrays are flat;
    `meta` says where each chunk's codes and scales start (kernels_numba's columns)."""

    def __init__(self, rows: int, cols: int, parts: list[tuple[int, str]]):
        """parts: (rows, GGUF type name) in row order, summing to `rows`; each but the last a whole
        number of chunks (parts of one type side by side count as one)."""

        if sum(n for n, _ in parts) != rows:
            raise ValueError(f"parts of {[n for n, _ in parts]} rows do not make {rows}")
        self.rows, self.cols = rows, cols
        merged: list[list] = []
        for n, name in parts:
            if merged and merged[-1][1] == name:
                merged[-1][0] += n
            else:
                merged.append([n, name])
        self.meta = np.zeros((-(-rows // CHUNK), 7), np.int64)  # the last chunk's missing rows stay zero
        at = dict(codes=0, scales=0, offsets=0, small=0, supers=0)
        chunk = 0
        for i, (n, name) in enumerate(merged):
            kind, has_offset, factored = KIND_OF[name], name in OFFSET_TYPES, name in FACTORED_TYPES
            length = GROUP_OF[kind]
            if cols % (SUPER if factored else length):
                raise ValueError(f"a row of {cols} weights is not whole {name} blocks")
            if n % CHUNK and i < len(merged) - 1:
                raise ValueError(f"a part of {n} rows is not whole chunks of {CHUNK}")
            groups, levels = cols // length, 2 if has_offset else 1
            for _ in range(-(-n // CHUNK)):
                if factored:  # offsets: a flag only (0), the values come from supers and small
                    self.meta[chunk] = (at["codes"], -1, 0 if has_offset else -1, kind, at["small"], at["supers"],
                                        BIAS_OF[name])
                    at["small"] += groups * levels * CHUNK
                    at["supers"] += cols // SUPER * levels * CHUNK
                else:
                    self.meta[chunk] = (at["codes"], at["scales"], at["offsets"] if has_offset else -1, kind, -1, -1,
                                        BIAS_OF[name])
                    at["scales"] += groups * CHUNK
                    at["offsets"] += groups * CHUNK if has_offset else 0
                at["codes"] += groups * STORED[kind] * CHUNK
                chunk += 1
        self.codes = np.zeros(at["codes"], np.uint8)
        # scales and offsets as IEEE halves (the file's own fp16 fields: half the bytes) unless a
        # value is not one, then float32; either way exact
        self.scale = np.zeros(at["scales"], np.uint16)
        self.offset = np.zeros(at["offsets"], np.uint16)
        self.small = np.zeros(at["small"], np.int8)  # [group][sc, m][row] of each chunk
        self.supers = np.zeros(at["supers"], np.uint16)  # [super-block][d, dmin][row], halves

    @classmethod
    def of(cls, groups, name: str) -> CodeBlocks:
        """A weight of one GGUF type from gguf_codes.CodeGroups, filled."""
        rows, cols = groups.codes.shape
        blocks = cls(rows, cols, [(rows, name)])
        blocks.fill(0, groups)
        return blocks

    ARRAYS = ("codes", "scale", "offset", "small", "supers", "meta")  # kernels_numba's argument order

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.ARRAYS)

    def fill(self, start: int, groups) -> None:
        """Rows start.. (start a multiple of CHUNK) from a gguf_codes.CodeGroups of the type the
        part there was made for."""
        if start % CHUNK:
            raise ValueError(f"rows are filled from a multiple of {CHUNK}, not {start}")
        n = groups.codes.shape[0]
        first, count = start // CHUNK, -(-n // CHUNK)
        if start + n > self.rows:
            raise ValueError(f"rows {start}..{start + n} lie past the weight's {self.rows}")
        kind, length = groups.kind, GROUP_OF[groups.kind]
        meta = self.meta[first:first + count]
        if not _planned_for(meta, kind, groups.offset is not None, groups.factors is not None):
            raise ValueError(f"rows {start}..{start + n} were planned for other codes than these")
        whole, ngroups = count * CHUNK, self.cols // length
        grouped = np.zeros((whole, ngroups, length), np.uint8)
        if kind in CODE_BITS:  # stored unsigned: the code plus the type's bias
            bias = int(meta[0, 6])
            grouped[:n] = self._unsigned(groups.codes.reshape(n, ngroups, length), bias, CODE_BITS[kind])
            grouped = PACKING[kind][0](grouped)
        elif kind in (NIBBLES32, GRID32):  # byte j holds weight j (low nibble) and weight j + 16 (high)
            codes = groups.codes.reshape(n, ngroups, length)
            grouped[:n] = grid_indices(codes) if kind == GRID32 else codes.view(np.uint8)
            grouped = grouped[..., :HALF] | (grouped[..., HALF:] << 4)
        else:
            grouped[:n] = groups.codes.reshape(n, ngroups, length).view(np.uint8)
        units = grouped.shape[1]  # groups, or pairs of groups (3-bit codes)
        stored = grouped.reshape(count, CHUNK, units, -1, QUAD).transpose(0, 2, 3, 1, 4)  # [quad][row][4]
        at = int(meta[0, 0])
        self.codes[at:at + stored.size] = stored.reshape(-1)
        if groups.factors is not None:
            for name, values, column in (("small", groups.factors.smalls, 4), ("supers", groups.factors.supers, 5)):
                padded = np.zeros((whole, *values.shape[1:]), values.dtype)
                padded[:n] = values
                arranged = padded.reshape(count, CHUNK, -1).transpose(0, 2, 1).reshape(-1)  # [chunk][..][row]
                if name == "supers":
                    arranged = arranged.astype(np.float16).view(np.uint16)  # fp16 fields: exact
                getattr(self, name)[int(meta[0, column]):int(meta[0, column]) + arranged.size] = arranged
            return
        for name, values, column in (("scale", groups.scale, 1), ("offset", groups.offset, 2)):
            if values is None:
                continue
            padded = np.zeros((whole, ngroups), np.float32)
            padded[:n] = values
            arranged = padded.reshape(count, CHUNK, ngroups).transpose(0, 2, 1).reshape(-1)  # [chunk][group][row]
            self._store(name, int(meta[0, column]), arranged)

    def fill_file(self, start: int, name: str, raw: np.ndarray) -> bool:
        """Rows start.. straight from the file's bytes of GGUF type `name` (raw: (n, row bytes)
        uint8, whole blocks, already checked against the shape) by repack_numba's compiled
        copy, the same values fill() holds from gguf_codes; False (nothing written) where that
        does not apply: another type, no compiled kernel here, or scales already widened."""
        if name not in REPACKED or start % CHUNK or not _whole_rows(name, raw, self.cols):
            return False
        n = raw.shape[0]
        first, count = start // CHUNK, -(-n // CHUNK)
        if start + n > self.rows or compiled() is None:
            return False
        meta = self.meta[first:first + count]
        factored, has_offset = name in FACTORED_TYPES, name in OFFSET_TYPES
        if not _planned_for(meta, KIND_OF[name], has_offset, factored):
            return False
        if not factored and (self.scale.dtype != np.uint16 or self.offset.dtype != np.uint16):
            return False
        if name == "Q4_0" and not _halves_hold_minus_8d(raw):
            return False  # the reference route widens the offsets to float32 (fill's _store)
        copy = getattr(_repacker(), REPACKED[name])
        codes_at = int(meta[0, 0])
        if factored:
            copy(raw, self.codes, self.small, self.supers, codes_at, int(meta[0, 4]), int(meta[0, 5]))
        else:  # a type without an offset passes its scales where the offsets go, unwritten
            offset, offset_at = (self.offset, int(meta[0, 2])) if has_offset else (self.scale, 0)
            copy(raw, self.codes, self.scale, offset, codes_at, int(meta[0, 1]), offset_at)
        return True

    @staticmethod
    def _unsigned(codes: np.ndarray, bias: int, bits: int) -> np.ndarray:
        """Codes plus `bias` as unsigned `bits`-bit integers; ValueError for a code that is not one."""
        stored = codes.astype(np.int16) + bias
        if stored.size and (stored.min() < 0 or stored.max() >= 1 << bits):
            raise ValueError(f"codes {int(codes.min())}..{int(codes.max())} are not {bits}-bit codes less {bias}")
        return stored.astype(np.uint8)

    def _store(self, name: str, at: int, values: np.ndarray) -> None:
        held = getattr(self, name)
        if held.dtype == np.uint16:
            half = values.astype(np.float16)
            if np.array_equal(half.astype(np.float32), values):
                held[at:at + values.size] = half.view(np.uint16)
                return
            held = held.view(np.float16).astype(np.float32)  # every half is a float32 exactly
            setattr(self, name, held)
        held[at:at + values.size] = values

    def widened(self) -> None:
        """Scales and offsets as float32 (a stack of layers whose products differ in this is
        compiled as one list of arrays of one type)."""
        for name in ("scale", "offset"):
            held = getattr(self, name)
            if held.dtype == np.uint16:
                setattr(self, name, held.view(np.float16).astype(np.float32))

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32: the weights as the kernel reads them, w = scale * code + offset
        in float32 (that order: the file's own arithmetic, gguf_codes.py), the two-level scales
        multiplied out as the kernel multiplies them."""
        widen = lambda a: (a.view(np.float16) if a.dtype == np.uint16 else a).astype(np.float32)  # noqa: E731
        scale, offset, supers = widen(self.scale), widen(self.offset), widen(self.supers)
        out = np.empty((self.meta.shape[0] * CHUNK, self.cols), np.float32)
        for ch, (codes_at, scales_at, offsets_at, kind, small_at, supers_at, bias) in enumerate(self.meta.tolist()):
            length = GROUP_OF[kind]
            ngroups = self.cols // length
            units, per_unit = (ngroups // 2, 2 * STORED[kind]) if kind == BITS3_16 else (ngroups, STORED[kind])
            raw = self.codes[codes_at:codes_at + ngroups * STORED[kind] * CHUNK].reshape(
                units, per_unit // QUAD, CHUNK, QUAD).transpose(0, 1, 3, 2).reshape(units, per_unit, CHUNK)
            if kind in CODE_BITS:
                q = PACKING[kind][1](raw.transpose(2, 0, 1)).reshape(CHUNK, ngroups, length)
                q = q.transpose(1, 2, 0).astype(np.float32)
                q -= bias
            elif kind in (NIBBLES32, GRID32):
                q = np.concatenate([raw & 0x0F, raw >> 4], axis=1)
                q = (IQ4_KVALUES[q] if kind == GRID32 else q).astype(np.float32)
            else:
                q = raw.view(np.int8).astype(np.float32)
            if small_at >= 0:  # two levels: d per super-block times sc per group, (dmin times m)
                levels, per = (2 if offsets_at >= 0 else 1), SUPER // length
                small = self.small[small_at:small_at + ngroups * levels * CHUNK].reshape(ngroups, levels, CHUNK)
                d = supers[supers_at:supers_at + ngroups // per * levels * CHUNK].reshape(-1, levels, CHUNK)
                d = np.repeat(d, per, axis=0)
                s = (d[:, 0] * small[:, 0].astype(np.float32))[:, None]
                o = -(d[:, 1] * small[:, 1].astype(np.float32))[:, None] if offsets_at >= 0 else None
            else:
                s = scale[scales_at:scales_at + ngroups * CHUNK].reshape(ngroups, 1, CHUNK)
                o = None
                if offsets_at >= 0:
                    o = offset[offsets_at:offsets_at + ngroups * CHUNK].reshape(ngroups, 1, CHUNK)
            w = q * s  # (groups, length, CHUNK)
            if o is not None:
                w = w + o
            out[ch * CHUNK:(ch + 1) * CHUNK] = w.transpose(2, 0, 1).reshape(CHUNK, self.cols)
        return out[:self.rows]

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x (n, cols) float32, C-contiguous -> (n, rows) float32."""
        out = np.empty((x.shape[0], self.rows), np.float32)
        module = _COMPILED or compiled()
        module.matmul(*(getattr(self, name) for name in self.ARRAYS), x, out, threads(),
                      module.product_address(self.scale.dtype, self.offset.dtype))
        return out
