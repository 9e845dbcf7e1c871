"""The modules a GGUF loaded at its own precisions runs on PyTorch (app/models/gguf_torch.py
loads them): linear layers on Tandem's compiled CPU kernel at the file's own numbers (every type of
gguf_codes.KERNEL_TYPES), or where it does not run on PyTorch's int4 and int8 weight-only kernels,
and rows of a tensor read from the memory-mapped file on demand (the token embedding, a head's
rescored rows)."""

from __future__ import annotations

import numpy as np
import torch

from app.models.gguf_blocks import GROUP, Int4Groups
from app.models.gguf_codes import FACTORED_TYPES, GROUP_OF, KIND_OF, OFFSET_TYPES, CodeGroups

# Bytes per weight as loaded: 4-bit codes, plus a scale and a zero per 32 weights in bfloat16.
INT4_BYTES = 0.5 + 2 * 2 / GROUP

# 5-, 6- and 8-bit types: int8 weight-only, one scale per output row (PyTorch's int8 kernel,
# `_weight_int8pack_mm`, has no per-group scales). Their own scales are per 16 or 32 weights, so
# this re-quantization is not exact: a weight moves by at most half a step of its row's scale plus
# the bfloat16 rounding of that scale, under 6e-3 of the row's largest weight (measured per type by
# `tandem-cli models info --check`).
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
INT8_BYTES = 1
INT8_TOLERANCE = 6e-3

def kernel_bytes(kind: str) -> float:
    """Bytes per weight of a `kind` tensor on Tandem's CPU kernel (int4_cpu_torch.CodeBlocks): the
    codes (4, 5 or 6 bits packed, or a byte), and the file's scales as it holds them: an fp16 scale
    (and offset) per group, or for the super-block types an integer per group and an fp16 per 256
    weights."""
    from app.models.int4_cpu_torch import STORED

    code = STORED[KIND_OF[kind]] / GROUP_OF[KIND_OF[kind]]
    levels = 2 if kind in OFFSET_TYPES else 1
    if kind in FACTORED_TYPES:  # an integer per group, an fp16 per 256 weights (each for d, and dmin)
        return code + levels / GROUP_OF[KIND_OF[kind]] + 2 * levels / 256
    return code + 2 * levels / GROUP_OF[KIND_OF[kind]]


