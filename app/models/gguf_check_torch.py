"""`tandem-cli models info`: what a GGUF holds and what runs of it on PyTorch, and with --check,
how far the loaded weights and their perplexity are from the file's own dequantized weights."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from app.models.gguf_blocks import INT4_TYPES, int4_groups
from app.models.gguf_codes import GROUP_OF, KERNEL_TYPES, KIND_OF, code_groups
from app.models.int4_cpu_torch import int4_kernel_words, int4_scales

# A fixed text for the perplexity check (Dickens, A Tale of Two Cities, 1859: public domain).
FIXED_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way - in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only. There were a king with a large jaw and a queen with a plain face, on the throne of "
    "England; there were a king with a large jaw and a queen with a fair face, on the throne of France. In "
    "both countries it was clearer than crystal to the lords of the State preserves of loaves and fishes, "
    "that things in general were settled for ever."
)


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def info_lines(gguf_path: Path) -> list[str]:
    """Per quantization type: tensors, weights, bytes in the file, and what PyTorch runs them as."""
    from app.models.gguf_import import inspect_gguf
    from app.models.gguf_layers_torch import INT4_BYTES, INT8_BYTES, INT8_TYPES, kernel_bytes, on_kernel
    from app.models.gguf_torch import CODE_WORDS, FLOAT_BYTES, loaded_bytes
    from app.models.screened_head_torch import SCREEN_BYTES

    info = inspect_gguf(gguf_path)
    lines = [f"{gguf_path.name}: {info.architecture} '{info.name}', {info.n_tensors} tensors, "
             f"{info.n_params / 1e6:.0f} million weights, {_size(info.size_bytes)}",
             f"{'type':<8}{'tensors':>8}{'weights':>14}{'in the file':>14}  on PyTorch (precision auto/gguf)"]
    for kind, count in sorted(info.tensor_types.items(), key=lambda kv: -info.elements[kv[0]]):
        n = info.elements[kind]
        embedding = (info.embedding or {}).get(kind, 0)  # a lookup table: float32 whatever its type
        head = (info.head or {}).get(kind, 0)
        parts = ["the token embedding, read from the file as needed (nothing loaded)"] if embedding else []
        if embedding and not info.head:
            parts[-1] += (f", and for the tied head an int8 screen of it ({_size(embedding * SCREEN_BYTES)}), the "
                          "rows that can win rescored in float32 from the file")
        if head:
            parts.append(f"the output head as an int8 screen ({_size(head * SCREEN_BYTES)}), the rows that can "
                         "win rescored in float32 from the file")
        rest = n - embedding - head
        if rest and kind in KERNEL_TYPES and on_kernel():
            parts.append(f"{CODE_WORDS[KIND_OF[kind]]}, the file's codes and scales exactly, on Tandem's kernel "
                         f"({_size(rest * kernel_bytes(kind))})")
        elif rest and kind in INT4_TYPES:
            parts.append(f"int4, groups of 32, {int4_scales()} ({_size(rest * INT4_BYTES)})")
        elif rest and kind in INT8_TYPES:
            parts.append(f"int8, one bfloat16 scale per row ({_size(rest * INT8_BYTES)})")
        elif rest and kind not in ("F32", "F16", "BF16"):  # IQ1-IQ3, TQ, MXFP4: no kernel of Tandem's
            parts.append(f"float32, dequantized by gguf (no CPU kernel for {kind}) ({_size(rest * FLOAT_BYTES)})")
        elif rest:
            parts.append(f"float32 ({_size(rest * FLOAT_BYTES)})")
        runs = "; ".join(parts)
        lines.append(f"{kind:<8}{count:>8}{n:>14,}{_size(info.stored[kind]):>14}  {runs}")
    loaded = loaded_bytes(info.elements, info.embedding, info.head, info.head_rows)
    lines.append(f"loaded size {_size(loaded)} (float32 would be "
                 f"{_size(info.n_params * 4)}); {int4_kernel_words()}")
    lines.append(gpu_line(info))
    return lines


def gpu_line(info) -> str:
    """What an NVIDIA GPU runs of the file (gguf_torch.load_gguf_model on CUDA), and its size there."""
    from app.models.gguf_torch import loaded_bytes

    four = [kind for kind in INT4_TYPES if info.elements.get(kind)]
    rest = [kind for kind in info.elements if kind not in INT4_TYPES]
    parts = [f"{', '.join(four)} as int4 in groups of 32 on PyTorch's tinygemm kernel, the file's codes with "
             "their scales and zeros in bfloat16"] if four else []
    if rest:
        parts.append(f"{', '.join(rest)} in bfloat16 (the embedding and the head included)")
    if four and any(kind in INT4_TYPES for kind in info.embedding or {}):  # a table, never tinygemm's
        parts.append("the token embedding in bfloat16")
    size = loaded_bytes(info.elements, info.embedding, device="cuda")
    return f"on an NVIDIA GPU: {_size(size)} in the GPU's memory; " + "; ".join(parts)


def quantization_error(gguf_path: Path) -> dict[str, dict]:
    """Per type and what it loads as ("Q4_1 as int4 g32", "Q6_K as int8 per row", "Q8_0 as
    float32"), the loaded weights (as the kernels read them, bfloat16 scales included) against
    gguf's own dequantization: the largest error relative to each tensor's largest weight, and the
    RMS error relative to its RMS."""
    import gguf
    import torch

    from app.models.gguf_layers_torch import INT8_TYPES, GGUFInt8Linear, on_kernel
    from app.models.int4_cpu_torch import CodeBlocks
    from app.models.gguf_torch import CODE_WORDS

    from app.models.screened_head_torch import ScreenedHead

    reader = gguf.GGUFReader(gguf_path, "r")
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    out: dict[str, dict] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        flat = len(tensor.shape) != 2
        rows, cols = (0, 0) if flat else (int(tensor.shape[1]), int(tensor.shape[0]))
        embedding = tensor.name.startswith("token_embd")
        if (tensor.name == "output.weight" or (embedding and tied)) and not flat:
            reference = _reference(gguf, tensor, rows, cols)
            head = ScreenedHead(torch.from_numpy(np.ascontiguousarray(reference)), exact_rows=None)
            screen = head.codes.float() * head.scales.float()[:, None]
            what = "tied output head" if embedding else "output head"
            _add_error(out, f"{kind} ({what}) as int8 screen, argmax in float32", screen.numpy(), reference)
            if not embedding:
                continue
        if kind in KERNEL_TYPES and not flat and not embedding and on_kernel() and cols % GROUP_OF[KIND_OF[kind]] == 0:
            loaded = CodeBlocks.of(code_groups(kind, tensor.data, rows, cols), kind).dequantize()  # the file's numbers
            _add_error(out, f"{kind} as {CODE_WORDS[KIND_OF[kind]]}", loaded, _reference(gguf, tensor, rows, cols))
            continue
        if kind in INT4_TYPES and not flat and not embedding:
            groups = int4_groups(kind, tensor.data, rows, cols)
            # PyTorch's int4 kernel: scales and zeros in bfloat16
            bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16).float().numpy()  # noqa: E731
            loaded = type(groups)(groups.codes, bf16(groups.scale), bf16(groups.zero)).dequantize()
            _add_error(out, f"{kind} as int4 g32", loaded, _reference(gguf, tensor, rows, cols))
            continue
        if kind in INT8_TYPES and not flat and not embedding:
            reference = _reference(gguf, tensor, rows, cols)
            layer = GGUFInt8Linear(rows, cols, torch.bfloat16)
            layer.fill(0, torch.from_numpy(np.ascontiguousarray(reference)))
            _add_error(out, f"{kind} as int8 per row", layer.dequantized().numpy(), reference)
            continue
        # dequantized by gguf itself: the reference, exactly
        what = f"{kind} (token embedding) as float32 rows read from the file" if embedding else f"{kind} as float32"
        out.setdefault(what, {"tensors": 0, "max_rel": 0.0, "rms_rel": 0.0})["tensors"] += 1
    bf16 = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16).float().numpy()  # noqa: E731
    for tensor in reader.tensors:  # on an NVIDIA GPU (load_gguf_model on CUDA)
        kind = tensor.tensor_type.name
        if len(tensor.shape) != 2 or kind == "BF16":
            continue
        rows, cols = int(tensor.shape[1]), int(tensor.shape[0])
        reference = _reference(gguf, tensor, rows, cols)
        if kind in INT4_TYPES and not tensor.name.startswith("token_embd"):  # tinygemm: bfloat16 scales, zeros
            groups = int4_groups(kind, tensor.data, rows, cols)
            held = type(groups)(groups.codes, bf16(groups.scale), bf16(groups.zero)).dequantize()
            _add_error(out, f"{kind} on an NVIDIA GPU as int4 g32", held, reference)
        else:  # every other tensor, the embedding too, in bfloat16
            _add_error(out, f"{kind} on an NVIDIA GPU as bfloat16", bf16(reference), reference)
    return out


def _reference(gguf, tensor, rows: int, cols: int) -> np.ndarray:
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, cols)


def _add_error(out: dict, kind: str, loaded: np.ndarray, reference: np.ndarray) -> None:
    diff = loaded - reference
    entry = out.setdefault(kind, {"tensors": 0, "max_rel": 0.0, "rms_rel": 0.0})
    entry["tensors"] += 1
    entry["max_rel"] = max(entry["max_rel"], float(np.abs(diff).max() / max(np.abs(reference).max(), 1e-30)))
    rms = float(np.sqrt(np.mean(diff.astype(np.float64) ** 2)) / max(np.sqrt(np.mean(reference ** 2.0)), 1e-30))
    entry["rms_rel"] = max(entry["rms_rel"], rms)


def perplexity(model, token_ids: list[int]) -> float:
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([token_ids])).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(token_ids[1:]))
    return math.exp(float(nll))


def check_lines(gguf_path: Path, folder: Path) -> list[str]:
    """The quantization error per type and the perplexity of FIXED_TEXT, loaded at the file's own
    precisions against the file's dequantized weights run in float32."""
    from app.models.gguf_torch import load_gguf_model
    from app.models.transformers_tokenizer import ChatTokenizer

    lines = ["quantization error against gguf's own dequantization (the worst tensor of each kind):"]
    for what, e in sorted(quantization_error(gguf_path).items()):
        if what.endswith(("as float32", "read from the file")):
            lines.append(f"  {what}: {e['tensors']} tensors, exact")
        else:
            why = (" (the file's weights exactly)" if e["max_rel"] == 0 else " (each weight rounded to bfloat16)"
                   if what.endswith("as bfloat16") else " (bfloat16 scales)")
            lines.append(f"  {what}: {e['tensors']} tensors, largest error {e['max_rel']:.2e} of the tensor's "
                         f"largest weight, RMS error {e['rms_rel']:.2e} of its RMS{why}")
    ids = ChatTokenizer(folder).encode(FIXED_TEXT)
    own, _ = load_gguf_model(folder, gguf_path)
    ppl_own = perplexity(own, ids)
    del own
    reference, _ = load_gguf_model(folder, gguf_path, int4=False)
    ppl_ref = perplexity(reference, ids)
    lines.append(f"perplexity of a fixed text ({len(ids)} tokens, A Tale of Two Cities): {ppl_own:.3f} as loaded, "
                 f"{ppl_ref:.3f} with the file's weights dequantized to float32 ({ppl_own / ppl_ref - 1:+.2%})")
    return lines
