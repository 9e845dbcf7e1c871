"""GGUF files for benchmarks and tests: random-weight Llamas of real shapes, written block by block
at the per-tensor types llama.cpp's quantizer picks, and the demo re-quantized by llama.cpp itself.

Random weights: every 2-D tensor is `random_gguf.random_blocks` (random codes, finite normal fp16
scales) with its fp16 scale fields (d, and the mins) multiplied by one factor per tensor, so the
tensor's weights have a standard deviation of about 1/sqrt(cols): with the RMS norms before every
matmul, each layer's outputs and the logits stay O(1). A scale that the factor would make smaller
than fp16's smallest normal (2**-14) is held there, so scales stay normal as a real file's are;
for types with wide sub-scales (Q6_K's int8, Q4_K's 6-bit) that leaves the weights a few times
larger than the target, which still keeps activations far from float16's range. Norms are F32
ones. Nothing of the file is held in memory beyond one tensor: tensor infos first, then each
tensor's bytes as they are made.

The type map (`tensor_type`) follows llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp)
for the file types here on a dense, non-Falcon model without an importance matrix:

- the output head, or the token embedding when the head is tied to it (no output.weight): Q8_0
  where its rows are not whole blocks of the default type, else Q6_K unless the default is Q8_0;
- an untied token embedding: the default type;
- attn_v: Q6_K in the "use more bits" layers for Q4_K_M and Q5_K_M (the first and last eighth,
  and every third layer between: i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2, counted in layer
  order, as llama.cpp's loader sorts tensors by layer); Q5_K for IQ4_XS where heads / KV heads >= 4;
  for Q3_K_M Q5_K in the first two layers, else Q4_K; for Q2_K Q4_K where heads / KV heads >= 4,
  else Q3_K;
- ffn_down: Q6_K in those layers for Q4_K_M and Q5_K_M; Q5_K in the first eighth for IQ4_XS; for
  Q3_K_M Q5_K in the first sixteenth, else Q4_K; Q3_K for Q2_K;
- attn_output: Q4_K for Q3_K_M, Q3_K for Q2_K;
- every other 2-D weight: the default type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS);
- then a row that is not whole blocks of the chosen type falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
  Q6_K -> Q8_0, IQ4_XS, Q3_K and Q2_K -> IQ4_NL; F16 if still not whole blocks). The demo's hidden size (576)
  is not a multiple of 256, so its "Q4_K_M" is mostly Q5_0 (ffn_down alone, 1536 wide, K-quant).

    python -m app.bench.gguf_model_files random OUT.gguf llama-3.2-1b Q4_K_M [--seed 0]
    python -m app.bench.gguf_model_files requantize SOURCE.gguf OUT.gguf Q4_K_M   # needs llama-cpp-python
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from app.bench.random_gguf import SCALE_FIELDS, random_blocks

SMALLEST_NORMAL_F16 = 2.0 ** -14
SCALE_SAMPLE_ROWS = 16  # rows dequantized to measure a tensor's spread before scaling it


@dataclass(frozen=True)
class LlamaShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool  # no output.weight: the head reads the token embedding
    rope_theta: float = 500000.0
    eps: float = 1e-5
    context: int = 8192  # written as llama.context_length (the real models say 131072)

    @property
    def n_gqa(self) -> int:
        return self.heads // self.kv_heads


SHAPES: dict[str, LlamaShape] = {
    "llama-3.2-1b": LlamaShape("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, tied=True),
    "llama-3.2-3b": LlamaShape("llama-3.2-3b", 3072, 28, 24, 8, 128, 8192, tied=True),
    "llama-3.1-8b": LlamaShape("llama-3.1-8b", 4096, 32, 32, 8, 128, 14336, tied=False),
}


@dataclass(frozen=True)
class FileType:
    default: str  # the tensor type most weights get
    llama_ftype: int  # llama.h's LLAMA_FTYPE_MOSTLY_*


FILE_TYPES: dict[str, FileType] = {
    "Q4_K_M": FileType("Q4_K", 15),
    "Q5_K_M": FileType("Q5_K", 17),
    "Q6_K": FileType("Q6_K", 18),
    "Q8_0": FileType("Q8_0", 7),
    "IQ4_XS": FileType("IQ4_XS", 30),
    "Q3_K_M": FileType("Q3_K", 12),
    "Q2_K": FileType("Q2_K", 10),
}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL", "Q3_K": "IQ4_NL", "Q2_K": "IQ4_NL"}


def block_size(kind: str) -> int:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0]


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(name: str, file_type: str, *, cols: int, layer: int, layers: int, tied: bool, n_gqa: int) -> str:
    """The type llama.cpp's quantizer gives the 2-D weight `name` (cols: its row length) of a file
    of `file_type` (see the module's docstring for the rules and their limits)."""
    default = FILE_TYPES[file_type].default
    kind = default
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        if cols % block_size(default):
            kind = "Q8_0"
        elif default != "Q8_0":
            kind = "Q6_K"
    elif name == "token_embd.weight":
        pass
    elif "attn_v.weight" in name:
        if file_type == "Q2_K":
            kind = "Q4_K" if n_gqa >= 4 else "Q3_K"
        elif file_type == "Q3_K_M":
            kind = "Q5_K" if layer < 2 else "Q4_K"
        elif file_type == "IQ4_XS" and n_gqa >= 4:
            kind = "Q5_K"
        elif file_type in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, layers):
            kind = "Q6_K"
    elif "ffn_down" in name:
        if file_type == "Q2_K":
            kind = "Q3_K"
        elif file_type == "Q3_K_M":
            kind = "Q5_K" if layer < layers // 16 else "Q4_K"
        elif file_type in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, layers):
            kind = "Q6_K"
        elif file_type == "IQ4_XS" and layer < layers // 8:
            kind = "Q5_K"
    elif "attn_output.weight" in name:
        kind = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(file_type, kind)
    if cols % block_size(kind):
        if kind not in FALLBACK:
            raise ValueError(f"{name}: rows of {cols} are not whole {kind} blocks, and llama.cpp has no fallback")
        kind = FALLBACK[kind]
        if cols % block_size(kind):
            kind = "F16"
    return kind


