"""Where a target pass's time goes: the median milliseconds of a pass by width, and of its two
halves on the compiled path, the decoder layers (one compiled call) and the screened head.

    python benchmarks/pass_parts.py [--model demo] [--precision gguf] [--widths 1,4,8,17] [--context 300]
    python benchmarks/pass_parts.py --model M --greedy 40   # one-token passes of a greedy answer instead

The synthetic token sequences make hidden states no text makes, on which the screened head
rescores far more rows (docs/gguf.md); --greedy N times the N one-token passes of a greedy
answer to the suite's first prompt, as plain decoding runs them, and prints the peak RSS.

To compare two versions of the kernels, run it in each checkout alternately (a module cannot be
loaded twice in one process); this host's noise moves single figures by 20-30% between runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _timed(owner, name: str, into: list[float]) -> None:
    inner = getattr(owner, name)

    def call(*args, **kwargs):
        start = time.perf_counter()
        result = inner(*args, **kwargs)
        into.append(time.perf_counter() - start)
        return result

    setattr(owner, name, call)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--precision", default="gguf")
    parser.add_argument("--widths", default="1,4,8,17")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--passes", type=int, default=12)
    parser.add_argument("--greedy", type=int, default=0, help="time N one-token passes of a greedy answer")
    args = parser.parse_args(argv)
    if args.greedy < 0 or args.passes < 1 or args.context < 1:
        parser.error("--greedy must be 0 or more, --passes and --context 1 or more")

    from app.engine.backends.torch_backend import TorchBackend
    from app.models.resolve import resolve_model

    folder = resolve_model(args.model, "torch", lambda message: None, precision=args.precision)
    backend = TorchBackend(folder, device="cpu", precision=args.precision)
    lean = backend._lean
    if lean is None or lean.native is None:
        print(f"no compiled layers here ({backend.lean_note or lean.native_note}): whole passes only")
    body, head = [], []
    if lean is not None and lean.native is not None:
        _timed(lean, "native", body)
        _timed(lean, "head", head)
    median = lambda values: statistics.median(values[2:]) * 1000 if len(values) > 2 else float("nan")  # noqa: E731
    if args.greedy:
        return _greedy(backend, folder, args.greedy, body, head, median)
    ids = [(11 + 37 * i) % min(40000, backend.vocab_size) for i in range(args.context + 32)]
    print(f"{args.model}: {backend.precision}; {torch.get_num_threads()} threads; context {args.context}")
    with torch.inference_mode():
        backend.reset()
        backend.prefill(ids[:args.context])
        for width in (int(w) for w in args.widths.split(",")):
            body.clear()
            head.clear()
            passes = []
            for _ in range(args.passes):
                start = time.perf_counter()
                backend._forward(backend._ids(ids[args.context:args.context + width]), width)
                passes.append(time.perf_counter() - start)
                backend.truncate(args.context)
            print(f"width {width:2d}: pass {median(passes):6.1f} ms   decoder layers {median(body):6.1f} ms   "
                  f"head {median(head):5.1f} ms")
    return 0


def _greedy(backend, folder, tokens: int, body: list, head: list, median) -> int:
    import json
    import resource

    from app.models.transformers_tokenizer import ChatTokenizer

    suite = json.loads((Path(__file__).parent / "suite.json").read_text())["prompts"]
    tokenizer = ChatTokenizer(folder)
    ids = tokenizer.render_chat([{"role": "user", "content": suite[0]["user"]}])
    passes = []
    with torch.inference_mode():
        backend.reset()
        token = int(torch.argmax(backend._forward(backend._ids(ids), 1)[-1]))
        body.clear()
        head.clear()
        for _ in range(tokens):
            start = time.perf_counter()
            logits = backend._forward(backend._ids([token]), 1)
            passes.append(time.perf_counter() - start)
            token = int(torch.argmax(logits[-1]))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"greedy, {tokens} tokens after a {len(ids)}-token prompt: pass {median(passes):6.1f} ms   decoder layers "
          f"{median(body):6.1f} ms   head {median(head):5.1f} ms   peak RSS {peak:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
