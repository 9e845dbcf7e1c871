"""A DFlash block drafter on MLX (app/engine/backends/dflash_torch.py is the PyTorch side;
app/models/dflash_head.py says what the folder holds).

mlx-lm has no DFlash drafter, so the forward is ours over mlx-lm's own Qwen3 transformer block
(projections, q/k head norms, rotary rule, MLP, RMSNorms): the context features enter each layer's
keys and values beside the block's, and the block's queries attend to all of them, unmasked. The
same arithmetic as the PyTorch port, which the tests hold it to.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3
from mlx_lm.models.cache import KVCache

from app.engine.backends.head_cache_mlx import CachedLayersHead
from app.engine.backends.mlx_backend import DraftSteps, MLXBackend
from app.engine.sampling import SamplingParams
from app.models.dflash_head import DFlashHead
from app.models.errors import ModelFileError
from app.models.head_sources import check_tensors


def _args(head: DFlashHead) -> qwen3.ModelArgs:
    config = dict(head.config)
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope and rope.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", rope)
    config.setdefault("num_key_value_heads", config.get("num_attention_heads"))
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    config.setdefault("tie_word_embeddings", False)
    return qwen3.ModelArgs.from_dict(config)


class DFlashLayers(nn.Module):
    """The drafter's modules under its checkpoint's names."""

    def __init__(self, head: DFlashHead):
        super().__init__()
        args = _args(head)
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.layers = [qwen3.TransformerBlock(args) for _ in range(head.layer_count)]
        self.fc = nn.Linear(len(head.layers) * hidden, hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(hidden, eps=eps)
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def context(self, states: mx.array) -> mx.array:
        return self.hidden_norm(self.fc(states))

    def __call__(self, context: mx.array, noise: mx.array, start: int, caches: list[KVCache]) -> mx.array:
        """Context features (1, c, H) at positions start.., the block (1, b, H) after them, both
        appended to `caches` (which hold positions 0..start - 1) -> the block's normed outputs."""
        b, c = noise.shape[1], context.shape[1]
        x = noise
        for layer, cache in zip(self.layers, caches, strict=True):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).reshape(1, b, attn.n_heads, -1)).transpose(0, 2, 1, 3)
            both = mx.concatenate([context, h], axis=1)  # the context's keys and values, then the block's
            k = attn.k_norm(attn.k_proj(both).reshape(1, c + b, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
            v = attn.v_proj(both).reshape(1, c + b, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q, k = attn.rope(q, offset=start + c), attn.rope(k, offset=start)
            k, v = cache.update_and_fetch(k, v)
            # no mask: the block sees every context position and the whole block (DFlash's rule)
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=None)
            x = x + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def load_layers(head: DFlashHead, dtype) -> DFlashLayers:
    layers = DFlashLayers(head)
    wanted = dict(tree_flatten(layers.parameters()))
    loaded = {}
    for path in sorted(set(head.files.values())):
        for name, value in mx.load(str(path)).items():
            if name in wanted:
                loaded[name] = value.astype(dtype)
    check_tensors(head.folder.name, "drafter", {n: tuple(v.shape) for n, v in loaded.items()},
                  {n: tuple(v.shape) for n, v in wanted.items()})
    layers.load_weights(list(loaded.items()))
    mx.eval(layers.parameters())
    return layers


class MLXDFlashBlock(CachedLayersHead):
    """See TorchDFlashBlock: the drafter with its cache of context features, a block per call."""

    runner_ups = True  # its draft names each step's runner-up (a tree's leaves)

    def __init__(self, target: MLXBackend, head: DFlashHead):
        language = getattr(target.model, "language_model", target.model)
        if getattr(language, "model", None) is None or not hasattr(language.model, "embed_tokens"):
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach a DFlash drafter to this model's classes.")
        self.target, self.language, self.spec = target, language, head
        self.layers = load_layers(head, language.model.norm.weight.dtype)
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(self.layers.parameters()))
        self._own_stream()
        self.reset()

    def _logits(self, hidden: mx.array) -> mx.array:
        if self.language.args.tie_word_embeddings:
            logits = self.language.model.embed_tokens.as_linear(hidden)
        else:
            logits = self.language.lm_head(hidden)
        logits = logits[:, : self.target.vocab_limit].astype(mx.float32)
        if self.spec.output_scale != 1.0:
            logits = logits * self.spec.output_scale
        if self.spec.softcap > 0:
            logits = mx.tanh(logits / self.spec.softcap) * self.spec.softcap
        return logits

    def block(self, anchor: int, rows: mx.array | None, start: int) -> mx.array:
        """See TorchDFlashBlock.block."""
        spec = self.spec
        dtype = self.layers.fc.weight.dtype
        c = 0 if rows is None else rows.shape[-2]
        context = (self.layers.context(rows.reshape(1, c, -1).astype(dtype)) if c
                   else mx.zeros((1, 0, spec.hidden_size), dtype=dtype))
        ids = mx.array([[anchor] + [spec.mask_token_id] * (spec.block_size - 1)])
        noise = self.language.model.embed_tokens(ids).astype(dtype) * spec.input_scale
        out = self.layers(context, noise, start, self.caches)
        self.trim(self.length - spec.block_size)  # the block's own entries go: the cache keeps context only
        return out[0]

    def draft(self, anchor: int, rows: mx.array | None, start: int, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """See TorchDFlashBlock.draft."""
        out = self.block(anchor, rows, start)
        steps = DraftSteps(params, self._next_key, runner_up)
        n = min(k, self.spec.block_size - 1)
        if n <= 0 or (should_stop is not None and should_stop()):
            return steps.drafted()
        logits = self._logits(out[1 : 1 + n])
        for i in range(n):
            steps.pick(logits[i])
        return steps.drafted()
