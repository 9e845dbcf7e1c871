"""A GGUF file as an MLX model folder at the file's own numbers (MLX side).

mlx-lm's quantized layers compute, per group of 32 consecutive weights of a row,

    w = fl32(fl32(scales * q) + biases)        q unsigned in 0 .. 2^bits - 1

with float32 scales and biases (MLX's CPU build rounds the product, then the sum: no fused
multiply-add; tests/test_gguf_mlx.py checks it). Every GGUF type whose weights that formula holds
becomes such a layer with the file's codes, scales and offsets (from app.models.gguf_codes, bit for
bit gguf-py's dequantize), so `mx.dequantize` gives gguf's weights exactly. In each case below the
product scale * q is an integer of at most 24 bits times a power of two, exact in float32, and the
sum is either exact or the one rounding gguf makes too:

- Q4_0 (4-bit): q, scale d, bias -8d. d*q and 8d exact, their sum d*(q - 8) too.
- Q4_1 (4-bit), Q5_1 (5-bit): q, scale d, bias m: d*q exact, then the one rounding of gguf's d*q + m.
- Q4_K (4-bit), Q5_K (5-bit): q, scale fl(d*sc), bias -fl(dmin*m): float32 products (17 bits),
  as gguf forms them; gguf's fl(d*sc)*q - fl(dmin*m) rounds once, after the exact product, as here.
- Q5_0 (5-bit): q, scale d, bias -16d (like Q4_0).
- Q8_0 (8-bit): q = x + 128, scale d, bias -128d: d*q needs 19 bits, the sum d*x is exact.
- IQ4_NL, IQ4_XS (8-bit): the non-linear grid's values are int8 (kvalues), so q = kvalue + 128 with
  scale d (IQ4_XS: fl(d*(ls - 32)), 16 bits) and bias -128*scale: at most 24 bits, exact.
- Q3_K (8-bit): its groups of 16 have scales d*(sc - 32) with one fp16 d per 256 weights, so a
  group of 32 holds q = (sc - 32)*q3 + 127 in 3..255 (the products lie in -124..128) with scale d
  and bias -127d: every term exact.
- MXFP4 (MLX's own mxfp4 mode): the same e2m1 codes and e8m0 scale per 32.

The one difference in the bits: gguf writes d*0 with d's sign, MLX's d*q + b gives +0 (the same
number in every product and sum).

MLX has no group of 16 (its groups are 32, 64 and 128), so Q6_K and Q2_K, whose sub-blocks of 16
have scales no single 8-bit grid of 32 holds, take the nearest MLX format: 8-bit affine in groups
of 32, re-quantized from gguf's dequantization (min to max of each group in 255 steps), and so does
any type gguf dequantizes but nothing here reads (IQ1-IQ3, TQ, NVFP4). Their largest weight change
is measured while converting and kept in the folder's record (`RECORD`). Nothing becomes float16:
norms and other 1-D tensors stay float32, F16 linear weights stay float16 (an F16 embedding
becomes float32: its rows set the activations' type), F32 and BF16 tensors float32.

The conversion itself is numpy (codes, packing, safetensors); the names come from transformers'
GGUF tables (the model's parameter names, Q/K rows back in Hugging Face order), as on PyTorch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from app.models.errors import ModelFileError
from app.models.gguf_codes import QK_K, code_groups
from app.models.gguf_header import open_tensors  # gguf's reader without the vocabulary arrays

log = logging.getLogger(__name__)

GROUP = 32  # MLX's smallest group (it has 32, 64 and 128)
REQUANT_BITS = 8  # the nearest MLX format for the types it cannot hold exactly
RECORD = "tandem-gguf-mlx.json"  # in the folder: what each type became, and how far it moved
CHUNK_BYTES = 16 << 20  # rows of a large tensor decoded this many bytes of float32 at a time
SHARD_BYTES = 2 << 30  # safetensors files of at most about this size
FLOAT_TYPES = ("F32", "F16", "BF16")


class Format(NamedTuple):
    """What a GGUF type becomes on MLX."""

    bits: int
    mode: str  # "affine" (w = scales * q + biases) or "mxfp4"
    exact: bool  # mx.dequantize gives gguf's dequantization exactly
    how: str  # the mapping, in words

    @property
    def words(self) -> str:
        grid = "mxfp4" if self.mode == "mxfp4" else f"{self.bits}-bit affine"
        return f"{grid}, groups of {GROUP}, float32 scales" + ("" if self.mode == "mxfp4" else " and biases")


_REQUANTIZED = Format(REQUANT_BITS, "affine", False,
                      f"re-quantized to {REQUANT_BITS} bits from gguf's dequantization (min to max of each group)")

FORMATS: dict[str, Format] = {
    "Q4_0": Format(4, "affine", True, "the file's codes q, scale d, bias -8d"),
    "Q4_1": Format(4, "affine", True, "the file's codes q, scale d, bias m"),
    "Q4_K": Format(4, "affine", True, "the file's codes q, scale d*sc, bias -dmin*m (float32 products)"),
    "Q5_0": Format(5, "affine", True, "the file's codes q, scale d, bias -16d"),
    "Q5_1": Format(5, "affine", True, "the file's codes q, scale d, bias m"),
    "Q5_K": Format(5, "affine", True, "the file's codes q, scale d*sc, bias -dmin*m (float32 products)"),
    "Q8_0": Format(8, "affine", True, "codes x + 128, scale d, bias -128d"),
    "IQ4_NL": Format(8, "affine", True, "codes kvalue + 128 (the non-linear grid's int8 values), scale d, "
                                        "bias -128d"),
    "IQ4_XS": Format(8, "affine", True, "codes kvalue + 128, scale d*(ls - 32), bias -128 times that"),
    "Q3_K": Format(8, "affine", True, "codes (sc - 32)*q + 127 per group of 16, scale d (one per 256), bias -127d"),
    "MXFP4": Format(4, "mxfp4", True, "the file's e2m1 codes and e8m0 scales"),
    "Q6_K": _REQUANTIZED,
    "Q2_K": _REQUANTIZED,
}


def format_of(kind: str) -> Format:
    """What a quantized GGUF type (a name such as "Q4_K") becomes on MLX."""
    return FORMATS.get(kind, _REQUANTIZED)


class MLXQuantized(NamedTuple):
    """One tensor (or row slice) as an MLX quantized layer's arrays, before packing."""

    q: np.ndarray  # (rows, cols) uint8 in 0 .. 2^bits - 1 (mxfp4: the e2m1 codes)
    scales: np.ndarray  # (rows, cols // 32) float32 (mxfp4: uint8 e8m0)
    biases: np.ndarray | None  # (rows, cols // 32) float32; None for mxfp4
    bits: int
    mode: str

    def dequantize(self) -> np.ndarray:
        """(rows, cols) float32 as MLX's CPU build computes it: fl(fl(scales * q) + biases)."""
        rows, cols = self.q.shape
        q = self.q.reshape(rows, cols // GROUP, GROUP)
        if self.mode == "mxfp4":
            magnitude = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
            values = np.where(q & 8, -1.0, 1.0).astype(np.float32) * magnitude[q & 7]
            scale = np.ldexp(np.float32(1), self.scales.astype(np.int32) - 127).astype(np.float32)
            return (values * scale[:, :, None]).reshape(rows, cols)
        w = np.multiply(self.scales[:, :, None], q.astype(np.float32), dtype=np.float32)
        np.add(w, self.biases[:, :, None], out=w, dtype=np.float32)
        return w.reshape(rows, cols)


def _shifted(codes: np.ndarray, by: int) -> np.ndarray:
    """Signed codes plus `by`, as the unsigned q MLX stores."""
    return (codes.astype(np.int16) + np.int16(by)).astype(np.uint8)


def requantize(values: np.ndarray, bits: int = REQUANT_BITS) -> MLXQuantized:
    """(rows, cols) float32 -> the nearest `bits`-bit affine grid per group of 32: from the group's
    smallest to its largest weight in 2^bits - 1 steps, each weight to its nearest step as MLX
    computes it (a change of at most half a step, plus float32's rounding of it)."""
    rows, cols = values.shape
    g = values.reshape(rows, cols // GROUP, GROUP)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    top = 2 ** bits - 1
    scales = ((hi.astype(np.float64) - lo) / top).astype(np.float32)
    biases = lo.astype(np.float32)
    step = np.where(scales > 0, scales, 1).astype(np.float64)[:, :, None]
    q = np.clip(np.rint((g - biases[:, :, None].astype(np.float64)) / step), 0, top).astype(np.uint8)
    return MLXQuantized(q.reshape(rows, cols), scales, biases, bits, "affine")


def _q3_k(raw: np.ndarray, rows: int, cols: int) -> MLXQuantized:
    groups = code_groups("Q3_K", raw, rows, cols)
    d = groups.factors.supers[:, :, 0]  # (rows, cols // 256): the fp16 d of each super-block
    sc = groups.factors.smalls[:, :, 0].astype(np.int16)  # (rows, cols // 16): sc - 32
    q = np.repeat(sc, 16, axis=1) * groups.codes.astype(np.int16) + np.int16(127)  # 3..255
    scales = np.repeat(d, QK_K // GROUP, axis=1)
    return MLXQuantized(q.astype(np.uint8), scales, scales * np.float32(-127), 8, "affine")


def _mxfp4(raw: np.ndarray, rows: int, cols: int) -> MLXQuantized:
    blocks = np.asarray(raw, dtype=np.uint8).reshape(rows * (cols // 32), 17)
    qs = blocks[:, 1:]
    q = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)  # low nibbles: weights 0..15
    return MLXQuantized(q.reshape(rows, cols), blocks[:, 0].reshape(rows, cols // 32).copy(), None, 4, "mxfp4")


def mlx_quantized(kind: str, raw: np.ndarray, rows: int, cols: int) -> MLXQuantized:
    """A quantized GGUF tensor's bytes (rows of it) as MLX's arrays: the file's numbers where
    `format_of(kind).exact`, else re-quantized from gguf's dequantization."""
    if kind == "Q3_K":
        return _q3_k(raw, rows, cols)
    if kind == "MXFP4":
        return _mxfp4(raw, rows, cols)
    fmt = format_of(kind)
    if not fmt.exact:
        import gguf

        values = gguf.quants.dequantize(np.asarray(raw), gguf.GGMLQuantizationType[kind])
        return requantize(np.asarray(values, dtype=np.float32).reshape(rows, cols), fmt.bits)
    groups = code_groups(kind, raw, rows, cols)
    codes, scale, offset = groups.codes, groups.scale, groups.offset
    if kind in ("Q4_0", "Q4_1", "Q4_K", "Q5_1", "Q5_K"):  # w = scale * q + offset, q unsigned already
        return MLXQuantized(codes.view(np.uint8), scale, offset, fmt.bits, "affine")
    if kind == "Q5_0":  # gguf: d * (q - 16)
        return MLXQuantized(_shifted(codes, 16), scale, scale * np.float32(-16), 5, "affine")
    # Q8_0, IQ4_NL, IQ4_XS: w = scale * c, c int8
    return MLXQuantized(_shifted(codes, 128), scale, scale * np.float32(-128), 8, "affine")


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) uint8 codes -> MLX's packed uint32 (rows, cols * bits // 32): the codes of a
    row as one little-endian bit stream, code j at bits j*bits .. j*bits + bits - 1."""
    rows, cols = q.shape
    if bits == 8:
        return np.ascontiguousarray(q).view("<u4")
    if bits == 4:
        return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).view("<u4")
    stream = np.unpackbits(q[:, :, None], axis=-1, bitorder="little")[:, :, :bits].reshape(rows, cols * bits)
    return np.ascontiguousarray(np.packbits(stream, axis=-1, bitorder="little")).view("<u4")


@dataclass
class TypeReport:
    """What the tensors of one GGUF type became, and how far their weights moved."""

    became: str
    exact: bool
    tensors: int = 0
    weights: int = 0
    max_abs: float = 0.0  # the largest |MLX's weight - gguf's|
    max_rel: float = 0.0  # the same over its tensor's largest |weight| (the worst tensor)

    def add(self, weights: int, max_abs: float = 0.0, largest: float = 0.0) -> None:
        self.tensors += 1
        self.weights += weights
        self.max_abs = max(self.max_abs, max_abs)
        if largest > 0:
            self.max_rel = max(self.max_rel, max_abs / largest)


@dataclass
class MLXImport:
    """The result of gguf_to_mlx_folder: per GGUF type (and "F16 (token embedding)" and the like)
    what it became, and the tensors the model has no place for."""

    types: dict[str, TypeReport] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"types": {k: vars(v) for k, v in self.types.items()}, "skipped": self.skipped}


# transformers' tensor processors whose changes the codes can follow: moving whole rows (llama's Q/K
# order) or changing only the norms (gemma's and nemotron's "- 1"), which stay float32 here anyway
_ROW_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")
_NORM_PROCESSORS = ("Gemma2TensorProcessor", "NemotronTensorProcessor")


def unsupported_reason(architecture: str, gguf_path: Path | None = None) -> str | None:
    """None where a GGUF of this architecture (and, given `gguf_path`, this file) converts here; else
    why not, in words: transformers' reader re-arranges its tensors (merged experts, fused q/k/v,
    transposed layouts), or the file has mixture-of-experts tensors, which mlx-lm stacks in layers
    of its own (SwitchGLU) that nothing here maps yet."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    name = TENSOR_PROCESSORS.get(architecture, TensorProcessor).__name__
    if name not in _ROW_PROCESSORS and name not in _NORM_PROCESSORS:
        return (f"a {architecture} GGUF's tensors are re-arranged on import ({name}), so its codes cannot be "
                "kept as the file holds them on MLX")
    if gguf_path is not None:
        experts = [t.name for t in open_tensors(gguf_path).tensors if len(t.shape) > 2]
        if experts:
            return f"its mixture-of-experts tensors ({experts[0]}, ...) have no MLX layer mapped here yet"
    return None


def _shards(out_dir: Path):
    """A writer of safetensors files of about SHARD_BYTES; call with None to finish. Returns the names."""
    from safetensors.numpy import save_file

    pending: dict[str, np.ndarray] = {}
    written: list[tuple[Path, list[str]]] = []
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            path = out_dir / f"model-part-{len(written):05d}.safetensors"
            save_file(pending, str(path), metadata={"format": "mlx"})
            written.append((path, list(pending)))
            pending, size = {}, 0

    def add(name: str | None, array: np.ndarray | None = None) -> None:
        nonlocal size
        if name is None:
            flush()
            _name_shards(out_dir, written)
            return
        pending[name] = np.ascontiguousarray(array)
        size += array.nbytes
        if size >= SHARD_BYTES:
            flush()

    return add


def _name_shards(out_dir: Path, written: list[tuple[Path, list[str]]]) -> None:
    """mlx-lm's names: model.safetensors alone, else model-0000i-of-0000n.safetensors with an index."""
    if len(written) == 1:
        written[0][0].rename(out_dir / "model.safetensors")
        return
    weight_map = {}
    for i, (path, names) in enumerate(written):
        final = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        path.rename(out_dir / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _row_chunks(rows: int, cols: int):
    """(start, stop) over a tensor's rows, CHUNK_BYTES of float32 at a time."""
    step = max(1, CHUNK_BYTES // max(1, cols * 4))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def gguf_to_mlx_folder(gguf_path: Path, out_dir: Path, progress: Callable[[str], None] | None = None) -> MLXImport:
    """Write an MLX model folder for `gguf_path` into `out_dir`: config.json (with mlx-lm's
    "quantization" entry per quantized layer), the tokenizer, and safetensors of MLX quantized
    layers at the file's own numbers (module docstring). Returns what each type became, also
    written to `out_dir/RECORD`. Raises ModelFileError for an architecture whose tensors transformers
    re-arranges (`unsupported_reason`)."""
    import functools

    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    from app.models.transformers_convert import gguf_to_hf_folder

    say = progress or (lambda message: None)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = open_tensors(gguf_path)  # the vocabulary reaches the tokenizer through the folder, not from here
    architecture = str(reader.fields["general.architecture"].contents())
    reason = unsupported_reason(architecture, gguf_path)
    if reason is not None:
        raise ModelFileError(f"{gguf_path.name}: {reason}. Open it at precision float32 instead.")
    gguf_to_hf_folder(gguf_path, out_dir, weights=False)  # config.json and the tokenizer
    config = AutoConfig.from_pretrained(str(out_dir))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    moves_rows = type(processor).__name__ in _ROW_PROCESSORS
    original = gguf.get_tensor_name_map  # built once, not once per submodule (as gguf_torch does)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        names = get_gguf_hf_weights_map(skeleton, processor)
    finally:
        gguf.get_tensor_name_map = original
    modules = dict(skeleton.named_modules())
    embedding = skeleton.get_input_embeddings()

    result = MLXImport()
    quantization: dict[str, dict] = {}
    bits_weights: dict[int, int] = {}
    write = _shards(out_dir)
    n = len(reader.tensors)
    for i, tensor in enumerate(reader.tensors):
        if i and i % max(1, n // 10) == 0:
            say(f"Converting {gguf_path.name} for MLX: {i} of {n} tensors ...")
        hf_name = names.get(tensor.name)
        if hf_name is None:
            result.skipped.append(tensor.name)
            continue
        module_path, _, attr = hf_name.rpartition(".")
        module = modules.get(module_path)
        kind = tensor.tensor_type.name
        shape = [int(s) for s in tensor.shape]
        cols, rows = shape[0], int(np.prod(shape[1:])) if len(shape) > 1 else 1
        is_embedding = module is embedding
        layer = (attr == "weight" and len(shape) == 2 and cols % GROUP == 0
                 and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)))

        def move(a: np.ndarray, name: str = tensor.name) -> np.ndarray:
            return processor.process(weights=a, name=name).weights if moves_rows else a

        if kind in FLOAT_TYPES or not layer:
            values = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            values = processor.process(weights=values, name=tensor.name).weights  # the norms' "- 1" too
            keep_f16 = kind == "F16" and layer and not is_embedding  # the embedding's rows set the activations' dtype
            dtype = np.float16 if keep_f16 else np.float32
            write(hf_name, np.ascontiguousarray(values, dtype=dtype).reshape(
                [rows, cols] if len(shape) == 2 else list(reversed(shape))))
            what = "float16" if keep_f16 else "float32"
            if kind not in FLOAT_TYPES:  # a quantized tensor no MLX layer holds (a 1-D one, say)
                what += ", gguf's dequantization (not a layer MLX quantizes)"
            result.types.setdefault(f"{kind} as {what}", TypeReport(what, True)).add(int(np.prod(shape)))
            continue
        fmt = format_of(kind)
        data = tensor.data.reshape(rows, -1)
        packed: dict[str, list[np.ndarray]] = {"weight": [], "scales": [], "biases": []}
        max_abs = largest = 0.0
        for start, stop in _row_chunks(rows, cols):
            part = mlx_quantized(kind, data[start:stop], stop - start, cols)
            if not fmt.exact:  # the change, against gguf's own dequantization
                reference = np.asarray(gguf.quants.dequantize(data[start:stop], tensor.tensor_type),
                                       dtype=np.float32).reshape(stop - start, cols)
                max_abs = max(max_abs, float(np.abs(part.dequantize() - reference).max()))
                largest = max(largest, float(np.abs(reference).max()))
            packed["weight"].append(pack(part.q, part.bits))  # packed a chunk at a time: rows stay rows
            packed["scales"].append(part.scales)
            if part.biases is not None:
                packed["biases"].append(part.biases)
        for what, chunks in packed.items():
            if chunks:  # Q and K rows back in Hugging Face order (llama): whole rows, so packed ones too
                write(f"{module_path}.{what}", move(chunks[0] if len(chunks) == 1 else np.concatenate(chunks)))
        del packed
        quantization[module_path] = {"group_size": GROUP, "bits": fmt.bits, "mode": fmt.mode}
        bits_weights[fmt.bits] = bits_weights.get(fmt.bits, 0) + rows * cols
        how = f"{fmt.words}: {fmt.how}"
        result.types.setdefault(kind, TypeReport(how, fmt.exact)).add(rows * cols, max_abs, largest)
    write(None)
    _write_config(out_dir, quantization, bits_weights)
    (out_dir / RECORD).write_text(json.dumps({"source": str(gguf_path), **result.to_json()}, indent=2) + "\n")
    if result.skipped:
        log.info("%s: tensors without a place in the model: %s", gguf_path.name, ", ".join(result.skipped))
    return result


def _write_config(out_dir: Path, quantization: dict[str, dict], bits_weights: dict[int, int]) -> None:
    """mlx-lm's "quantization" entry: a default (the bits most weights have) and one per layer."""
    if not quantization:
        return  # no quantized layer (an F32 or F16 file): a plain folder
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    common = max(bits_weights, key=lambda b: bits_weights[b])
    entry = {"group_size": GROUP, "bits": common, "mode": "affine", **quantization}
    config["quantization"] = entry
    config["quantization_config"] = entry  # as mlx-lm's own converter writes it
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def read_record(folder: Path) -> dict | None:
    """The record gguf_to_mlx_folder left in `folder`, or None."""
    try:
        return json.loads((Path(folder) / RECORD).read_text())
    except (OSError, ValueError):
        return None


def _bytes_per_weight(fmt: Format) -> float:
    """An MLX quantized weight's bytes: its code, and its group's scale (and bias) over 32."""
    return fmt.bits / 8 + (1 if fmt.mode == "mxfp4" else 8) / GROUP


def weight_changes(gguf_path: Path) -> dict[str, TypeReport]:
    """Per quantized type of `gguf_path`'s 2-D tensors: the largest change of a weight between
    gguf's dequantization and MLX's layers (0 for the exact types, checked here too: MLX's
    formula over the converted arrays against gguf's). Reads and converts every such tensor."""
    import gguf

    reader = open_tensors(gguf_path)
    out: dict[str, TypeReport] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        shape = [int(s) for s in tensor.shape]
        if kind in FLOAT_TYPES or len(shape) != 2 or shape[0] % GROUP:
            continue
        cols, rows = shape
        data = tensor.data.reshape(rows, -1)
        max_abs = largest = 0.0
        for start, stop in _row_chunks(rows, cols):
            part = mlx_quantized(kind, data[start:stop], stop - start, cols)
            reference = np.asarray(gguf.quants.dequantize(data[start:stop], tensor.tensor_type),
                                   dtype=np.float32).reshape(stop - start, cols)
            max_abs = max(max_abs, float(np.abs(part.dequantize() - reference).max()))
            largest = max(largest, float(np.abs(reference).max()))
        fmt = format_of(kind)
        out.setdefault(kind, TypeReport(fmt.words, fmt.exact)).add(rows * cols, max_abs, largest)
    return out


def mlx_info_lines(gguf_path: Path, check: bool = False) -> list[str]:
    """`models info` on MLX: per type of the file, what its tensors become on MLX and the size,
    exact or the largest weight change (with `check`, measured over the file's own tensors; without,
    the bound: half a step of the 8-bit grid, 1/510 of its group's range)."""
    counts: dict[str, list[int]] = {}  # type -> [tensors, weights]
    for tensor in open_tensors(gguf_path).tensors:
        entry = counts.setdefault(tensor.tensor_type.name, [0, 0])
        entry[0] += 1
        entry[1] += int(tensor.n_elements)
    changes = weight_changes(Path(gguf_path)) if check else {}
    lines = [f"{'type':<8}{'tensors':>8}{'weights':>14}  on MLX (precision auto)"]
    for kind, (count, n) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        if kind in FLOAT_TYPES:
            what = ("float32 (norms and 1-D tensors, the token embedding); F16 linear weights stay float16"
                    if kind == "F16" else "float32, the file's values")
        else:
            fmt = format_of(kind)
            size = n * _bytes_per_weight(fmt)
            what = f"{fmt.words} ({size / 1e6:.1f} MB): {fmt.how}; "
            if fmt.exact:
                what += "exact (mx.dequantize gives gguf's dequantization)"
            elif kind in changes:
                c = changes[kind]
                what += (f"largest weight change {c.max_abs:.3g}, {c.max_rel:.2e} of its tensor's largest "
                         "weight (measured)")
            else:
                what += (f"largest weight change at most 1/{2 * (2 ** fmt.bits - 1)} of its group of {GROUP}'s "
                         "range (--check measures it)")
        lines.append(f"{kind:<8}{count:>8}{n:>14,}  {what}")
    lines.append("Nothing is expanded to float16: mlx-lm's own GGUF loader keeps Q4_0, Q4_1 and Q8_0 and "
                 "turns the rest into float16; here every type stays a quantized layer.")
    return lines
