"""A/B in one process: a target pass by width through transformers' forward and through the lean
step (app/engine/backends/lean_step_torch.py), on the same loaded model, interleaved A B B A.
With --compiled-body: the lean step's decoder layers as one compiled call (compiled_layers_torch.py)
against its PyTorch body on the same 4-bit kernel.

    python benchmarks/step_ab.py [--model demo] [--precision gguf] [--widths 1,2,5,9] [--context 300]
    python benchmarks/step_ab.py --compiled-body

Prints the median milliseconds of each pass kind per width (after a prefill of --context tokens,
cut back after every pass) and the ratio, with the min and max over the blocks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed_passes(backend, ids: list[int], context: int, width: int, n: int) -> list[float]:
    times = []
    with torch.inference_mode():
        backend.reset()
        backend.prefill(ids[:context])
        for _ in range(n):
            start = time.perf_counter()
            backend._forward(backend._ids(ids[context:context + width]), width)
            times.append(time.perf_counter() - start)
            backend.truncate(context)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--precision", default="gguf")
    parser.add_argument("--widths", default="1,2,5,9")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--passes", type=int, default=15, help="passes per block")
    parser.add_argument("--blocks", type=int, default=4, help="A B B A blocks per width")
    parser.add_argument("--without-kernels", action="store_true",
                        help="then time the lean step with its matmul kernels and head replaced by their "
                             "outputs kept from a first call: what the step costs besides them")
    parser.add_argument("--compiled-body", action="store_true",
                        help="A: the lean step's PyTorch body, B: its decoder layers as one compiled call")
    args = parser.parse_args(argv)

    from app.engine.backends.torch_backend import TorchBackend
    from app.models.resolve import resolve_model

    folder = resolve_model(args.model, "torch", lambda message: None, precision=args.precision)
    backend = TorchBackend(folder, device="cpu", precision=args.precision)
    print(f"{args.model}: {backend.precision}; {torch.get_num_threads()} threads")
    ids = [(11 + 37 * i) % min(40000, backend.vocab_size) for i in range(args.context + 32)]
    a, b = ("pytorch body", "compiled body") if args.compiled_body else ("transformers", "lean")
    if args.compiled_body:
        backend.step = "lean"
        native = backend._lean.native
        if native is None:
            print(f"no compiled body here: {backend._lean.native_note}")
            return 1
    print(f"width | {a} ms | {b} ms | {b} / {a} [min-max over blocks]")
    for width in (int(w) for w in args.widths.split(",")):
        medians = {a: [], b: []}
        for block in range(args.blocks):
            for step in ((a, b) if block % 2 == 0 else (b, a)):
                if args.compiled_body:
                    backend._lean.native = native if step == b else None
                else:
                    backend.step = step
                timed_passes(backend, ids, args.context, width, 2)  # warm
                medians[step].append(statistics.median(timed_passes(backend, ids, args.context, width, args.passes)))
        ratios = [new / old for new, old in zip(medians[b], medians[a], strict=True)]
        print(f"{width:5d} | {statistics.median(medians[a]) * 1e3:15.2f} | "
              f"{statistics.median(medians[b]) * 1e3:7.2f} | {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]", flush=True)
    if args.compiled_body:
        backend._lean.native = native
    if args.without_kernels:
        backend.step = "lean"
        backend._lean.native = None  # the PyTorch body, whose kernels can be replaced
        for width in (int(w) for w in args.widths.split(",")):
            whole = statistics.median(timed_passes(backend, ids, args.context, width, args.passes))
            restore = _stub_kernels(backend)
            rest = statistics.median(timed_passes(backend, ids, args.context, width, args.passes))
            restore()
            print(f"width {width}: lean step {whole * 1e3:.2f} ms, of which besides the matmul kernels and the head "
                  f"{rest * 1e3:.2f} ms", flush=True)
    return 0


def _stub_kernels(backend):
    """Replace the lean step's projection kernels and its head by their first outputs (per input
    shape); returns the function that puts them back."""
    lean, saved = backend._lean, []
    products = [p for layer in lean.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down) if p.kernel]
    for product in products:
        kernel, outputs = product.kernel, {}

        def kept(x, kernel=kernel, outputs=outputs):
            if x.shape not in outputs:
                outputs[x.shape] = kernel(x)
            return outputs[x.shape]

        saved.append((product, kernel))
        product.kernel = kept
    head, heads = lean.head, {}

    def kept_head(x):
        if x.shape not in heads:
            heads[x.shape] = head(x)
        return heads[x.shape]

    lean.head = kept_head

    def restore():
        for product, kernel in saved:
            product.kernel = kernel
        lean.head = head

    return restore


if __name__ == "__main__":
    sys.exit(main())
