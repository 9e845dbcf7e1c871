"""A 4-bit matrix product for the CPU that reads GGUF's groups of 32 as they are, compiled by
Numba (LLVM) for the machine it runs on.

Why: PyTorch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`, tinygemm's layout) has its fast
path in AVX-512; on an AVX2 CPU it read the demo's 4-bit weights at ~5 GB/s, 12 ms of a 35 ms
step, where llama.cpp reads the same file at ~9 GB/s (docs/performance.md). This kernel decodes
the codes in registers and multiplies them with float32 activations:

    y[t, r] = sum over groups b: scale[r, b] * sum_j q[r, b, j] x[t, b, j] + offset[r, b] * sum_j x[t, b, j]

which is w = q * scale + offset summed in another order (Q4_1's w = d q + m; Q4_0 and Q4_K map to
the same form, gguf_blocks.py). The scales stay float32 (exact: GGUF's fp16 fields, or Q4_K's
products of them), so no weight moves, where PyTorch's layout rounds them to bfloat16.

Layout: rows in chunks of CHUNK; each chunk holds, group by group, byte j of every row side by
side, so the innermost loop runs over 64 consecutive rows (LLVM vectorizes it) and a chunk is one
contiguous stretch of memory (the prefetcher streams it). Chunks are shared out between threads.

Batch invariance: every output row is summed in the same order whatever the number of tokens,
so a verify pass of n tokens gives each token bit for bit what a one-token step gives it. That
is what exact speculation needs (PyTorch's batched kernel rounds by width: the GGUF near-tie
threshold in tests/test_gguf_own_precision.py exists for it).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

CHUNK = 64  # rows a chunk holds (kernels_numba.CHUNK, which this module must not import eagerly)
GROUP = 32
HALF = GROUP // 2

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
    for name in ("kernels_numba.py", "kernel_tiles_numba.py"):
        try:
            digest.update((here / name).read_bytes())
        except OSError:  # a frozen bundle without sources: its entries are stamped by its executable
            digest.update(name.encode())
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
        numba.config.CACHE_DIR = str(base / _sources_version())
        if own:  # (a user's NUMBA_CACHE_DIR may hold anything: only Tandem's own folder is pruned)
            prune_versions(base, _sources_version())
        from app.models import numba_cache

        if why := numba_cache.install():  # a frozen bundle's cache (numba_cache.py)
            log.warning("The compiled CPU kernels are compiled at each start, not cached: %s", why)
        module = importlib.import_module("app.models.kernels_numba")
        probe = Int4Blocks(CHUNK, GROUP)  # compiles (or loads from the cache) and runs once
        probe.fill(0, np.full((CHUNK, GROUP), 9, np.uint8), np.ones((CHUNK, 1), np.float32),
                   np.zeros((CHUNK, 1), np.float32))
        _COMPILED = module
        try:
            right = np.all(probe.matmul(np.ones((1, GROUP), np.float32)) == GROUP)
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
    return ("4-bit layers run on Tandem's CPU kernel (compiled by Numba for this CPU; the decoder layers "
            "as one call where all are 4-bit), 5- to 8-bit ones on PyTorch's int8 kernel")


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


class Int4Blocks:
    """One (rows, cols) weight in the kernel's layout, filled a block of rows at a time."""

    def __init__(self, rows: int, cols: int):
        if cols % GROUP:
            raise ValueError(f"a row of {cols} weights is not whole groups of {GROUP}")
        self.rows, self.cols = rows, cols
        chunks = -(-rows // CHUNK)  # the last chunk's missing rows stay zero and are cut off
        groups = cols // GROUP
        self.codes = np.zeros((chunks, groups, HALF, CHUNK), np.uint8)
        # scales as IEEE halves (Q4_0's and Q4_1's own fp16 fields: half the bytes) unless a
        # scale is not one (Q4_K's products of two), then float32; either way exact
        self.scale = np.zeros((chunks, groups, CHUNK), np.uint16)
        self.offset = np.zeros((chunks, groups, CHUNK), np.uint16)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.offset.nbytes

    def fill(self, start: int, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> None:
        """Rows start.. (start a multiple of CHUNK) from gguf_blocks.Int4Groups' fields: codes
        (n, cols) in 0..15, w = (codes - 8) * scale + zero."""
        if start % CHUNK:
            raise ValueError(f"rows are filled from a multiple of {CHUNK}, not {start}")
        n, groups = codes.shape[0], self.cols // GROUP
        whole = -(-n // CHUNK) * CHUNK
        packed = np.zeros((whole, groups, HALF), np.uint8)
        grouped = codes.reshape(n, groups, GROUP).astype(np.uint8)
        packed[:n] = grouped[..., :HALF] | (grouped[..., HALF:] << 4)
        first = start // CHUNK
        span = slice(first, first + whole // CHUNK)
        self.codes[span] = packed.reshape(-1, CHUNK, groups, HALF).transpose(0, 2, 3, 1)
        for name, values in (("scale", scale), ("offset", zero - 8.0 * scale)):  # w = q * scale + offset
            whole_values = np.zeros((whole, groups), np.float32)
            whole_values[:n] = values
            self._store(name, span, whole_values.reshape(-1, CHUNK, groups).transpose(0, 2, 1))

    def _store(self, name: str, span: slice, values: np.ndarray) -> None:
        held = getattr(self, name)
        if held.dtype == np.uint16:
            half = values.astype(np.float16)
            if np.array_equal(half.astype(np.float32), values):
                held[span] = half.view(np.uint16)
                return
            held = held.view(np.float16).astype(np.float32)  # every half is a float32 exactly
            setattr(self, name, held)
        held[span] = values

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32: the weights as the kernel reads them (q * scale + offset)."""
        chunks, groups = self.codes.shape[:2]
        low, high = self.codes & 0x0F, self.codes >> 4  # (chunks, groups, 16, CHUNK)
        q = np.concatenate([low, high], axis=2).transpose(0, 3, 1, 2).astype(np.float32)  # (chunks, CHUNK, groups, 32)
        widen = lambda a: (a.view(np.float16) if a.dtype == np.uint16 else a).astype(np.float32)  # noqa: E731
        scale = widen(self.scale).transpose(0, 2, 1)[..., None]
        offset = widen(self.offset).transpose(0, 2, 1)[..., None]
        return (q * scale + offset).reshape(chunks * CHUNK, groups * GROUP)[:self.rows]

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x (n, cols) float32, C-contiguous -> (n, rows) float32."""
        out = np.empty((x.shape[0], self.rows), np.float32)
        _COMPILED.matmul(self.codes, self.scale, self.offset, x, out, threads())
        return out
