"""One quantized matmul for the projections that read the same input (q/k/v; gate/up).

At one token a 135M model's int4 matmul is 25 us, most of it the call itself and the activation's
dtype round trip, not the arithmetic; a layer makes seven. Projections that read the same hidden
state (attention's q, k and v; the MLP's gate and up) can be one matmul over their rows stacked
(gpt-fast's `wqkv`, llama.cpp's fused QKV), which cuts the calls per layer from seven to four.

transformers' model code calls each projection by its own name, so the fused matmul stays behind
those names: each name becomes a slice of one shared product, computed once per input tensor
(the model hands all of them the very same tensor object) and again if a caller passes another.
The loader (app/models/gguf_torch.py) fills the stacked weights in place, so no part is ever
held twice.
"""

from __future__ import annotations

import torch

GROUPS = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


class _Latest:
    """A plain holder, so that remembering a product costs no nn.Module attribute machinery
    (Module.__setattr__ on every projection call was 6% of a demo forward under cProfile)."""

    __slots__ = ("input", "output", "waiting")

    def __init__(self):
        self.input = self.output = None
        self.waiting: set[int] = set()


class SharedProduct(torch.nn.Module):
    """The stacked matmul, remembering its latest input and output (by object identity) until
    every projection has taken its part: a long prefill's product is not kept past its layer."""

    def __init__(self, fused: torch.nn.Module, parts: int):
        super().__init__()
        self.fused, self.parts = fused, parts
        self.latest = _Latest()

    def of(self, x: torch.Tensor, part: int) -> torch.Tensor:
        latest = self.latest
        if x is not latest.input or part not in latest.waiting:
            # holding x keeps its identity from being taken by a new tensor meanwhile
            latest.input, latest.output = x, self.fused(x)
            latest.waiting = set(range(self.parts))
        output = latest.output
        latest.waiting.discard(part)
        if not latest.waiting:
            latest.input = latest.output = None
        return output


class ProjectionSlice(torch.nn.Module):
    """One projection's columns of a SharedProduct, under its old name (q_proj, up_proj, ...)."""

    def __init__(self, shared: SharedProduct, part: int, start: int, end: int, in_features: int):
        super().__init__()
        self.shared = shared  # a submodule of each slice: its buffers are counted once (deduplicated)
        self.part, self.start, self.end = part, start, end
        self.in_features, self.out_features = in_features, end - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.of(x, self.part)[..., self.start:self.end]

    def dequantized(self) -> torch.Tensor:
        """This projection's weights as the kernel reads them (float32), where the kind can say."""
        return self.shared.fused.dequantized()[self.start:self.end]

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.end} of a fused {type(self.shared.fused).__name__}"


def install(owner: torch.nn.Module, names: tuple[str, ...], fused: torch.nn.Module) -> dict[str, int]:
    """Put `fused` (the parts' rows stacked in the order of `names`) behind the parts' names;
    returns each name's first row in it."""
    shared, start, offsets = SharedProduct(fused, len(names)), 0, {}
    for i, name in enumerate(names):
        part = getattr(owner, name)
        offsets[name] = start
        setattr(owner, name, ProjectionSlice(shared, i, start, start + part.out_features, part.in_features))
        start += part.out_features
    return offsets
