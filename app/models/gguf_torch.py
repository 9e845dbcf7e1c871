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
from app.models.gguf_blocks import GROUP, INT4_TYPES, Int4Groups, int4_groups
from app.models.gguf_codes import GROUP_OF, KERNEL_TYPES, KIND_OF, code_groups, file_rows
from app.models.int4_cpu_torch import REPACKED, float_rows
from app.models.gguf_layers_torch import (INT4_BYTES, INT8_BYTES, INT8_TYPES, PACK_ROWS, GGUFCodesLinear,
                                          GGUFEmbedding, GGUFInt4Linear, GGUFInt8Linear, GGUFRows, inner_k_tiles,
                                          kernel_bytes, on_kernel)
from app.models.screened_head_torch import SCREEN_BYTES, SCREEN_ROW_BYTES, ScreenedHead

log = logging.getLogger(__name__)


# The widest top-2 logit gap at which this model's batched verify pass and its one-token steps may
# choose differently (bfloat16 activations in the int4 kernel). Derived once, not measured at run
# time: over 24 verify passes of widths 2-17 on the demo, the largest |batched - stepwise| logit
# difference was 0.43; a flip needs the gap below the sum of both logits' errors, 2 x 0.43, rounded
# up. The bench and tests/test_gguf_own_precision.py judge divergences by it.
BATCHED_TIE_GAP = 1.0

FLOAT_BYTES = 4  # every other tensor, dequantized to float32
DENSE_BYTES = 2  # on a GPU: every tensor not of a 4-bit type, in bfloat16


def loaded_bytes(elements: dict[str, int], float_elements: dict[str, int] | None = None,
                 head_elements: dict[str, int] | None = None, head_rows: int = 0, kernel: bool | None = None,
                 device: str = "cpu") -> int:
    """The weights' size once loaded by `load_gguf_model`, from the GGUF's elements per type
    (app/models/gguf_import.GGUFInfo): `float_elements` those of the token embedding (read from
    the file as needed: nothing loaded), `head_elements` those of an untied output head (an int8
    screen; its rescored rows are read from the file). Without a head tensor the head is tied to
    the embedding, which then gets the screen. What the memory check must count, not float32.
    `kernel`: whether Tandem's CPU kernel holds the linear layers (None: whether it runs here).
    On a GPU (`device` "cuda") the 4-bit types are tinygemm's int4 and every other tensor is
    bfloat16 in the GPU's memory, as is the token embedding whatever its type in the file (a
    table: a Q4_K embedding is not int4 there; load_gguf_model packs 4-bit linear layers only)."""
    float_elements, head_elements = float_elements or {}, head_elements or {}
    if device != "cpu":
        total = 0.0
        for kind, n in elements.items():
            table = min(n, float_elements.get(kind, 0))  # the embedding
            total += (n - table) * (INT4_BYTES if kind in INT4_TYPES else DENSE_BYTES) + table * DENSE_BYTES
        return int(total)
    kernel = on_kernel() if kernel is None else kernel
    total = 0.0
    for kind, n in elements.items():
        in_file = min(n, float_elements.get(kind, 0))  # the embedding
        screened = min(n - in_file, head_elements.get(kind, 0))
        rest = n - in_file - screened
        per = (kernel_bytes(kind) if kind in KERNEL_TYPES and kernel else INT4_BYTES if kind in INT4_TYPES
               else INT8_BYTES if kind in INT8_TYPES else FLOAT_BYTES)
        total += rest * per + screened * SCREEN_BYTES  # the embedding's rows stay in the file
    if not head_elements:
        total += sum(float_elements.values()) * SCREEN_BYTES
    return int(total + head_rows * SCREEN_ROW_BYTES)


@dataclass
class GGUFLoadReport:
    """What each tensor became, for the load line and `models info`."""

    classes: Counter = field(default_factory=Counter)  # "Q4_1 -> int4 g32" -> tensors
    weights_bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # GGUF tensors the model has no place for
    fused: int = 0  # groups of projections (q/k/v, gate/up) stacked into one matmul
    own_layers: bool = False  # built from gguf_llama_torch.py's modules, not transformers' classes

    def short(self) -> str:
        """A user's words: "4-bit GGUF" where the linear layers stayed 4-bit."""
        if any("int4" in what for what in self.classes):
            return "4-bit GGUF"
        if any("int8" in what for what in self.classes):
            return "8-bit GGUF"
        # on a GPU every tensor that is not 4-bit is bfloat16 (a Q8_0 file there, for one)
        return "bfloat16 from a GGUF" if any("bfloat16" in what for what in self.classes) else "float32 from a GGUF"

    def describe(self) -> str:
        """"int4 g32 from Q4_1 x210; float32 from F32 x61, Q8_0 x1": what runs, from what."""
        by_result: dict[str, list[str]] = {}
        for what, n in sorted(self.classes.items(), key=lambda kv: ("int4" not in kv[0], "int8" not in kv[0], kv[0])):
            source, result = what.split(" -> ")
            by_result.setdefault(result, []).append(f"{source} x{n}")
        described = "; ".join(f"{result} from {', '.join(sources)}" for result, sources in by_result.items())
        return described + (f"; {self.fused} fused q/k/v and gate/up matmuls" if self.fused else "")


