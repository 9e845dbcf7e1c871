"""The screened head's int8 pass two ways on one head's shape: today's float32 screen
(kernels_numba.screen: float32 activations, each code converted and multiplied) against the same
codes laid out for the products' integer tiles (int4_cpu_torch.CodeBlocks as Q8_0: int8
activations, pmaddubsw), interleaved in one process, ms by width.

    python benchmarks/screen_tiles.py [--rows 49152] [--cols 2048] [--widths 1,4] [--repeats 5]

Random codes and fp16-exact row scales; the two outputs differ by the activations' rounding
(reported), which a screen on the tiles would have to add to its bound (docs/gguf.md). Threads:
PyTorch's (OMP_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=49152)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--widths", default="1,4")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from app.models.gguf_codes import BYTES32, CodeGroups
    from app.models.int4_cpu_torch import CodeBlocks, compiled, threads

    kernels = compiled()
    if kernels is None:
        print("Tandem's CPU kernel does not run here")
        return 1
    rng = np.random.default_rng(0)
    codes = rng.integers(-127, 128, size=(args.rows, args.cols), dtype=np.int8)
    scales = (rng.random(args.rows, dtype=np.float32) * 1e-2 + 1e-3).astype(np.float16).astype(np.float32)
    blocks = CodeBlocks.of(CodeGroups(BYTES32, codes, np.repeat(scales[:, None], args.cols // 32, axis=1), None),
                           "Q8_0")
    print(f"head {args.rows} x {args.cols}: screen {codes.nbytes / 1e6:.1f} MB, as tiles {blocks.nbytes / 1e6:.1f} MB; "
          f"{threads()} threads")
    for width in (int(w) for w in args.widths.split(",")):
        x = rng.standard_normal((width, args.cols), dtype=np.float32)
        out = np.empty((width, args.rows), np.float32)
        screen, tiles, tiled = [], [], None
        for _ in range(args.repeats + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            kernels.screen(codes, scales, x, out, threads())
            screen.append(time.perf_counter() - start)
            start = time.perf_counter()
            tiled = blocks.matmul(x)
            tiles.append(time.perf_counter() - start)
        diff = float(np.abs(tiled - out).max() / np.abs(out).max())
        print(f"width {width}: float32 screen {statistics.median(screen[1:]) * 1000:.2f} ms, integer tiles "
              f"{statistics.median(tiles[1:]) * 1000:.2f} ms (largest difference {diff:.2%} of the largest logit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
