"""An EAGLE-3 head on MLX, drafting for its target (app/engine/backends/eagle3_torch.py is the
PyTorch side; app/models/eagle3_head.py says what the folder holds).

mlx-lm has no EAGLE-3 head, so the forward is ours over mlx-lm's own Llama or Qwen3 transformer
block, attention (its projections widened to take [embedding; state], 2H) and rotary rules:
the same arithmetic as the PyTorch port, which the tests hold it to.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from app.engine.backends.head_cache_mlx import CachedLayersHead
from app.engine.backends.mlx_backend import DraftSteps, MLXBackend
from app.engine.sampling import SamplingParams
from app.models.eagle3_head import Eagle3Head
from app.models.errors import ModelFileError
from app.models.head_sources import check_tensors


def _args(head: Eagle3Head):
    model_type = head.layer_config.get("model_type", "llama")
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    config = dict(head.layer_config)
    # transformers 5 writes rope_parameters; mlx-lm reads rope_theta and rope_scaling
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope and rope.get("rope_type", "default") != "default":
        config.setdefault("rope_scaling", rope)
    config.setdefault("num_key_value_heads", config.get("num_attention_heads"))
    config.setdefault("tie_word_embeddings", False)
    return module, module.ModelArgs.from_dict(config)


class Eagle3Layers(nn.Module):
    """The head's modules under the speculators layout's names (d2t kept beside, not a weight)."""

    def __init__(self, head: Eagle3Head):
        super().__init__()
        module, args = _args(head)
        hidden, eps, fused = args.hidden_size, args.rms_norm_eps, len(head.layers) * head.target_hidden_size
        self.flags = dict(head.flags)
        self.fc = nn.Linear(fused, hidden, bias=False)
        self.layers = [module.TransformerBlock(args) for _ in range(head.layer_count)]
        attn, bias = self.layers[0].self_attn, bool(getattr(args, "attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj"):
            width = getattr(attn, name).weight.shape[0]
            setattr(attn, name, nn.Linear(2 * hidden, width, bias=bias))
        self.layers[0].hidden_norm = nn.RMSNorm(hidden, eps=eps)
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.lm_head = nn.Linear(hidden, head.draft_vocab, bias=False)
        if head.flags.get("norm_before_fc"):
            self.input_norm = nn.RMSNorm(fused, eps=eps)
        if head.flags.get("fc_norm"):
            self.fc_norm = [nn.RMSNorm(head.target_hidden_size, eps=eps) for _ in head.layers]
        if head.own_embedding:
            self.embed_tokens = nn.Embedding(head.target_vocab, hidden)

    def fuse(self, states: mx.array) -> mx.array:
        if self.flags.get("norm_before_fc"):
            states = self.input_norm(states)
        if self.flags.get("fc_norm"):
            parts = mx.split(states, len(self.fc_norm), axis=-1)
            states = mx.concatenate([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], axis=-1)
        return self.fc(states)

    def __call__(self, embeds: mx.array, hidden: mx.array, caches: list[KVCache]) -> mx.array:
        first = self.layers[0]
        normed = first.hidden_norm(hidden)
        residual = normed if self.flags.get("norm_before_residual") else hidden
        wide = mx.concatenate([first.input_layernorm(embeds), normed], axis=-1)
        mask = create_attention_mask(wide, caches[0])
        x = residual + first.self_attn(wide, mask, caches[0])
        x = x + first.mlp(first.post_attention_layernorm(x))
        for layer, cache in zip(self.layers[1:], caches[1:], strict=True):
            x = layer(x, mask, cache)
        return x


def load_layers(head: Eagle3Head, dtype) -> tuple[Eagle3Layers, mx.array]:
    """The head's modules with its checkpoint's tensors (checked by name and shape), and d2t."""
    layers = Eagle3Layers(head)
    wanted = dict(tree_flatten(layers.parameters()))
    loaded, d2t = {}, None
    for path in sorted({path for path, _ in head.files.values()}):
        for stored, value in mx.load(str(path)).items():
            name = "layers.0." + stored[len("midlayer."):] if stored.startswith("midlayer.") else stored
            if name == "d2t":
                d2t = value.astype(mx.int64)
            elif name in wanted:
                loaded[name] = value.astype(dtype)
    check_tensors(head.folder.name, "head", {n: tuple(v.shape) for n, v in loaded.items()},
                  {n: tuple(v.shape) for n, v in wanted.items()}, head.shown)
    layers.load_weights(list(loaded.items()))
    mx.eval(layers.parameters())
    if d2t is None:  # one vocabulary: the map is the identity
        d2t = mx.zeros((head.draft_vocab,), dtype=mx.int64)
    return layers, mx.arange(head.draft_vocab) + d2t


class MLXEagle3Head(CachedLayersHead):
    """See TorchEagle3Head: the head with its own KV caches, read and chained by MTPDrafter."""

    runner_ups = True  # its draft names each step's runner-up (a tree's leaves)

    def __init__(self, target: MLXBackend, head: Eagle3Head):
        language = getattr(target.model, "language_model", target.model)
        if getattr(language, "model", None) is None or not hasattr(language.model, "embed_tokens"):
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach an EAGLE-3 head to this model's classes.")
        self.target, self.language, self.spec = target, language, head
        dtype = language.model.norm.weight.dtype
        self.layers, self.targets = load_layers(head, dtype)
        high, low = int(mx.max(self.targets).item()), int(mx.min(self.targets).item())
        if low < 0 or high >= head.target_vocab:
            raise ModelFileError(f"{head.folder.name}: its d2t map sends draft tokens outside the target's "
                                 f"{head.target_vocab} tokens. The file is damaged.")
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(self.layers.parameters()))
        self._own_stream()
        self._limit = -1
        self.reset()

    def restart_vocab(self, tokens: Sequence[int]) -> None:
        """The draft vocabulary is the head's own, fixed."""

    def _pass(self, ids: mx.array, hidden: mx.array) -> mx.array:
        own = getattr(self.layers, "embed_tokens", None)  # a head that carries its own copy
        embeds = (own if own is not None else self.language.model.embed_tokens)(ids)
        return self.layers(embeds, hidden.astype(embeds.dtype), self.caches)

    def logits(self, out: mx.array) -> mx.array:
        """The head's output row (H,) -> logits over the target's ids (V',), -inf where the draft
        vocabulary has no token."""
        small = self.layers.lm_head(self.layers.norm(out)).astype(mx.float32)
        limit = self.target.vocab_limit
        if limit != self._limit:
            import numpy as np

            targets = np.array(self.targets)
            rows = np.nonzero(targets < limit)[0]
            self._limit, self._rows, self._ids = limit, mx.array(rows), mx.array(targets[rows])
        full = mx.full((limit,), float("-inf"), dtype=mx.float32)
        full[self._ids] = small[self._rows]
        return full

    def draft(self, tokens: Sequence[int], rows: mx.array, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """See TorchEagle3Head.draft."""
        fused = self.layers.fuse(rows.reshape(1, *rows.shape[-2:]).astype(self.layers.fc.weight.dtype))
        last = self._pass(mx.array([list(tokens)]), fused)[:, -1:]
        steps = DraftSteps(params, self._next_key, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():
                break
            token = steps.pick(self.logits(last[0, -1]))
            if i < k - 1:
                state = self.layers.norm(last) if self.spec.flags.get("norm_output") else last
                last = self._pass(token.reshape(1, 1), state)
                mx.async_eval(last)
        return steps.drafted()