def llama_tensors(shape: LlamaShape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape: (rows, cols) for weights, (n,) for norms) in llama.cpp's file order."""
    h, q, kv, ff = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h)), ("output_norm.weight", (h,))]
    if not shape.tied:
        out.append(("output.weight", (vocab, h)))
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_norm.weight", (h,)), (f"blk.{i}.attn_q.weight", (q, h)),
                (f"blk.{i}.attn_k.weight", (kv, h)), (f"blk.{i}.attn_v.weight", (kv, h)),
                (f"blk.{i}.attn_output.weight", (h, q)), (f"blk.{i}.ffn_norm.weight", (h,)),
                (f"blk.{i}.ffn_gate.weight", (ff, h)), (f"blk.{i}.ffn_up.weight", (ff, h)),
                (f"blk.{i}.ffn_down.weight", (h, ff))]
    return out


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def type_map(shape: LlamaShape, file_type: str, vocab: int) -> dict[str, str]:
    """Every tensor's type in a `file_type` file of `shape` (norms F32)."""
    return {name: "F32" if len(dims) == 1 else
            tensor_type(name, file_type, cols=dims[1], layer=_layer(name), layers=shape.layers, tied=shape.tied,
                        n_gqa=shape.n_gqa)
            for name, dims in llama_tensors(shape, vocab)}


