"""The lean step's decoder layers as one compiled call on the CPU, for a GGUF whose every
projection is on Tandem's kernel (app/models/kernels_numba.decoder_body): any mix of the file's
types (gguf_codes.KERNEL_TYPES), layer by layer and within a stacked q/k/v or gate/up.

Why: on the demo (30 layers, 2 cores) the lean step's pass was ~1,200 PyTorch calls around the
int4 kernels; each costs a few microseconds of dispatch, and together they were half the step
(docs/performance.md). Numba compiles the whole stack of layers for the machine it runs on, so
a pass is one call: the embedding lookup before it and the screened head after it stay PyTorch.
The arithmetic is the lean step's (RMSNorm, RoPE by transformers' own cos/sin tables, grouped-
query attention, the SiLU-gated MLP), in float32 throughout; tests compare it with transformers'
forward over the same weights.

It runs where the whole stack is covered: the Llama family's layers without biases, every
product on CodeBlocks, SiLU, and no inner-layer states
asked for (EAGLE-3's heads take the PyTorch body). Anything else keeps the PyTorch body, and
`why_not` says why.
"""

from __future__ import annotations

import numpy as np
import torch

from app.models.int4_cpu_torch import threads


def why_not(lean) -> str:
    """"" where `lean` (a LeanStep) can run its layers as one compiled call, else why not."""
    from app.models.int4_cpu_torch import why_not_available

    if lean.device.type != "cpu" or lean.dtype != torch.float32:
        return "the compiled layers run on the CPU in float32"
    if getattr(lean.model.config, "hidden_act", "silu") != "silu":
        return f"the compiled layers cover the SiLU-gated MLP, not {lean.model.config.hidden_act}"
    if lean.head_dim % 16:  # the attention's sum tiles take 16 of a head's columns at a time
        return f"the compiled attention takes heads of a multiple of 16 wide, not {lean.head_dim}"
    for layer in lean.layers:
        if any(p.blocks is None for p in (layer.qkv, layer.o, layer.gate_up, layer.down)):
            return "not every projection is a GGUF weight on the compiled kernel"
        if (layer.q_norm is None) != (layer.k_norm is None):
            return "a q norm without a k norm"
    return why_not_available()


class NativeBody:
    """body(x, store, start, cos, sin) -> the final norm's output, as LeanStep.body gives it."""

    def __init__(self, lean):
        from numba.typed import List

        from app.models.int4_cpu_torch import compiled

        self.kernels = compiled()
        layers = lean.layers
        first = layers[0]
        self.heads, self.kv_heads, self.head_dim = lean.heads, lean.kv_heads, lean.head_dim
        self.scaling = np.float32(lean.scaling)
        self.eps = np.float32(first.input_norm.variance_epsilon)
        self.norms = np.stack([np.stack([_weights(layer.input_norm), _weights(layer.post_norm)]) for layer in layers])
        if first.q_norm is not None:
            self.qk_norms = np.stack([np.stack([_weights(layer.q_norm), _weights(layer.k_norm)]) for layer in layers])
            self.qk_eps = np.float32(first.q_norm.variance_epsilon)
        else:
            self.qk_norms, self.qk_eps = np.zeros((0, 2, self.head_dim), np.float32), np.float32(0.0)
        self.final_norm = _weights(lean.final_norm)
        self.inner = first.gate_up.blocks.rows // 2
        # one typed list per field of each product: passed to the compiled call as one object each
        _one_scale_type(layers)
        self.products = [tuple(List(arrays) for arrays in fields) for fields in _product_fields(layers)]
        # where the compiled products (by their scales' and offsets' types, one per product in every
        # layer since _one_scale_type) and attention are
        blocks = [getattr(first, role).blocks for role in ROLES]
        self.addresses = self.kernels.addresses([(b.scale.dtype, b.offset.dtype) for b in blocks])
        self._prepare(len(layers), first.input_norm.weight.shape[0])

    def _prepare(self, layers: int, width: int) -> None:
        """One token through the layers into a scratch cache, at load: the call is compiled (on a new
        machine, ~15 s), or read from the kernel cache, here and not at the first answer, where the
        window would sit silent after "Loaded"."""
        store = np.zeros((layers, 2, self.kv_heads, 1, self.head_dim), np.float32)
        cos = np.ones((1, self.head_dim), np.float32)
        self(torch.zeros(1, width), torch.from_numpy(store), 0, torch.from_numpy(cos), torch.zeros(1, self.head_dim))

    def __call__(self, x: torch.Tensor, store: torch.Tensor, start: int, cos: torch.Tensor,
                 sin: torch.Tensor, parent: np.ndarray | None = None) -> torch.Tensor:
        """`parent`: for a token tree's pass, each token's parent in the pass (kernels_numba's
        decoder_body); None for a causal pass. cos/sin: each token's rows."""
        hidden = np.array(x.numpy(), dtype=np.float32, order="C")  # a copy: updated in place, the residual stream
        out = np.empty_like(hidden)
        self.kernels.decoder_body(
            hidden, store.numpy(), start, np.ascontiguousarray(cos.numpy(), dtype=np.float32),
            np.ascontiguousarray(sin.numpy(), dtype=np.float32), self.norms, self.eps, self.qk_norms, self.qk_eps,
            self.heads, self.kv_heads, self.head_dim, self.scaling, self.inner, *self.products,
            self.final_norm, out, threads(), CAUSAL if parent is None else np.ascontiguousarray(parent, np.int64),
            self.addresses)
        return torch.from_numpy(out)


CAUSAL = np.zeros(0, np.int64)  # decoder_body's `parent` for a causal pass


ROLES = ("qkv", "o", "gate_up", "down")


def _one_scale_type(layers) -> None:
    """A typed list holds arrays of one type: where a product's scales are halves in some layers
    and float32 in others (a file's fp16 scale field that some layer's offset -8 d outgrows), that
    product's scales and offsets are widened to float32 in every layer (the same values)."""
    for role in ROLES:
        projections = [getattr(layer, role) for layer in layers]
        types = {(p.blocks.scale.dtype, p.blocks.offset.dtype) for p in projections}
        if len(types) > 1:
            for p in projections:
                p.blocks.widened()
                p.single.expose()  # the module's buffers follow, so the halves are let go


def _product_fields(layers) -> list[list[list[np.ndarray]]]:
    """Per product, each CodeBlocks array across the layers, in decoder_body's argument order."""
    from app.models.int4_cpu_torch import CodeBlocks

    return [[[getattr(getattr(layer, role).blocks, name) for layer in layers] for name in CodeBlocks.ARRAYS]
            for role in ROLES]


def _weights(norm: torch.nn.Module) -> np.ndarray:
    return np.ascontiguousarray(norm.weight.detach().float().numpy())
