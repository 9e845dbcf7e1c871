"""Load a GGUF into a transformers model at the file's own precisions (PyTorch backend).

The model is built on the meta device from the imported folder's config (no weights allocated),
then filled tensor by tensor straight from the memory-mapped file: 4-bit linear weights (Q4_0,
Q4_1, Q4_K) are re-packed, code for code, into PyTorch's int4 weight-only kernel
(`_weight_int4pack_mm_for_cpu`, tinygemm's layout, the one torchao uses), and every other tensor
(norms, the embedding, 5/6/8-bit and float tensors) is dequantized by the gguf package into the
model's float dtype, one tensor at a time. No full-precision copy of the model ever exists.

transformers' own GGUF tables name the tensors (`get_gguf_hf_weights_map`) and undo llama.cpp's
Q/K row permutation (`LlamaTensorProcessor`); a row permutation moves whole rows, so it applies
to the codes and to each row's scales alike.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from app.models.errors import ModelFileError
from app.models.gguf_blocks import GROUP, INT4_TYPES, int4_groups

log = logging.getLogger(__name__)


# Bytes per weight as loaded: 4-bit codes, plus a scale and a zero per 32 weights in bfloat16.
INT4_BYTES = 0.5 + 2 * 2 / GROUP
FLOAT_BYTES = 4  # every other tensor, dequantized to float32


def loaded_bytes(elements: dict[str, int]) -> int:
    """The weights' size once loaded by `load_gguf_model`, from the GGUF's elements per type
    (app/models/gguf_import.GGUFInfo.elements): what the memory check must count, not float32."""
    return int(sum(n * (INT4_BYTES if kind in INT4_TYPES else FLOAT_BYTES) for kind, n in elements.items()))


def _inner_k_tiles(in_features: int) -> int | None:
    """tinygemm packs 16 * inner_k_tiles columns per tile: the largest that divides the row."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0 and in_features % GROUP == 0:
            return tiles
    return None


class GGUFInt4Linear(torch.nn.Module):
    """A bias-free Linear whose weight is GGUF's 4-bit codes, packed for PyTorch's int4 kernel.
    Activations run in `act_dtype` (the kernel's scales are stored in it)."""

    def __init__(self, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, act_dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        tiles = _inner_k_tiles(self.in_features)
        q = torch.from_numpy(np.ascontiguousarray(codes)).to(torch.int32)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, tiles))
        # (groups, out, 2): scale and zero per group of 32 weights of each output row
        both = np.stack([scale.T, zero.T], axis=-1)
        self.register_buffer("scales_and_zeros", torch.from_numpy(np.ascontiguousarray(both)).to(act_dtype))
        self.act_dtype = act_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.act_dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 g{GROUP} ({self.act_dtype})"


@dataclass
class GGUFLoadReport:
    """What each tensor became, for the load line and `models info`."""

    classes: Counter = field(default_factory=Counter)  # "Q4_1 -> int4 g32" -> tensors
    weights_bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # GGUF tensors the model has no place for

    def describe(self) -> str:
        return ", ".join(f"{n} {what}" for what, n in sorted(self.classes.items()))


def _can_pack(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Linear) and module.bias is None and module.out_features % 8 == 0
            and _inner_k_tiles(module.in_features) is not None)


def _processor(config, architecture: str):
    from transformers.modeling_gguf_pytorch_utils import (LlamaTensorProcessor, TENSOR_PROCESSORS,
                                                          TensorProcessor)

    cls = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    # Only processors that leave values alone (at most moving whole rows) may see packed codes.
    rows_only = cls in (TensorProcessor, LlamaTensorProcessor)
    return cls(config=config.to_dict()), rows_only


def _tensor_names(model: torch.nn.Module, processor) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by transformers' own tables. Its walk
    builds gguf's name table again for every submodule (5 s for a 30-layer model): build it once."""
    import functools

    import gguf
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        return get_gguf_hf_weights_map(model, processor)
    finally:
        gguf.get_tensor_name_map = original


CHUNK_BYTES = 16 << 20  # dequantize a large tensor this many float32 bytes at a time