def inner_k_tiles(in_features: int) -> int | None:
    """tinygemm packs 16 * inner_k_tiles columns per tile: the largest that divides the row."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0 and in_features % GROUP == 0:
            return tiles
    return None


class GGUFCodesLinear(torch.nn.Module):
    """A bias-free Linear whose weight is a GGUF's codes on Tandem's compiled CPU kernel
    (int4_cpu_torch.CodeBlocks: the file's weights exactly, times each token's activations quantized
    to int8 alone). `parts`: (rows,
    GGUF type) in row order, one for a plain projection, several for a stack (q/k/v, gate/up)
    whose parts may differ in type. Filled by row blocks (`fill`), so packing a large weight never
    needs more than a block's temporaries."""

    act_dtype = torch.float32

    def __init__(self, out_features: int, in_features: int, parts: list[tuple[int, str]]):
        super().__init__()
        from app.models.int4_cpu_torch import CodeBlocks

        self.out_features, self.in_features = out_features, in_features
        self.types = tuple(kind for _, kind in parts)
        self.blocks = CodeBlocks(out_features, in_features, parts)
        self.expose()

    def expose(self) -> None:
        """The kernel's arrays as buffers (views, not copies), so the loaded size counts them."""
        for name in self.blocks.ARRAYS:
            self.register_buffer(f"blocks_{name}", torch.from_numpy(getattr(self.blocks, name)), persistent=False)

    @classmethod
    def from_groups(cls, groups: CodeGroups, kind: str) -> GGUFCodesLinear:
        layer = cls(*groups.codes.shape, [(groups.codes.shape[0], kind)])
        layer.fill(0, groups)
        return layer

    @torch.no_grad()
    def fill(self, start: int, groups: CodeGroups) -> None:
        """Rows start.. (start a multiple of PACK_ROWS) from gguf_codes.code_groups' result."""
        self.blocks.fill(start, groups)
        self.expose()  # a scale that is not a half widens the held scales to float32

    def fill_file(self, start: int, kind: str, raw) -> bool:
        """Rows start.. straight from the file's rows of type `kind` (CodeBlocks.fill_file);
        False where that route does not apply (then fill() with gguf_codes' result)."""
        return self.blocks.fill_file(start, kind, raw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.float32)
        y = on_blocks(self.blocks, flat)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{' + '.join(dict.fromkeys(self.types))} codes (float32, Tandem's CPU kernel)")


class GGUFInt4Linear(torch.nn.Module):
    """A bias-free Linear whose weight is GGUF's 4-bit codes packed for PyTorch's int4 kernel
    (tinygemm: w = (q - 8) * scale + zero per group of 32, the scales and zeros in `act_dtype`),
    code for code. On the CPU where Tandem's compiled kernel does not run (GGUFCodesLinear does
    where it does), and on CUDA, where tinygemm is the int4 kernel torchao's layers use too
    (docs/gguf.md). Filled by row blocks; the layout is the device's own, made there."""

    def __init__(self, out_features: int, in_features: int, act_dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.tiles = inner_k_tiles(in_features)
        device = torch.device(device)
        if device.type == "cpu":
            packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8)
        else:  # CUDA's tile layout: [n / 8][k / (tiles * 16)][32][tiles / 2] int32
            packed = torch.empty(out_features // 8, in_features // (self.tiles * 16), 32, self.tiles // 2,
                                 dtype=torch.int32, device=device)
        self.register_buffer("packed", packed)
        # (groups, out, 2): the scale and the zero of each group of 32 weights of each output row
        self.register_buffer("scales_and_zeros", torch.empty(in_features // GROUP, out_features, 2, dtype=act_dtype,
                                                             device=device))
        self.act_dtype = act_dtype

    @classmethod
    def from_groups(cls, groups: Int4Groups, act_dtype: torch.dtype, device: torch.device | str = "cpu"
                    ) -> GGUFInt4Linear:
        layer = cls(*groups.codes.shape, act_dtype, device)
        layer.fill(0, groups)
        return layer

    @torch.no_grad()
    def fill(self, start: int, groups: Int4Groups) -> None:
        """Rows start.. of the weight (start a multiple of PACK_ROWS: the CPU layout packs rows in
        blocks of 64 and CUDA's in blocks of 8, so blocks packed apart equal the whole packed at once)."""
        rows = groups.codes.shape[0]
        device = self.packed.device
        if device.type == "cpu":
            q = torch.from_numpy(np.ascontiguousarray(groups.codes)).to(torch.int32)
            self.packed[start:start + rows] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, self.tiles)
        else:
            pairs = torch.from_numpy(tinygemm_bytes(groups.codes)).to(device)
            self.packed[start // 8:(start + rows) // 8] = torch.ops.aten._convert_weight_to_int4pack(pairs, self.tiles)
        self.scales_and_zeros[:, start:start + rows, 0] = torch.from_numpy(groups.scale.T).to(device)
        self.scales_and_zeros[:, start:start + rows, 1] = torch.from_numpy(groups.zero.T).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.act_dtype)
        y = int4_kernel(self.packed)(flat, self.packed, GROUP, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 g{GROUP} "
                f"({self.act_dtype}, PyTorch's kernel on {self.packed.device.type})")


def int4_kernel(packed: torch.Tensor):
    """PyTorch's tinygemm matmul for a weight packed on `packed`'s device."""
    ops = torch.ops.aten
    return ops._weight_int4pack_mm_for_cpu if packed.device.type == "cpu" else ops._weight_int4pack_mm


def tinygemm_bytes(codes: np.ndarray) -> np.ndarray:
    """4-bit codes (rows, cols) in 0..15 -> the (rows, cols / 2) bytes CUDA's int4 packing takes:
    column 2j in the high nibble, 2j + 1 in the low one (torchao's order for CUDA)."""
    codes = np.asarray(codes, dtype=np.uint8)
    return np.ascontiguousarray((codes[:, 0::2] << 4) | codes[:, 1::2])


def on_kernel() -> bool:
    """Whether Tandem's compiled CPU kernel runs here (else PyTorch's int4 and int8 kernels)."""
    from app.models.int4_cpu_torch import why_not_available

    return not why_not_available()


def on_blocks(blocks, flat: torch.Tensor) -> torch.Tensor:
    """flat (n, cols) float32 through Tandem's CPU kernel -> (n, rows) float32."""
    return torch.from_numpy(blocks.matmul(np.ascontiguousarray(flat.numpy())))


