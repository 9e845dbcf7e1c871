"""The CPU kernel's product on a weight streamed from memory, by width: ms a product and GB/s.

    python benchmarks/kernel_stream.py [--type Q4_K] [--rows 16384] [--cols 2048] [--copies 32]

A weight of random blocks of one GGUF type (app/bench/random_gguf.py) in the kernel's layout
(int4_cpu_torch.CodeBlocks), copied `--copies` times so that together they are far larger than
the caches, as a model's layers are; each width multiplies every copy in turn, best of 3. What
docs/gguf.md's kernel figures were measured with. Threads: PyTorch's (OMP_NUM_THREADS).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from app.models.gguf_codes import KERNEL_TYPES

    parser.add_argument("--type", default="Q4_K", choices=KERNEL_TYPES, help="a GGUF type on the kernel")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--copies", type=int, default=32)
    parser.add_argument("--widths", default="1,2,3,4,5,6,9", help="tokens a product, comma list")
    args = parser.parse_args()
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        parser.error(f"--widths takes whole numbers separated by commas, not {args.widths!r}")
    if min(widths) < 1 or args.rows < 1 or args.copies < 1 or args.cols < 1:
        parser.error("--widths, --rows, --cols and --copies must be at least 1")

    from app.bench.random_gguf import random_blocks
    from app.models import int4_cpu_torch
    from app.models.gguf_codes import code_groups
    from app.models.int4_cpu_torch import CHUNK, CodeBlocks

    if int4_cpu_torch.compiled() is None:
        print(f"the kernel does not run here: {int4_cpu_torch.why_not_available()}")
        return 1
    try:  # a row that is not whole blocks of the type
        raw = random_blocks(args.type, args.rows, args.cols, np.random.default_rng(0))
        first = CodeBlocks(args.rows, args.cols, [(args.rows, args.type)])
    except ValueError as exc:
        parser.error(str(exc))
    for start in range(0, args.rows, CHUNK):
        first.fill(start, code_groups(args.type, raw[start:start + CHUNK], min(CHUNK, args.rows - start), args.cols))
    copies = [first]
    for _ in range(args.copies - 1):
        copy = CodeBlocks(args.rows, args.cols, [(args.rows, args.type)])
        for name in CodeBlocks.ARRAYS:
            setattr(copy, name, getattr(first, name).copy())
        copies.append(copy)
    total = sum(c.nbytes for c in copies)
    x = np.random.default_rng(1).standard_normal((max(widths), args.cols)).astype(np.float32)
    print(f"{args.type} {args.rows} x {args.cols}, {args.copies} copies ({total / 1e6:.0f} MB), "
          f"{int4_cpu_torch.threads()} threads")
    for width in widths:
        tokens = np.ascontiguousarray(x[:width])
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for copy in copies:
                copy.matmul(tokens)
            best = min(best, time.perf_counter() - start)
        print(f"  width {width}: {best * 1e3 / len(copies):.2f} ms a product, {total / best / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
