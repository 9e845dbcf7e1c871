"""A leaner forward pass over transformers' own modules, for the Llama family (Llama, Mistral,
Qwen2, Qwen3, SmolLM2).

transformers' forward spends most of a small model's decode step between the kernels: on the demo
(30 layers) a one-token pass made about 1,300 PyTorch calls, each a few microseconds of dispatch,
around 10 ms of int4 kernels (profile in docs/performance.md). The same weights, read
by the same kernels, need far fewer calls when the pass is written for decoding (gpt-fast's
`decode_one_token` is the model for this):

- one KV buffer for all layers, written in place (static_kv_torch.py), with no per-layer cache
  objects, mask builders or attention-interface dispatch;
- a fused q/k/v or gate/up product (fused_projections_torch.py) is one kernel call, the int4/int8
  kernels are called directly with the activation converted once per input;
- RoPE is one batched matmul per layer by a per-pass rotation matrix (built once per pass from
  transformers' own cos/sin), instead of rotate_half's slices, negation and concatenation;
- the residual adds take the kernel's bfloat16 output as it is (an exact promotion to float32).

Only the weights and the rotary embedding's cos/sin come from the transformers model; the
arithmetic is the model family's own (RMSNorm, SiLU-gated MLP, grouped-query attention), and a
test compares the logits with transformers' forward. The same code runs with static shapes (a
padded width, a length bucket, positions as a tensor) for a CUDA graph to capture
(cuda_graphs_torch.py): nothing in it reads a value back to the host.

Anything outside that family, or with a layer kind it does not cover (sliding windows, rope that
changes with the length, a multimodal wrapper), keeps transformers' forward, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from app.engine.backends.layer_glue_torch import EagerGlue, FusedGlue
from app.engine.backends.static_kv_torch import StaticKV

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
FIXED_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq does not depend on the length


def why_not_lean_config(config) -> str:
    """What the config alone tells: "" where the lean step may run such a model, else why not."""
    kind = getattr(config, "model_type", "?")
    if kind not in FAMILIES:
        return f"the lean step covers {', '.join(FAMILIES)}, not {kind}"
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return f"{kind}: pretraining_tp > 1"
    types = set(getattr(config, "layer_types", None) or ("full_attention",))
    if types != {"full_attention"} or _window_set(config):
        return f"{kind}: sliding-window layers"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in FIXED_ROPE:
        return f"{kind}: {rope} rope changes with the length"
    return ""


def _window_set(config) -> bool:
    """A config without layer types that still slides a window (Mistral's: on unless turned off;
    Qwen2's and others': only where `use_sliding_window` says so)."""
    kind = getattr(config, "model_type", "")
    return bool(getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", kind == "mistral"))


def why_not_lean(model: torch.nn.Module) -> str:
    """"" where the lean step can run `model`, else why not (in a user's words)."""
    config = model.config
    kind = getattr(config, "model_type", "?")
    reason = why_not_lean_config(config)
    if reason:
        return reason
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        return f"{kind}: no decoder layer list"
    if getattr(inner, "rotary_emb", None) is None or getattr(inner, "norm", None) is None:
        return f"{kind}: no rotary embedding or final norm where expected"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(hasattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")) or \
                not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return f"{kind}: a layer without the usual projections"
    if model.get_output_embeddings() is None:
        return f"{kind}: no output head"
    return ""


RECURRENT_LAYERS = ("linear_attention", "mamba", "conv")  # layer types that carry a state along the sequence


def tree_words(config, reason: str) -> str:
    """Whether the target verifies trees of drafts (docs/trees.md), from its config and why the
    lean step does not run it ("" where it does)."""
    text = getattr(config, "text_config", None) or config
    types = getattr(text, "layer_types", None) or ()
    if any(any(kind in str(t) for kind in RECURRENT_LAYERS) for t in types):
        return ("drafts verified as chains, not trees: its recurrent layers read a pass in order, so a tree's "
                "siblings would corrupt each other's state")
    # layers that keep a window or a chunk of the past (Gemma 2/3's sliding, Llama 4's chunked), or
    # share another layer's cache: transformers' cache for them takes no tree (tree_torch.py)
    sliding = any(any(word in str(t) for word in ("sliding", "chunked", "dummy")) for t in types) or (
        not types and _window_set(text))
    if sliding:
        return ("drafts verified as chains, not trees: its sliding-window (or chunked) layers keep part of the past "
                "only (docs/trees.md)")
    if reason:
        return "trees of drafts verified through transformers' forward (a custom attention mask)"
    return "trees of drafts verified on the CPU; chains on an NVIDIA GPU (CUDA graphs do not take trees yet)"


def passes_words(config) -> str:
    """How PyTorch will run a model's passes, and whether it verifies trees, for `models info`."""
    reason = why_not_lean_config(config)
    trees = tree_words(config, reason)
    if reason:
        return f"passes on PyTorch: transformers' forward ({reason}); {trees}"
    return ("passes on PyTorch: the lean step, replayed as CUDA graphs on an NVIDIA GPU; on the CPU, a GGUF "
            "whose projections are all on Tandem's kernel (every common type) runs its decoder layers as one "
            f"compiled call (docs/performance.md); {trees}")


def passes_line(path) -> str:
    """How PyTorch will run the passes of the model at `path`, from its config: a folder's
    config.json, or a GGUF's architecture (`tandem-cli models info`)."""
    from types import SimpleNamespace

    if path.suffix.lower() == ".gguf":
        from app.models.gguf_import import inspect_gguf

        return passes_words(SimpleNamespace(model_type=inspect_gguf(path).architecture))
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:  # a family this transformers does not know
        return f"passes on PyTorch: unknown ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return passes_words(config)


class _Product:
    """One or more projections that read the same input, as one call: (n, in) -> (n, out...).

    A fused stack (fused_projections_torch.SharedProduct) or a lone GGUF int4/int8 layer calls
    its kernel directly on the input in the kernel's activation dtype (`act`); dense nn.Linear
    projections become one matmul over their weights stacked (`_stack_dense`); other modules
    (torchao's layers) are called as they are, and their outputs joined."""

    def __init__(self, modules: list[torch.nn.Module], dtype: torch.dtype):
        from app.models.fused_projections_torch import ProjectionSlice

        shared = {id(m.shared): m.shared for m in modules if isinstance(m, ProjectionSlice)}
        whole = len(shared) == 1 and all(isinstance(m, ProjectionSlice) for m in modules)
        if whole:
            fused = next(iter(shared.values())).fused
            ordered = sorted(modules, key=lambda m: m.start)
            whole = ordered == modules and modules[0].start == 0 and modules[-1].end == fused.out_features
        self.kernel = _kernel(fused) if whole else (_kernel(modules[0]) if len(modules) == 1 else None)
        if self.kernel is None and len(modules) > 1:
            self.kernel = _stack_dense(modules)
        self.modules = modules
        self.act = _act_dtype(fused if whole else modules[0], dtype) if self.kernel else dtype
        # the weight on Tandem's CPU kernel, where the whole product is one (compiled_layers_torch.py)
        self.single = fused if whole else (modules[0] if len(modules) == 1 else None)
        self.blocks = getattr(self.single, "blocks", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x)
        if len(self.modules) == 1:
            return self.modules[0](x)
        return torch.cat([m(x) for m in self.modules], dim=-1)


def _stack_dense(modules: list[torch.nn.Module]):
    """One matmul for dense projections that read the same input (gpt-fast's wqkv): their weights
    copied into one stacked tensor, each module's weight (and bias) then a view of its rows, so
    nothing is held twice and transformers' forward reads the same numbers. On a GPU this is two
    to three fewer kernel launches per projection group, which is what a small model's pass is
    made of. None where the modules are not plain nn.Linear layers alike (quantized, offloaded)."""
    first = modules[0]
    if not all(type(m) is torch.nn.Linear for m in modules):
        return None
    weight = first.weight
    if weight.device.type == "meta" or any(
            m.weight.dtype != weight.dtype or m.weight.device != weight.device or m.in_features != first.in_features
            or (m.bias is None) != (first.bias is None) or m._forward_hooks or m._forward_pre_hooks
            for m in modules):
        return None
    with torch.no_grad():
        stacked = _adjacent([m.weight for m in modules])  # stacked by an earlier lean step
        bias = None if first.bias is None else _adjacent([m.bias for m in modules])
        if stacked is None or (first.bias is not None and bias is None):
            stacked = torch.cat([m.weight for m in modules])
            bias = None if first.bias is None else torch.cat([m.bias for m in modules])
            start = 0
            for m in modules:
                rows = m.out_features
                m.weight = torch.nn.Parameter(stacked[start:start + rows], requires_grad=False)
                if bias is not None:
                    m.bias = torch.nn.Parameter(bias[start:start + rows], requires_grad=False)
                start += rows
    return lambda x: F.linear(x, stacked, bias)


def _adjacent(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The one tensor `parts` are consecutive row blocks of (contiguous, in order, one storage),
    or None."""
    first = parts[0].detach()
    offset = first.storage_offset()
    for part in parts:
        if (not part.is_contiguous() or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or part.storage_offset() != offset):
            return None
        offset += part.numel()
    rows = sum(part.shape[0] for part in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _kernel(module: torch.nn.Module):
    """PyTorch's weight-only kernel a GGUF layer runs on, called without the module's own dtype
    round trip (the caller converts once); None for any other module."""
    from app.models.gguf_blocks import GROUP
    from app.models.gguf_layers_torch import GGUFCodesLinear, GGUFInt4Linear, GGUFInt8Linear, int4_kernel, on_blocks

    if isinstance(module, GGUFCodesLinear):
        return partial(on_blocks, module.blocks)  # Tandem's CPU kernel: float32 in and out
    if isinstance(module, GGUFInt4Linear):
        packed, scales, mm = module.packed, module.scales_and_zeros, int4_kernel(module.packed)
        return lambda x: mm(x, packed, GROUP, scales)
    if isinstance(module, GGUFInt8Linear):
        codes, scales = module.weight_int8, module.scales
        return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scales)
    if type(module).__name__ == "WeightOnlyInt4Linear" and not getattr(module, "padding", True):
        # torchao's int4 layer (torch_quantize.py): the kernel its forward calls, without the
        # reshapes and dtype round trips around it (the caller converts to `precision` once)
        packed, scales, group = module.weight, module.scales_and_zeros, module.groupsize
        if scales.dtype != torch.bfloat16 or module.precision != torch.bfloat16:
            return None
        ops = torch.ops.aten
        mm = ops._weight_int4pack_mm_for_cpu if packed.device.type == "cpu" else ops._weight_int4pack_mm
        return lambda x: mm(x, packed, group, scales)
    return None


def _act_dtype(module: torch.nn.Module, dtype: torch.dtype) -> torch.dtype:
    """The activation dtype a kernel called directly takes: a GGUF layer's, torchao's precision."""
    return getattr(module, "act_dtype", None) or getattr(module, "precision", None) or dtype


@dataclass
class _Layer:
    input_norm: torch.nn.Module
    post_norm: torch.nn.Module
    qkv: _Product
    o: _Product
    gate_up: _Product
    down: _Product
    act_fn: torch.nn.Module
    q_norm: torch.nn.Module | None  # Qwen3 normalises each head's q and k before RoPE
    k_norm: torch.nn.Module | None


@dataclass
class StaticShape:
    """A pass at a fixed shape, as a CUDA graph replays it: `positions` (width,) on the device
    (padding past the real tokens continues the count), attention over the first `length`
    positions of the buffer, the rest masked."""

    positions: torch.Tensor
    length: int


class LeanStep:
    """The forward pass (logits of the last `keep` positions, and the final norm's output when
    asked) over `model`'s modules; `why_not_lean(model)` must be ""."""

    def __init__(self, model: torch.nn.Module, fused: bool = False):
        config = model.config
        inner = model.model
        self.model, self.embed, self.final_norm = model, inner.embed_tokens, inner.norm
        self.rotary = inner.rotary_emb
        self.head = model.get_output_embeddings()
        first = inner.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.dtype = _compute_dtype(model)
        self.device = inner.norm.weight.device
        self.layers = [self._layer(layer) for layer in inner.layers]
        self._cos = self._sin = None  # (positions, head_dim) tables, grown with the cache
        self.glue = self.new_glue(fused)
        # the decoder layers as one compiled call on the CPU (compiled_layers_torch.py), where it covers them
        from app.engine.backends.compiled_layers_torch import NativeBody, why_not

        self.native_note = why_not(self)
        self.native = None if self.native_note else NativeBody(self)
        products = [p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        on_kernel = sum(p.blocks is not None for p in products)
        # where only some products are on the kernel (a type it lacks, or a layer it cannot take)
        partly = on_kernel and self.native is None
        self.kernel_words = (f"{on_kernel} of {len(products)} products on Tandem's CPU kernel "
                             f"(layers not compiled as one: {self.native_note})") if partly else ""
        # masked attention over each KV head's queries together (`_attend`): CUDA's path. (One SDPA
        # call over the grouped queries, cuDNN's kernel, measured no faster on an H100: 7.01 against
        # 6.95 ms for the 8B shape's width-1 pass, docs/performance.md)
        self.grouped = self.device.type != "cpu"
        # inner layers whose entering states `forward(hidden=True)` hands over side by side
        # (EAGLE-3's fused layers), or () for the final norm's output; an output of the pass
        # itself, so captured graphs hand them over too
        self.aux: tuple[int, ...] = ()

    def new_glue(self, fused: bool) -> EagerGlue:
        """The glue between the matmuls (layer_glue_torch.py): fused by torch.compile, or eager."""
        kind = FusedGlue if fused else EagerGlue
        return kind(self.heads, self.kv_heads, self.head_dim, self.dtype).to(self.device)

    def _layer(self, layer: torch.nn.Module) -> _Layer:
        attn, mlp, dtype = layer.self_attn, layer.mlp, self.dtype
        return _Layer(layer.input_layernorm, layer.post_attention_layernorm,
                      _Product([attn.q_proj, attn.k_proj, attn.v_proj], dtype), _Product([attn.o_proj], dtype),
                      _Product([mlp.gate_proj, mlp.up_proj], dtype), _Product([mlp.down_proj], dtype),
                      mlp.act_fn, getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))

    def new_cache(self, capacity: int = 0, fixed: bool = False) -> StaticKV:
        return StaticKV(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, capacity, fixed)

    def rope_tables(self, end: int) -> None:
        """cos/sin for positions 0..end-1 from the model's own rotary embedding (its scaling rules)."""
        if self._cos is not None and self._cos.shape[0] >= end:
            return
        room = max(end, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
        positions = torch.arange(room, device=self.device)[None]
        probe = torch.empty(0, device=self.device, dtype=self.dtype)
        cos, sin = self.rotary(probe, positions)  # (1, room, head_dim) in the model's dtype
        self._cos, self._sin = cos[0], sin[0]

    def forward(self, ids: torch.Tensor, kv: StaticKV, keep: int, hidden: bool = False,
                static: StaticShape | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ids (1, n) at kv.length: logits of the last `keep` positions (keep, V) in the
        head's dtype, and with `hidden` the final norm's output (n, D). `static`: the positions
        and attended length come as tensors (a CUDA graph's capture); kv.appended is the caller's."""
        n, start = ids.shape[1], kv.length
        if self.native is not None and static is None and not (hidden and self.aux) and not self.glue.fused:
            end = start + n
            kv.reserve(end)
            self.rope_tables(end)
            x = self.embed(ids)[0].to(self.dtype)
            normed = self.native(x, kv.store, start, self._cos[start:end], self._sin[start:end])
            return self.head(normed[n - keep:]), (normed if hidden else None)
        if static is None:  # eager: exact lengths
            end = start + n
            kv.reserve(end)
            self.rope_tables(end)
            rope = self.glue.rope_inputs(self._cos[start:end], self._sin[start:end])
            # keys past each query's own position are hidden: only a pass of several tokens has any
            mask = (torch.arange(end, device=self.device)[None, :] <=
                    torch.arange(start, end, device=self.device)[:, None]) if n > 1 else None
        else:
            end = static.length
            rope = self.glue.rope_inputs(self._cos.index_select(0, static.positions),
                                         self._sin.index_select(0, static.positions))
            mask = torch.arange(end, device=self.device)[None, :] <= static.positions[:, None]
        if mask is not None and self.grouped:
            # CUDA's path takes the mask as an additive bias, built once per pass for every layer
            mask = _mask_bias(mask, self.heads // self.kv_heads, self.dtype)
        x = self.embed(ids)[0].to(self.dtype)  # (n, D)
        states: dict[int, torch.Tensor] | None = {} if hidden and self.aux else None
        normed = self.body(x, kv.store, rope, mask, start, end, None if static is None else static.positions,
                           states)
        logits = self.head(normed[n - keep:])
        if states is not None:
            return logits, torch.cat([states[i] for i in self.aux], -1)
        return logits, (normed if hidden else None)

    def forward_tree(self, ids: torch.Tensor, kv: StaticKV, positions: torch.Tensor, mask: torch.Tensor | None,
                     parent, hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A token tree's pass (app/engine/tree.py): ids (1, n) written at kv.length.. in the pass's
        order, each at the RoPE position in `positions` (n,) -> logits (n, V), and with `hidden`
        each token's state as `forward` hands it over (the final norm's output, or the `aux`
        layers' side by side). With `mask` (n, kv.length + n, True where a row may look) the
        PyTorch body runs; without it the compiled call, which takes `parent` (n,: each token's
        parent in the pass; None for a chain, a causal pass) and gives each node, bit for bit, a
        one-token step along its path (kernels_numba._attend_tree). The compiled call hands over
        the final norm's output only: a pass that wants `aux` states comes with a mask."""
        if self.glue.fused:
            raise NotImplementedError("a tree's pass runs on the eager glue")
        n, start = ids.shape[1], kv.length
        end = start + n
        kv.reserve(end)
        self.rope_tables(int(positions.max()) + 1)
        x = self.embed(ids)[0].to(self.dtype)
        if mask is None:
            if self.native is None or (hidden and self.aux):
                raise ValueError("this tree's pass needs its mask: it runs on the PyTorch body")
            normed = self.native(x, kv.store, start, self._cos.index_select(0, positions),
                                 self._sin.index_select(0, positions), parent)
            return self.head(normed), (normed if hidden else None)
        rope = self.glue.rope_inputs(self._cos.index_select(0, positions), self._sin.index_select(0, positions))
        if self.grouped:
            mask = _mask_bias(mask, self.heads // self.kv_heads, self.dtype)
        states: dict[int, torch.Tensor] | None = {} if hidden and self.aux else None
        normed = self.body(x, kv.store, rope, mask, start, end, None, states)
        if states is not None:
            return self.head(normed), torch.cat([states[i] for i in self.aux], -1)
        return self.head(normed), (normed if hidden else None)

    def takes_tree_natively(self, hidden: bool) -> bool:
        """Whether a tree's pass runs on the compiled call (no mask): not for `aux` states."""
        return self.native is not None and not self.glue.fused and not (hidden and self.aux)

    def body(self, x: torch.Tensor, store: torch.Tensor, rope, mask: torch.Tensor | None,
             start: int, end: int, positions: torch.Tensor | None,
             states: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """The decoder layers and the final norm: x (n, D) -> (n, D), keys and values written into
        `store` at start.. (or at `positions`), attention over its first `end` positions. Tensors in,
        tensors out, no host reads: what a CUDA graph takes whole. Each residual add goes with the
        norm after it (one fused kernel where the glue is fused). `states`: filled with the
        residual stream entering each layer in `self.aux` (the count: the last layer's output)."""
        glue, layers = self.glue, self.layers
        h = glue.norm(x, layers[0].input_norm, layers[0].qkv.act)
        for index, layer in enumerate(layers):
            if states is not None and index in self.aux:
                states[index] = x.clone()  # the residual adds below work in place
            q, kv = glue.split_rope(layer.qkv(h), rope, layer.q_norm, layer.k_norm)
            glue.write(store[index], kv, start, positions)
            keys, values = store[index, 0], store[index, 1]  # (Hkv, capacity, hd)
            out = self._attend(q, keys[:, :end], values[:, :end], mask)  # (n, H * hd)
            x, h = glue.add_norm(x, layer.o(out.to(layer.o.act)), layer.post_norm, layer.gate_up.act)
            y = layer.down(glue.gated(layer.gate_up(h), layer.act_fn, layer.down.act))
            following = layers[index + 1] if index + 1 < len(layers) else None
            norm, act = (following.input_norm, following.qkv.act) if following else (self.final_norm, self.dtype)
            x, h = glue.add_norm(x, y, norm, act)
        if states is not None and len(layers) in self.aux:
            states[len(layers)] = x
        return h

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Grouped-query attention without repeating the KV heads: q (H, n, hd), keys/values
        (Hkv, L, hd), mask (n, L) on the CPU, on CUDA its `_mask_bias`, or None -> (n, H * hd)."""
        n = q.shape[1]
        if not self.grouped or mask is None:
            # PyTorch's kernels take grouped heads as they are (enable_gqa); on the CPU with a mask too
            out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask,
                                                 scale=self.scaling, enable_gqa=True)[0]
            return out.transpose(0, 1).reshape(n, -1)
        # CUDA's fused kernels take no mask with grouped heads (and SDPA would repeat the cache),
        # so the queries of each KV head go together: (Hkv, group * n, hd) against that head's keys
        group = self.heads // self.kv_heads
        qg = q.reshape(self.kv_heads, group * n, self.head_dim)
        # (Hkv, group * n, L), masked positions at -inf
        scores = torch.baddbmm(mask, qg, keys.transpose(1, 2), alpha=self.scaling)
        weights = self.glue.softmax(scores, q.dtype)
        out = torch.bmm(weights, values).view(self.heads, n, self.head_dim)
        return out.transpose(0, 1).reshape(n, -1)


def _mask_bias(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """(1, group * n, L): 0 where a query may attend, -inf elsewhere (each query row repeated for
    the group's heads, which share its position)."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return bias.repeat(group, 1)[None]


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the residual stream runs in: the norms' (a GGUF's int4 layers keep float32 norms;
    a bfloat16 checkpoint's are bfloat16)."""
    return model.model.norm.weight.dtype