# each gguf_codes kind, as the load line says it
CODE_WORDS = {0: "int4 g32", 1: "int8 g32", 2: "int2 g16", 3: "int5 g32", 4: "int6 g16", 5: "4-bit grid g32",
              6: "int3 g16"}


def _codes_fit(module: torch.nn.Module, kind: str) -> bool:
    """Whether a GGUF weight of `kind` can take `module`'s place on Tandem's kernel."""
    return (isinstance(module, torch.nn.Linear) and module.bias is None and kind in KERNEL_TYPES
            and module.in_features % GROUP_OF[KIND_OF[kind]] == 0)


def _can_pack(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Linear) and module.bias is None and module.out_features % 16 == 0
            and inner_k_tiles(module.in_features) is not None)


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


CHUNK_BYTES = 4 << 20  # decode a large tensor this many bytes of float32 (or int32 codes) at a time


def _row_blocks(tensor, cols: int):
    """(first row, those rows as float32 (n, cols)) over a 2-D GGUF tensor, CHUNK_BYTES of float32
    at a time: gguf's own dequantization, never of the whole tensor at once."""
    import gguf

    step = max(1, CHUNK_BYTES // max(1, cols * 4))
    for start in range(0, tensor.data.shape[0], step):
        raw = tensor.data[start:start + step]
        # the common types compiled (repack_numba.rows_*: gguf's arithmetic, the same bits)
        part = float_rows(tensor.tensor_type.name, raw, cols) if raw.ndim == 2 else None
        if part is None:
            part = gguf.quants.dequantize(raw, tensor.tensor_type)
        yield start, torch.from_numpy(np.asarray(part, dtype=np.float32).reshape(-1, cols))


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
    for start, rows in _row_blocks(tensor, flat.shape[1]):
        flat[start:start + rows.shape[0]] = rows
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


def _packed(tensor, processor, rows: int, cols: int, act_dtype: torch.dtype,
            into: GGUFInt4Linear | None = None, offset: int = 0, device: torch.device | str = "cpu") -> GGUFInt4Linear:
    """A 4-bit GGUF weight as a GGUFInt4Linear (or rows offset.. of `into`, a stack of several),
    decoded and packed a block of rows at a time where the processor leaves rows in place (Q and
    K, whose rows it reorders, are decoded whole)."""
    kind, data = tensor.tensor_type.name, tensor.data
    layer = into if into is not None else GGUFInt4Linear(rows, cols, act_dtype, device)
    if ".attn_q." in tensor.name or ".attn_k." in tensor.name:
        groups = int4_groups(kind, data, rows, cols)
        layer.fill(offset, Int4Groups(*(processor.process(weights=a, name=tensor.name).weights for a in groups)))
        return layer
    step = max(PACK_ROWS, CHUNK_BYTES // (cols * 4) // PACK_ROWS * PACK_ROWS)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        layer.fill(offset + start, int4_groups(kind, data[start:start + n], n, cols))
    return layer


def _coded(tensor, processor, rows: int, cols: int, into: GGUFCodesLinear | None = None,
           offset: int = 0) -> GGUFCodesLinear:
    """A GGUF weight of a KERNEL_TYPES type as a GGUFCodesLinear (or rows offset.. of `into`, a
    stack of several), decoded a block of rows at a time where the processor leaves rows in place
    (Q and K, whose rows it reorders, are decoded whole: a permutation of whole rows, applied to
    the codes and to each row's scales and offsets alike)."""
    kind, data = tensor.tensor_type.name, tensor.data
    layer = into if into is not None else GGUFCodesLinear(rows, cols, [(rows, kind)])
    try:
        permuted = ".attn_q." in tensor.name or ".attn_k." in tensor.name
        if kind in REPACKED:  # the file's bytes straight into the kernel's layout (repack_numba.py)
            raw = file_rows(kind, data, rows, cols)
            order = _row_order(processor, tensor.name, rows) if permuted else None
            if (not permuted or order is not None) and layer.fill_file(offset, kind,
                                                                       raw if order is None else raw[order]):
                return layer
        if permuted:
            groups = code_groups(kind, data, rows, cols)
            move = lambda a: None if a is None else processor.process(weights=a, name=tensor.name).weights  # noqa: E731
            factors = None if groups.factors is None else type(groups.factors)(*map(move, groups.factors))
            layer.fill(offset, type(groups)(groups.kind, move(groups.codes), move(groups.scale), move(groups.offset),
                                            factors))
            return layer
        step = max(PACK_ROWS, CHUNK_BYTES // (cols * 4) // PACK_ROWS * PACK_ROWS)
        for start in range(0, rows, step):
            n = min(step, rows - start)
            layer.fill(offset + start, code_groups(kind, data[start:start + n], n, cols))
    except ValueError as exc:
        raise ModelFileError(f"tensor {tensor.name} ({kind}, {rows}x{cols}): {exc}") from exc
    return layer


def _row_order(processor, name: str, rows: int) -> np.ndarray | None:
    """The order the processor puts a tensor's rows in (Q and K: their heads' halves interleaved
    as transformers' Llama expects), read off a column of row numbers; None where it does more
    than reorder rows."""
    order = processor.process(weights=np.arange(rows, dtype=np.int64)[:, None], name=name).weights
    order = np.asarray(order).reshape(-1)
    return order if order.shape == (rows,) and np.array_equal(np.sort(order), np.arange(rows)) else None


def _int8(tensor, processor, rows: int, cols: int, act_dtype: torch.dtype, rows_only: bool,
          into: GGUFInt8Linear | None = None, offset: int = 0) -> GGUFInt8Linear:
    """A 5/6/8-bit GGUF weight as a GGUFInt8Linear (or rows offset.. of `into`), dequantized and
    re-quantized a block of rows at a time (whole for Q and K, whose rows the processor reorders)."""
    layer = into if into is not None else GGUFInt8Linear(rows, cols, act_dtype)
    if not rows_only or ".attn_q." in tensor.name or ".attn_k." in tensor.name:
        layer.fill(offset, _dequantized(tensor, processor, torch.Size((rows, cols)), torch.float32, rows_only=False))
        return layer
    for start, block in _row_blocks(tensor, cols):
        layer.fill(offset + start, block)
    return layer


def _plan_fusion(model: torch.nn.Module, tensors, names: dict[str, str], rows_only: bool,
                 act_dtype: torch.dtype, kernel: bool, device: torch.device, gpu: bool
                 ) -> tuple[dict[str, tuple[torch.nn.Module, int]], int]:
    """Stack q/k/v and gate/up wherever a layer's parts will load as the same kind (on Tandem's
    kernel every KERNEL_TYPES type, parts of different types side by side; on PyTorch's, all 4-bit
    types become the same int4 layout, all 5/6/8-bit ones int8 on the CPU; on CUDA only all-4-bit
    parts are stacked here, dense ones by the lean step): the stacked module is made
    before any part is read and each part is filled straight into its rows, so no weight is
    ever held twice. Returns {GGUF tensor name: (the stack, the part's first row)}, groups."""
    from app.models.fused_projections_torch import GROUPS, install

    by_name = {names[t.name]: t for t in tensors if t.name in names}
    into: dict[str, tuple[torch.nn.Module, int]] = {}
    groups = 0
    for module_name, module in list(model.named_modules()):
        for attr, parts in GROUPS.items():
            owner = getattr(module, attr, None)
            if not isinstance(owner, torch.nn.Module):
                continue
            prefix = f"{module_name}.{attr}" if module_name else attr
            found = [by_name.get(f"{prefix}.{part}.weight") for part in parts]
            linears = [getattr(owner, part, None) for part in parts]
            plain = all(isinstance(m, torch.nn.Linear) and m.bias is None for m in linears)
            if any(t is None for t in found) or not plain or len({m.in_features for m in linears}) != 1:
                continue
            kinds = {t.tensor_type.name for t in found}
            rows, cols = sum(m.out_features for m in linears), linears[0].in_features
            packable = all(_can_pack(m) and m.out_features % PACK_ROWS == 0 for m in linears)
            coded = kernel and rows_only and all(_codes_fit(m, t.tensor_type.name)
                                                  for m, t in zip(linears, found, strict=True))
            if coded and all(m.out_features % PACK_ROWS == 0 for m in linears[:-1]):
                fused = GGUFCodesLinear(rows, cols, [(m.out_features, t.tensor_type.name)
                                                     for m, t in zip(linears, found, strict=True)])
            elif coded:
                continue  # each part on Tandem's kernel alone (a part under a whole chunk of rows)
            elif kinds <= set(INT4_TYPES) and rows_only and packable:
                fused = GGUFInt4Linear(rows, cols, act_dtype, device)
            elif kinds <= set(INT8_TYPES) and not gpu:
                fused = GGUFInt8Linear(rows, cols, act_dtype)
            else:
                continue
            offsets = install(owner, parts, fused)
            into.update({t.name: (fused, offsets[part]) for t, part in zip(found, parts, strict=True)})
            groups += 1
    return into, groups


def _screened_from_file(tensor, rows: int, cols: int) -> ScreenedHead:
    """An untied output head: its int8 screen built a block of rows at a time, its rescored rows
    read from the file (the head's float32 copy never exists)."""
    head = ScreenedHead.empty(rows, cols, GGUFRows(tensor, cols))
    for start, block in _row_blocks(tensor, cols):
        head.fill(start, block)
    return head


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


class _LayerProgress:
    """"Reading the weights of <name>: layer 5 of 16" as the tensors of each layer are read, no more
    often than every PERIOD_S (a window's status line, a CLI's stderr)."""

    PERIOD_S = 0.3

    def __init__(self, progress, layers: int, name: str):
        import time

        self.progress, self.layers, self.name, self.clock = progress, layers, name, time.monotonic
        self.last = self.clock() - self.PERIOD_S  # the first layer is said at once

    def __call__(self, tensor_name: str) -> None:
        if self.progress is None or not tensor_name.startswith("blk.") or not self.layers:
            return
        now = self.clock()
        if now - self.last < self.PERIOD_S:
            return
        self.last = now
        layer = tensor_name.split(".")[1]
        if layer.isdigit():
            self.progress(f"Reading the weights of {self.name}: layer {int(layer) + 1} of {self.layers} ...")


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
                    act_dtype: torch.dtype = torch.bfloat16, int4: bool = True,
                    progress=None, lean_only: bool = False, device: torch.device | str = "cpu",
                    gpu_layers: bool | None = None) -> tuple[torch.nn.Module, GGUFLoadReport]:
    """The model of `folder`'s config.json with the weights of `gguf_path` at their own precisions
    (4-bit -> int4 kernel, the rest -> `dtype`), on `device`, in eval mode. `int4=False`
    dequantizes every tensor to `dtype` (the float32 reference `models info --check` compares with).
    On CUDA (docs/gguf.md, "On NVIDIA GPUs") the 4-bit types go to tinygemm's CUDA kernel and every other
    tensor, the embedding and the head included, to `dtype` on the GPU: no CPU-side module (the
    screened head, the embedding read from the file, Tandem's CPU kernel) sits in a GPU pass.
    `gpu_layers` (None: whether `device` is a GPU) builds those modules on the CPU too, with
    tinygemm's CPU kernel: the same numbers as a GPU's, checked without one.
    `progress(message)` hears which layer's weights are being read, at most a few times a second.
    `lean_only`: the caller runs its passes through the lean step only, never transformers' forward,
    so the Llama family is built from Tandem's own modules (gguf_llama_torch.py) without importing
    transformers' model code; other families, and `lean_only=False`, get transformers' classes."""
    from app.models.gguf_header import open_tensors
    from app.models import gguf_llama_torch as own

    reader = open_tensors(gguf_path)  # the tensors and scalar fields: no vocabulary parsed (gguf_header.py)
    architecture = str(reader.fields["general.architecture"].contents())
    # The parsed metadata (a vocabulary of 150k tokens is millions of small objects) is not needed
    # past this point: the config and the tokenizer come from the imported folder.
    reader.fields.clear()
    _trim_heap()
    fields = own.read_config(folder) if lean_only and int4 else None
    own_note = own.why_not(fields, architecture) if fields is not None else "transformers' forward may run"
    if not own_note:
        model, config = own.build(fields)
        processor, rows_only = own.RowProcessor(config, architecture), True
        names = own.tensor_names(model, architecture)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        processor, rows_only = _processor(config, architecture)
        names = _tensor_names(model, processor)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    head = None if tied else model.get_output_embeddings()
    report = GGUFLoadReport(own_layers=not own_note)
    device = torch.device(device)
    on_cpu = not (device.type != "cpu" if gpu_layers is None else gpu_layers)  # the CPU's modules
    kernel = on_cpu and on_kernel()
    stacks, report.fused = (_plan_fusion(model, reader.tensors, names, rows_only, act_dtype, kernel, device, not on_cpu)
                            if int4 else ({}, 0))
    said = _LayerProgress(progress, int(getattr(config, "num_hidden_layers", 0) or 0), gguf_path.stem)
    for tensor in reader.tensors:
        said(tensor.name)
        hf_name = names.get(tensor.name)
        if hf_name is None:
            report.skipped.append(tensor.name)
            continue
        owner_name, _, attr = hf_name.rpartition(".")
        owner = model.get_submodule(owner_name)
        kind = tensor.tensor_type.name
        linear = attr == "weight" and isinstance(owner, torch.nn.Linear) and owner.bias is None
        lookup = attr == "weight" and isinstance(owner, torch.nn.Embedding) and owner is model.get_input_embeddings()
        if tensor.name in stacks:  # a part of a stacked q/k/v or gate/up: straight into its rows
            stack, offset = stacks[tensor.name]
            rows, cols = int(tensor.shape[1]), int(tensor.shape[0])
            if isinstance(stack, GGUFCodesLinear):
                _coded(tensor, processor, rows, cols, into=stack, offset=offset)
                what = CODE_WORDS[KIND_OF[kind]]
            elif isinstance(stack, GGUFInt4Linear):
                _packed(tensor, processor, rows, cols, act_dtype, into=stack, offset=offset, device=device)
                what = f"int4 g{GROUP}"
            else:
                _int8(tensor, processor, rows, cols, act_dtype, rows_only, into=stack, offset=offset)
                what = "int8 per row"
            layer = None  # filled in place: the projection's name already points at the stack
        elif int4 and rows_only and lookup and on_cpu:
            layer = GGUFEmbedding(GGUFRows(tensor, owner.embedding_dim), owner.num_embeddings, dtype)
            what = "embedding read in place"
            if tied:  # the head shares the table: its screen is built from the file too
                model.set_output_embeddings(_screened_from_file(tensor, owner.num_embeddings, owner.embedding_dim))
                report.classes["tied head -> int8 screen + float32 argmax"] += 1
        elif int4 and linear and owner is head and rows_only and on_cpu:
            layer = _screened_from_file(tensor, owner.out_features, owner.in_features)
            what = "int8 screen + float32 argmax"
        elif int4 and linear and kernel and rows_only and _codes_fit(owner, kind):
            layer, what = _coded(tensor, processor, owner.out_features, owner.in_features), CODE_WORDS[KIND_OF[kind]]
        elif int4 and linear and kind in INT4_TYPES and rows_only and _can_pack(owner):
            layer = _packed(tensor, processor, owner.out_features, owner.in_features, act_dtype, device=device)
            what = f"int4 g{GROUP}"
        elif int4 and linear and kind in INT8_TYPES and not tensor.name.startswith("token_embd") and on_cpu:
            layer = _int8(tensor, processor, owner.out_features, owner.in_features, act_dtype, rows_only)
            what = "int8 per row"
        else:
            layer, what = None, str(dtype).removeprefix("torch.")
            values = _dequantized(tensor, processor, getattr(owner, attr).shape, dtype, rows_only)
            setattr(owner, attr, torch.nn.Parameter(values.to(device), requires_grad=False))
        if layer is not None:  # the quantized module takes the Linear's place
            parent_name, _, child = owner_name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        _release(reader, tensor)
        _trim_heap()
        report.classes[f"{kind} -> {what}"] += 1
    if tied and not isinstance(model.get_output_embeddings(), ScreenedHead):
        model.tie_weights()
    _rebuild_meta_buffers(model)
    missing = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if missing:
        raise ModelFileError(f"{gguf_path.name}: the GGUF lacks weights the {config.model_type} model needs: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.")
    if device.type != "cpu":  # (after the check: a weight left on meta cannot be moved)
        model.to(device)  # what was built on the CPU: RoPE's tables (every weight is there already)
    if report.skipped:
        log.info("%s: tensors without a place in the model: %s", gguf_path.name, ", ".join(report.skipped))
    report.weights_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                               [*model.parameters(), *model.buffers()]}.values())
    return model.eval(), report
