"""A GGUF on an NVIDIA GPU against the bfloat16 model of the same shape: what a pass costs, by width.

    python benchmarks/cuda_gguf.py --tokenizer TOK [--shape llama-3.1-8b] [--out /tmp/cg]
    python benchmarks/cuda_gguf.py --quick      # a tiny shape on the CPU, with the GPU's modules

1. Writes a random-weight Llama of a real shape at llama.cpp's Q4_K_M types (Q4_K, with Q6_K for
   the head and the more-bits layers' attn_v and ffn_down; app/bench/gguf_model_files.py), with a
   generated 49,152-token vocabulary (the demo's size, as cuda_bench.py's bf16 models have; a GPU
   machine has no demo file to take one from). No quantizer: random valid blocks, finite scales.
2. Imports it (config and tokenizer only) and loads it on the GPU at its own precisions: the
   4-bit tensors on tinygemm, the rest in bfloat16 (docs/gguf.md).
3. The read bandwidth of the same run, the bound of a pass (its bytes at 512 tokens of context
   over that bandwidth) and the pass cost by width, captured as CUDA graphs, for the GGUF and for
   cuda_bench.py's bfloat16 model of the same shape: the ratio the GPU issue's table asks for.

`--quick` runs the same steps on the CPU with a tiny shape (the GPU's modules, tinygemm's CPU
kernel; graphs off): a check that the script works, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

VOCAB_SIZE = 49152
BF16_SHAPE = {"llama-3.1-8b": "t8b", "llama-3.2-1b": "d1b"}  # cuda_bench.py's names for the same shapes


def vocabulary(size: int) -> dict:
    """A byte-level BPE vocabulary of `size` tokens with real merges (the import builds a tokenizer
    from it): the specials, letters and digits, letter+digit merges, then filler tokens."""
    letters, digits = list("abcdefghijklmnopqrstuvwxyz"), [str(i) for i in range(10)]
    merges = [f"{a} {d}" for a in letters for d in digits]
    tokens = ["<unk>", "<s>", "</s>", *letters, *digits, *(m.replace(" ", "") for m in merges)]
    tokens += [f"x{i}" for i in range(size - len(tokens))]
    return {"tokens": tokens, "types": [3, 3, 3] + [1] * (size - 3), "merges": merges,
            "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}


def write(shape, out: Path, vocab: int) -> Path:
    from app.bench.gguf_model_files import write_random_llama

    path = out / f"{shape.name}-Q4_K_M.gguf"
    if not path.exists():
        start = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        write_random_llama(path, shape, "Q4_K_M", np.random.default_rng(0), tokenizer=vocabulary(vocab))
        print(f"wrote {path.name}: {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - start:.0f} s",
              flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny shape on the CPU (checks the script)")
    parser.add_argument("--shape", default="llama-3.1-8b", help="llama-3.1-8b or llama-3.2-1b")
    parser.add_argument("--tokenizer", default=None, help="the demo's tokenizer files (for the bf16 model)")
    parser.add_argument("--out", default="/tmp/tandem-cuda-gguf")
    parser.add_argument("--widths", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-bf16", action="store_true", help="the GGUF's rows only")
    args = parser.parse_args(argv)

    from cuda_bench import CONTEXT, build, pass_bytes, pass_cost, read_bandwidth

    from app.bench.gguf_model_files import SHAPES, LlamaShape
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import import_gguf

    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    if quick:  # the GPU's modules on the CPU (tinygemm's CPU kernel computes the same numbers)
        TorchBackend._gguf_gpu_layers = lambda self: True
        shape = LlamaShape("tiny", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                           tied=False)
    else:
        shape = SHAPES[args.shape]
    out = Path(args.out)
    widths = [int(w) for w in args.widths.split(",")]
    path = write(shape, out, VOCAB_SIZE)
    start = time.perf_counter()
    folder = import_gguf(path, out / f"{path.stem}-import", mlx_variants=())["hf"]
    print(f"imported in {time.perf_counter() - start:.1f} s", flush=True)
    bandwidth = read_bandwidth(device, (64 << 20) if quick else (2 << 30))
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    graphs = "off" if quick else "auto"
    rows: dict[str, dict] = {}
    start = time.perf_counter()
    target = TorchBackend(folder, device=str(device), precision="gguf", graphs=graphs)
    print(f"GGUF loaded in {time.perf_counter() - start:.1f} s: {target.precision}", flush=True)
    rows["GGUF Q4_K_M"] = {"bound": pass_bytes(target, CONTEXT) / bandwidth,
                           "costs": {w: pass_cost(target, w, args.repeats, device) for w in widths}}
    del target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bf16_shape = BF16_SHAPE.get(args.shape)
    if not args.no_bf16 and not quick and bf16_shape and args.tokenizer:
        bf16_dir = build(bf16_shape, out, Path(args.tokenizer), device, torch.bfloat16)
        bf16 = TorchBackend(bf16_dir, device=str(device), graphs=graphs)
        rows["bf16"] = {"bound": pass_bytes(bf16, CONTEXT) / bandwidth,
                        "costs": {w: pass_cost(bf16, w, args.repeats, device) for w in widths}}
        del bf16
    print(f"\n{shape.name}, {CONTEXT} tokens of context, {'graphs' if graphs != 'off' else 'eager'}; ms a pass "
          f"(of the bound)")
    print("| model | bound ms | " + " | ".join(f"width {w}" for w in widths) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in widths) + " |")
    for name, row in rows.items():
        cells = [f"{row['costs'][w] * 1e3:.2f} ({row['bound'] / row['costs'][w]:.2f})" for w in widths]
        print(f"| {name} | {row['bound'] * 1e3:.2f} | " + " | ".join(cells) + " |")
    if "bf16" in rows:
        ratio = rows["bf16"]["costs"][widths[0]] / rows["GGUF Q4_K_M"]["costs"][widths[0]]
        print(f"GGUF Q4_K_M against bf16 at width {widths[0]}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
