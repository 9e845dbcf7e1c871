"""Weight-only quantization of a loaded transformers model with torchao.

int4 weight-only keeps activations in floating point, so a token's logits do not depend on its
neighbours in a verify pass (dynamic activation quantization would: its per-tensor scale is
computed over the whole pass), which makes it usable for targets as well as drafts.
torchao's `WeightOnlyInt4Linear` calls PyTorch's own tinygemm kernels
(`_weight_int4pack_mm_for_cpu` on the CPU, `_weight_int4pack_mm` on CUDA).
"""

from __future__ import annotations

import logging

import torch


def quiet_torchao_logs() -> None:
    """torchao (imported by transformers too, whenever it is installed) announces optional CUDA
    extensions it cannot load on a CPU build, and torch warns about its enums; both are expected."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


quiet_torchao_logs()

GROUP_SIZE = 32  # the Q4_0/Q4_1 block of GGUF files and mlx-lm's group: the same grid everywhere


def _inner_k_tiles(in_features: int, group_size: int) -> int | None:
    """The tinygemm layout packs 16 * inner_k_tiles columns per tile; take the largest that divides
    the row (576-wide SmolLM2 rows take 4) rather than pad every row to a multiple of 1024."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0 and in_features % group_size == 0:
            return tiles
    return None


@torch.no_grad()
def quantize_int4(model: torch.nn.Module, include_head: bool = False,
                  group_size: int = GROUP_SIZE) -> int:
    """Replace the model's bias-free Linear layers by int4 weight-only ones, in place.
    The output head stays at its precision unless `include_head` (it decides the argmax, and a
    quantized head costs the most agreement). Returns how many layers were quantized."""
    from torchao.quantization.linear_quant_modules import Int4WeightOnlyQuantizer

    stack_shared_inputs(model)
    device = next(model.parameters()).device
    # the CPU kernel runs in bfloat16 (5x faster than float32 activations here); CUDA's too
    precision = torch.bfloat16
    head = model.get_output_embeddings()
    groups: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for parent in model.modules():
        for name, child in parent.named_children():
            if not isinstance(child, torch.nn.Linear) or child.bias is not None:
                continue
            if child is head and not include_head:
                continue
            tiles = _inner_k_tiles(child.in_features, group_size)
            if tiles is not None and child.out_features % 8 == 0:
                groups.setdefault(tiles, []).append((parent, name))
    count = 0
    for tiles, places in groups.items():
        quantizer = Int4WeightOnlyQuantizer(groupsize=group_size, inner_k_tiles=tiles, device=device,
                                            precision=precision, padding_allowed=False)
        for parent, name in places:
            linear = getattr(parent, name)
            holder = torch.nn.Sequential(linear)  # the quantizer works on a module's children
            quantizer.quantize(holder)
            setattr(parent, name, holder[0])
            count += 1
    return count


@torch.no_grad()
def stack_shared_inputs(model: torch.nn.Module) -> int:
    """Before quantizing: q/k/v and gate/up of each layer as one Linear over their rows stacked,
    behind their old names (fused_projections_torch.install), for the families the lean step runs.
    Quantized, each group is one int4 matmul instead of three (or two) and a concatenation: on an
    8B shape k and v are 1,024 rows each, far too small alone to read at the GPU's bandwidth. Each
    row's groups are quantized as they would be alone, so the numbers do not change. Returns how
    many groups were stacked."""
    from app.engine.backends.lean_step_torch import why_not_lean
    from app.models.fused_projections_torch import GROUPS, install

    if why_not_lean(model):
        return 0
    stacked = 0
    for layer in model.model.layers:
        for owner_name, names in GROUPS.items():
            owner = getattr(layer, owner_name)
            parts = [getattr(owner, name) for name in names]
            first = parts[0]
            if not all(type(p) is torch.nn.Linear and p.bias is None and p.in_features == first.in_features
                       and p.weight.dtype == first.weight.dtype and p.weight.device == first.weight.device
                       for p in parts):
                continue
            fused = torch.nn.Linear(first.in_features, sum(p.out_features for p in parts), bias=False,
                                    device=first.weight.device, dtype=first.weight.dtype)
            fused.weight.copy_(torch.cat([p.weight for p in parts]))
            install(owner, names, fused)
            stacked += 1
    return stacked


class LowPrecisionHead(torch.nn.Module):
    """The output head as its own copy in a lower float precision. For a small draft the head is
    most of the bytes read per token (SmolLM2-135M: 113 MB in float32 against 53 MB for the whole
    int4 body), and bfloat16 halves it while keeping the argmax far better than int4 does."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight.detach().to(dtype).clone(), requires_grad=False)
        self.out_dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight).to(self.out_dtype)


@torch.no_grad()
def lower_head_precision(model, dtype: torch.dtype = torch.bfloat16) -> None:
    """Replace the output head by a `LowPrecisionHead` (a tied input embedding keeps its weights)."""
    model.set_output_embeddings(LowPrecisionHead(model.get_output_embeddings(), dtype))
