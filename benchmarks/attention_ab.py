"""A/B in one process of a target pass by width with transformers' SDPA path (A: the KV heads
repeated per layer when the pass has a mask) and Tandem's CPU attention (B: app/models/
attention_torch.py), the two interleaved round by round so machine drift falls on both alike.

    python benchmarks/attention_ab.py                       # the demo, at 150 and 700 tokens of context
    python benchmarks/attention_ab.py --model FOLDER --contexts 200,2000 --rounds 60

Prints the median wall time of a pass at each width for each path, after a prompt of each length.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--contexts", default="150,700", help="prompt lengths, comma-separated")
    parser.add_argument("--widths", default="1,2,3,4")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()

    import torch

    from app.engine.backends.torch_backend import TorchBackend
    from app.models.attention_torch import NAME
    from app.models.resolve import resolve_model

    backend = TorchBackend(resolve_model(args.model, "torch", lambda message: None), device="cpu")
    if backend.model.config._attn_implementation != NAME:
        print(f"{backend.model_type} keeps transformers' attention path here: nothing to compare.")
        return 1
    widths = [int(w) for w in args.widths.split(",")]
    paths = ("sdpa", NAME)
    vocab = backend.vocab_limit
    for context in (int(c) for c in args.contexts.split(",")):
        times = {(path, w): [] for path in paths for w in widths}
        with torch.inference_mode():
            backend.reset()
            backend.prefill([(11 + 37 * i) % vocab for i in range(context)])
            for i in range(args.rounds):
                for path in (paths if i % 2 == 0 else paths[::-1]):
                    backend.model.set_attn_implementation(path)
                    for w in widths:
                        ids = backend._ids([(5 + j) % vocab for j in range(w)])
                        started = time.perf_counter()
                        float(backend._forward(ids, w)[0, 0])
                        times[(path, w)].append(time.perf_counter() - started)
                        backend.cache.trim(backend.cache.length - w)  # the context stays as it was
        for path in paths:
            cells = " ".join(f"w{w} {statistics.median(times[(path, w)]) * 1000:6.1f}" for w in widths)
            print(f"{context:5d} tokens  {path:12s} {cells}  (ms, median of {args.rounds})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