def _dequantized(tensor, processor, shape: torch.Size, dtype: torch.dtype, rows_only: bool) -> torch.Tensor:
    """A non-4-bit GGUF tensor in `dtype`. Row by row into the final tensor where the processor
    leaves rows alone, so the peak is the result plus one chunk (an embedding of 150k rows
    dequantized whole would briefly cost three times its float32 size)."""
    import gguf

    data = tensor.data
    whole = not rows_only or ".attn_q." in tensor.name or ".attn_k." in tensor.name or data.ndim < 2
    if whole:
        values = np.array(gguf.quants.dequantize(data, tensor.tensor_type))  # writable: one tensor
        values = processor.process(weights=values, name=tensor.name).weights
        return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape).to(dtype)
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(data.shape[0], -1)
    step = max(1, CHUNK_BYTES // max(1, flat.shape[1] * 4))
    for start in range(0, data.shape[0], step):
        part = gguf.quants.dequantize(data[start:start + step], tensor.tensor_type)
        flat[start:start + step] = torch.from_numpy(np.asarray(part, dtype=np.float32).reshape(-1, flat.shape[1]))
    return out


def _trim_heap() -> None:
    """Give freed memory back to the OS. glibc raises its mmap threshold after large frees, so
    each tensor's temporaries then come from the heap and stay with the process: without this the
    load's resident size grows by several times the model's (measured on the demo: +260 MB for
    66 MB of int4 weights). A no-op where there is no glibc."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        import ctypes
        import ctypes.util

        try:
            _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def _release(reader, tensor) -> None:
    """Drop the file's pages of a tensor already copied out of the memory map, so the mapped file
    does not stay in the process's memory beside the loaded model (where the OS allows it)."""
    import mmap

    handle = getattr(reader.data, "_mmap", None)
    if handle is None or not hasattr(handle, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    page = mmap.PAGESIZE
    start = int(tensor.data_offset) // page * page
    end = int(tensor.data_offset) + int(tensor.n_bytes)
    try:
        handle.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (OSError, ValueError):
        pass


def _rebuild_meta_buffers(model: torch.nn.Module) -> None:
    """Buffers computed at construction (RoPE's inv_freq) stayed on meta: build those modules again
    on the CPU from the config; they hold no weights."""
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        try:
            fresh = type(module)(config=model.config)
        except TypeError as exc:
            raise ModelFileError(f"cannot rebuild {type(module).__name__} outside the meta device ({exc})") from exc
        setattr(parent, attr, fresh)


def load_gguf_model(folder: Path, gguf_path: Path, dtype: torch.dtype = torch.float32,
                    act_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.nn.Module, GGUFLoadReport]:
    """The model of `folder`'s config.json with the weights of `gguf_path` at their own precisions
    (4-bit -> int4 kernel, the rest -> `dtype`), on the CPU, in eval mode."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    reader = gguf.GGUFReader(gguf_path, "r")
    architecture = str(reader.fields["general.architecture"].contents())
    # The parsed metadata (a vocabulary of 150k tokens is millions of small objects) is not needed
    # past this point: the config and the tokenizer come from the imported folder.
    reader.fields.clear()
    _trim_heap()
    processor, rows_only = _processor(config, architecture)
    names = _tensor_names(model, processor)
    report = GGUFLoadReport()
    for tensor in reader.tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None:
            report.skipped.append(tensor.name)
            continue
        owner_name, _, attr = hf_name.rpartition(".")
        owner = model.get_submodule(owner_name)
        kind = tensor.tensor_type.name
        if attr == "weight" and kind in INT4_TYPES and rows_only and _can_pack(owner):
            groups = int4_groups(kind, tensor.data, owner.out_features, owner.in_features)
            codes, scale, zero = (processor.process(weights=a, name=tensor.name).weights for a in groups)
            packed = GGUFInt4Linear(codes, scale, zero, act_dtype)
            parent_name, _, child = owner_name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, packed)
            _release(reader, tensor)
            _trim_heap()
            report.classes[f"{kind} -> int4 g{GROUP}"] += 1
            continue
        values = _dequantized(tensor, processor, getattr(owner, attr).shape, dtype, rows_only)
        setattr(owner, attr, torch.nn.Parameter(values, requires_grad=False))
        _release(reader, tensor)
        _trim_heap()
        report.classes[f"{kind} -> {str(dtype).removeprefix('torch.')}"] += 1
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    _rebuild_meta_buffers(model)
    missing = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if missing:
        raise ModelFileError(f"{gguf_path.name}: the GGUF lacks weights the {config.model_type} model needs: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.")
    if report.skipped:
        log.info("%s: tensors without a place in the model: %s", gguf_path.name, ", ".join(report.skipped))
    report.weights_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                               [*model.parameters(), *model.buffers()]}.values())
    return model.eval(), report