def requantized_types(source: Path, file_type: str) -> dict[str, str]:
    """What llama.cpp's quantizer should make of `source` (a llama GGUF) at `file_type`: 2-D weights
    by the rules above, every other tensor as it is."""
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_heads = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())
    names = {t.name for t in reader.tensors}
    out = {}
    for t in reader.tensors:
        if len(t.shape) < 2 or not t.name.endswith("weight"):
            out[t.name] = t.tensor_type.name
        else:
            out[t.name] = tensor_type(t.name, file_type, cols=int(t.shape[0]), layer=_layer(t.name), layers=layers,
                                      tied="output.weight" not in names, n_gqa=heads // kv_heads)
    return out


def stored_bytes(kind: str, rows: int, cols: int) -> int:
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return rows * (cols // per_block) * block_bytes


def planned_bytes(shapes: Mapping[str, Sequence[int]], types: Mapping[str, str]) -> int:
    """A file's tensor bytes from each tensor's numpy shape and type (metadata left out)."""
    return sum(stored_bytes(types[name], int(np.prod(dims[:-1], dtype=np.int64)), int(dims[-1]))
               for name, dims in shapes.items())


# --- the tokenizer's fields -------------------------------------------------------------------------

KeyValue = tuple[str, object, gguf.GGUFValueType, gguf.GGUFValueType | None]


def tokenizer_kv(source: Path | Mapping | None = None) -> list[KeyValue]:
    """The tokenizer's GGUF fields: every `tokenizer.*` field of a GGUF file (None: the demo's), or
    from a dict as tests/factories.tokenizer_fields makes it (tokens, types, merges, chat_template:
    a slice of the demo's BPE vocabulary, with its ids for bos 1, eos 2, unk 0, pad 2)."""
    T = gguf.GGUFValueType
    if isinstance(source, Mapping):
        fields = [("tokenizer.ggml.model", "gpt2", T.STRING, None), ("tokenizer.ggml.pre", "smollm", T.STRING, None),
                ("tokenizer.ggml.tokens", list(source["tokens"]), T.ARRAY, T.STRING),
                ("tokenizer.ggml.token_type", [int(t) for t in source["types"]], T.ARRAY, T.INT32),
                ("tokenizer.ggml.merges", list(source["merges"]), T.ARRAY, T.STRING),
                ("tokenizer.ggml.bos_token_id", 1, T.UINT32, None), ("tokenizer.ggml.eos_token_id", 2, T.UINT32, None),
                ("tokenizer.ggml.unknown_token_id", 0, T.UINT32, None),
                ("tokenizer.ggml.padding_token_id", 2, T.UINT32, None),
                ("tokenizer.ggml.add_bos_token", False, T.BOOL, None),
                ("tokenizer.chat_template", str(source["chat_template"]), T.STRING, None)]
        return [kv for kv in fields if kv[2] != T.ARRAY or len(kv[1])]  # GGUF has no empty arrays (merges)
    if source is None:
        from app.models.demo import find_demo_gguf

        source = find_demo_gguf()
        if source is None:
            raise FileNotFoundError("the demo's GGUF is not on this computer: run `tandem-cli demo` first")
    reader = gguf.GGUFReader(source)
    out: list[KeyValue] = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            kind = field.types[0]
            out.append((key, field.contents(), kind, field.types[-1] if kind == T.ARRAY else None))
    return out


def _vocab(kv: list[KeyValue]) -> int:
    return next(len(value) for key, value, _, _ in kv if key == "tokenizer.ggml.tokens")


# --- random weights -----------------------------------------------------------------------------------

def scaled_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """`random_blocks` with every fp16 scale field times one factor: weights of about `std`
    (scales held at fp16's smallest normal where the factor would take them below it)."""
    blocks = random_blocks(kind, rows, cols, rng)
    if kind in ("F32", "F16", "BF16"):
        values = blocks.view(np.float32 if kind == "F32" else np.float16)
        if kind == "BF16":
            raise ValueError("no scaled BF16 blocks")
        values *= values.dtype.type(std / 0.02)  # random_blocks draws floats at 0.02
        return blocks
    qtype = gguf.GGMLQuantizationType[kind]
    sample = gguf.quants.dequantize(blocks[:SCALE_SAMPLE_ROWS], qtype).astype(np.float64)
    spread = float(np.sqrt(np.mean(sample * sample)))
    factor = std / spread if spread > 0 and np.isfinite(spread) else 1.0
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    flat = blocks.reshape(-1, block_bytes)
    for at in SCALE_FIELDS[kind]:
        field = np.ascontiguousarray(flat[:, at:at + 2]).view(np.float16).astype(np.float32)
        scaled = field * np.float32(factor)
        scaled = np.copysign(np.maximum(np.abs(scaled), np.float32(SMALLEST_NORMAL_F16)), field)
        flat[:, at:at + 2] = scaled.astype(np.float16).view(np.uint8)
    return blocks


def write_random_llama(path: str | Path, shape: LlamaShape | str, type_map_name: str, rng: np.random.Generator,
                       tokenizer: Path | Mapping | None = None) -> dict[str, str]:
    """Write a random-weight llama GGUF of `shape` at llama.cpp's `type_map_name` types (one of
    FILE_TYPES), with the tokenizer fields of `tokenizer` (see `tokenizer_kv`; None: the demo's).
    Written to a .partial file and renamed when complete. Returns each tensor's type."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    path = Path(path)
    kv = tokenizer_kv(tokenizer)
    vocab = _vocab(kv)
    tensors = llama_tensors(shape, vocab)
    types = type_map(shape, type_map_name, vocab)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(f"random {shape.name} ({type_map_name})")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.eps)
    writer.add_vocab_size(vocab)
    writer.add_file_type(FILE_TYPES[type_map_name].llama_ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, kind, sub_type in kv:
        writer.add_key_value(key, value, kind, sub_type=sub_type)
    for name, dims in tensors:  # infos first, then the bytes one tensor at a time
        kind = types[name]
        if kind == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            nbytes = stored_bytes(kind, *dims)
            writer.add_tensor_info(name, (dims[0], nbytes // dims[0]), np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, dims in tensors:
            if types[name] == "F32":
                writer.write_tensor_data(np.ones(dims, np.float32))
            else:
                writer.write_tensor_data(scaled_blocks(types[name], *dims, rng, std=1.0 / np.sqrt(dims[1])))
        writer.close()
        partial.replace(path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return types


# --- the demo, re-quantized by llama.cpp ------------------------------------------------------------

def requantize(source: str | Path, out: str | Path, type_map_name: str, threads: int = 2) -> Path:
    """llama.cpp's quantizer (llama-cpp-python's `llama_model_quantize`, `allow_requantize`) on an
    already quantized GGUF: its tensors dequantized and quantized again at `type_map_name`. Call it
    in a process of its own where PyTorch also runs (both keep thread pools)."""
    import ctypes

    import llama_cpp

    out = Path(out)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[type_map_name].llama_ftype
    params.allow_requantize = True
    params.nthread = threads
    partial = out.with_name(out.name + ".partial")
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp's quantizer returned {code} for {Path(source).name} -> {type_map_name}")
    partial.replace(out)
    return out


# --- what a pass reads ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileFacts:
    types: Counter  # tensor type -> tensors
    file_bytes: int
    weight_bytes: int  # every tensor in the file's own encoding
    pass_bytes: int  # what one decoding pass reads (see `file_facts`)
    kv_bytes: int
    tied: bool


def file_facts(path: str | Path, kv_tokens: int = 512, kv_bytes_per_value: int = 4) -> FileFacts:
    """What one decoding pass must read from a llama GGUF: every tensor in the file's own encoding
    except the input embedding (a lookup reads one row), but where the head is tied to it the
    embedding's bytes once (the head reads the whole table each pass), plus the keys and values
    of `kv_tokens` positions at `kv_bytes_per_value` (float32)."""
    reader = gguf.GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())
    field = reader.fields

    def number(key: str) -> int:
        return int(field[f"{arch}.{key}"].contents())

    heads, kv_heads, hidden = number("attention.head_count"), number("attention.head_count_kv"), \
        number("embedding_length")
    head_dim = int(field[f"{arch}.attention.key_length"].contents()) if f"{arch}.attention.key_length" in field \
        else hidden // heads
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    embedding = sum(int(t.n_bytes) for t in reader.tensors if t.name == "token_embd.weight")
    kv = 2 * number("block_count") * kv_heads * head_dim * kv_tokens * kv_bytes_per_value
    return FileFacts(Counter(t.tensor_type.name for t in reader.tensors), Path(path).stat().st_size, weights,
                     weights - (0 if tied else embedding) + kv, kv, tied)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rand = sub.add_parser("random", help="a random-weight llama of a real shape, the demo's tokenizer")
    rand.add_argument("out")
    rand.add_argument("shape", choices=sorted(SHAPES))
    rand.add_argument("type", choices=sorted(FILE_TYPES))
    rand.add_argument("--seed", type=int, default=0)
    req = sub.add_parser("requantize", help="llama.cpp's quantizer on a GGUF (llama-cpp-python)")
    req.add_argument("source")
    req.add_argument("out")
    req.add_argument("type", choices=sorted(FILE_TYPES))
    req.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "random":
        types = write_random_llama(args.out, args.shape, args.type, np.random.default_rng(args.seed))
        print(f"{args.out}: " + ", ".join(f"{k} x{n}" for k, n in Counter(types.values()).most_common()))
    else:
        requantize(args.source, args.out, args.type, args.threads)
        print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