def step_around_compile() -> None:
    """torch.compile (--compile on) must step around `on_blocks`: NumPy arrays into a Numba call.
    Marked when compiling is turned on (compile_torch.compile_layers), not at import: the marking
    imports torch._dynamo, a second on this CPU that a load without compiling never needs."""
    global on_blocks, _STEPPED_AROUND
    if not _STEPPED_AROUND:
        on_blocks, _STEPPED_AROUND = torch.compiler.disable(on_blocks), True


_STEPPED_AROUND = False


PACK_ROWS = 64


class GGUFInt8Linear(torch.nn.Module):
    """A bias-free Linear as int8 codes with one scale per output row (see INT8_TYPES), on
    PyTorch's int8 weight-only kernel; activations in `act_dtype` (its fast path is bfloat16)."""

    def __init__(self, out_features: int, in_features: int, act_dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.register_buffer("weight_int8", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(out_features, dtype=act_dtype))
        self.act_dtype = act_dtype

    @torch.no_grad()
    def fill(self, start: int, rows: torch.Tensor) -> None:
        """Quantize float32 rows start.. (round to nearest, symmetric, per row)."""
        # the codes are rounded against the scale as the kernel will hold it (in act_dtype)
        scale = (rows.abs().amax(dim=1).clamp(min=1e-30) / 127.0).to(self.act_dtype)
        codes = torch.round(rows / scale.float()[:, None]).clamp(-127, 127)
        self.weight_int8[start:start + rows.shape[0]] = codes.to(torch.int8)
        self.scales[start:start + rows.shape[0]] = scale

    def dequantized(self) -> torch.Tensor:
        return self.weight_int8.float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.act_dtype)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row ({self.act_dtype})"


class GGUFRows:
    """Rows of a GGUF tensor decoded on demand from the memory-mapped file, in float32: the
    values of `gguf`'s own dequantization (for a head's rescored rows; a few per token). A Q8_0
    tensor (the demo's tied embedding) is read by Tandem's CPU kernel where it runs: gguf's
    general decoder cost ~0.15 ms a call, twice a pass (the lookup, the head's rescoring)."""

    def __init__(self, tensor, cols: int):
        self.data, self.kind, self.cols = tensor.data, tensor.tensor_type, cols

    def _kernel(self):
        import gguf

        from app.models.int4_cpu_torch import compiled

        if self.kind != gguf.GGMLQuantizationType.Q8_0 or self.cols % GROUP:
            return None
        return compiled()

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        import gguf

        kernel = self._kernel()
        if kernel is not None:
            out = np.empty((rows.numel(), self.cols), np.float32)
            kernel.q8_rows(np.asarray(self.data), rows.reshape(-1).numpy().astype(np.int64), out)
            return torch.from_numpy(out).reshape(*rows.shape, self.cols)
        unique, back = torch.unique(rows, return_inverse=True)
        part = gguf.quants.dequantize(self.data[unique.numpy()], self.kind)
        values = torch.from_numpy(np.asarray(part, dtype=np.float32).reshape(-1, self.cols))
        return values[back]

    def dots(self, hidden: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """hidden[pos[k]] . row rows[k] for every k, float32."""
        kernel = self._kernel()
        if kernel is None:
            return (hidden[pos] * self(rows)).sum(dim=1)
        out = np.empty(pos.numel(), np.float32)
        kernel.q8_dots(np.asarray(self.data), pos.numpy().astype(np.int64), rows.numpy().astype(np.int64),
                       np.ascontiguousarray(hidden.numpy(), dtype=np.float32), out)
        return torch.from_numpy(out)


class GGUFEmbedding(torch.nn.Module):
    """The token embedding read from the file: a lookup needs only the rows of the ids it is
    given, so the table never loads (the demo's is 113 MB in float32, a Llama 3 8B's 2.1 GB);
    the OS keeps the pages it reads in its file cache, and may drop them."""

    def __init__(self, rows: GGUFRows, num_embeddings: int, dtype: torch.dtype):
        super().__init__()
        self.rows, self.num_embeddings, self.embedding_dim, self.dtype = rows, num_embeddings, rows.cols, dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for an embedding of {self.num_embeddings} rows")
        return self.rows(flat).to(self.dtype).reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.rows.kind.name} rows read from the file"
