"""A Gemma 4 assistant on MLX: our port of transformers' `Gemma4AssistantForCausalLM` (mlx-lm has
none), built from mlx-lm's own Gemma 4 decoder layers, loading the same safetensors; fed as
app/engine/assistant.py says, with the keys and values read from the target's mlx-lm caches.

The port, step by step as transformers computes it: pre_projection of cat(embedding, hidden)
(2 * backbone -> hidden); each layer attends with its own queries to the target's keys and values
of its kind (no keys of its own: every layer is KV-shared), a sliding layer to the last
sliding_window + 1 of them (what transformers' bidirectional window mask, flipped, keeps for one
query: measured, not documented; the drafter passes fewer, so it never cuts in practice); the
final norm; post_projection back to the backbone size (the next step's hidden state); logits from
the tied embedding, or from the centroid-masked head where `use_ordered_embeddings` is set. No
final soft-capping: transformers' assistant applies none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gemma4_text import DecoderLayer, ModelArgs

from app.engine.assistant_kv import kv_producers, window_start
from app.engine.backends.base import entropy_seed
from app.engine.backends.mlx_backend import DraftSteps, MLXBackend
from app.engine.sampling import SamplingParams

_UNUSED = (".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm", ".self_attn.v_norm")


def assistant_args(text: dict) -> ModelArgs:
    """mlx-lm's Gemma 4 layer arguments for the assistant's text config: every layer KV-shared,
    no per-layer inputs (transformers' Gemma4AssistantConfig requires both)."""
    text = dict(text)
    if "global_head_dim" not in text:  # a config written by transformers keeps it per full layer
        full = [v for v in (text.get("per_layer_config") or {}).values() if "head_dim" in v]
        text["global_head_dim"] = full[0]["head_dim"] if full else text.get("head_dim")
    args = ModelArgs.from_dict(text)
    args.num_kv_shared_layers = args.num_hidden_layers
    args.hidden_size_per_layer_input = 0
    return args


class MaskedEmbedder(nn.Module):
    """transformers' Gemma4AssistantMaskedEmbedder: score `num_centroids` clusters of the
    vocabulary, keep the top `centroid_intermediate_top_k`, compute logits only for their tokens
    (`token_ordering` lists each cluster's tokens); every other token gets min(selected) - 1."""

    def __init__(self, hidden: int, vocab: int, centroids: int, top_k: int):
        super().__init__()
        self.centroids = nn.Linear(hidden, centroids, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.top_k, self.n_centroids, self.vocab = top_k, centroids, vocab

    def __call__(self, h: mx.array, head: mx.array) -> mx.array:
        """h (1, 1, hidden), head (V, hidden) -> logits (1, 1, V)."""
        scores = self.centroids(h)[0, 0]  # (C,)
        top = mx.argpartition(-scores, self.top_k - 1)[: self.top_k]  # the clusters kept (order is irrelevant)
        tokens = self.token_ordering.reshape(self.n_centroids, -1)[top].reshape(-1)  # (top_k * V / C,)
        selected = head[tokens] @ h[0, 0]  # (top_k * V / C,)
        logits = mx.full((self.vocab,), selected.min() - 1.0, dtype=selected.dtype)
        logits[tokens] = selected
        return logits.reshape(1, 1, -1)


class _Inner(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, layer_idx=i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Gemma4Assistant(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.args = args = assistant_args(config["text_config"])
        backbone = config["backbone_hidden_size"]
        self.tied = config.get("tie_word_embeddings", True)
        self.model = _Inner(args)
        self.pre_projection = nn.Linear(2 * backbone, args.hidden_size, bias=False)
        self.post_projection = nn.Linear(args.hidden_size, backbone, bias=False)
        if not self.tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if config.get("use_ordered_embeddings"):
            self.masked_embedding = MaskedEmbedder(args.hidden_size, args.vocab_size, config["num_centroids"],
                                                   config["centroid_intermediate_top_k"])

    def __call__(self, embeds: mx.array, kv: dict, position: int):
        """embeds (1, 1, 2 * backbone), kv {kind: (keys, values) (1, kv_heads, n, head_dim)} ->
        (logits (1, 1, V), the projected hidden state (1, 1, backbone))."""
        h = self.pre_projection(embeds)
        offset = mx.array(position)
        for layer in self.model.layers:
            keys, values = kv[layer.layer_type]
            if layer.layer_type == "sliding_attention":
                keep = self.args.sliding_window + 1
                keys, values = keys[:, :, -keep:], values[:, :, -keep:]
            h, _, _ = layer(h, None, None, shared_kv=(keys, values), offset=offset)
        h = self.model.norm(h)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        if "masked_embedding" in self:
            logits = self.masked_embedding(h, head)
        else:
            logits = h @ head.T
        return logits, self.post_projection(h)

    def sanitize(self, weights: dict) -> dict:
        return {k: (v.astype(mx.int32) if k.endswith("token_ordering") else v) for k, v in weights.items()
                if not k.endswith(tuple(f"{u}.weight" for u in _UNUSED)) and not (self.tied and k == "lm_head.weight")}


def load_assistant(folder: Path, config: dict) -> Gemma4Assistant:
    model = Gemma4Assistant(config)
    weights = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(path)))
    model.load_weights(list(model.sanitize(weights).items()), strict=True)
    mx.eval(model.parameters())
    return model


def _text_model(model: nn.Module) -> nn.Module:
    """mlx-lm's Gemma 4 text model inside a target: gemma4_text's `model`, gemma4's `language_model.model`."""
    inner = getattr(model, "language_model", model)
    return inner.model


def shared_kv_states(target: MLXBackend, producers: dict[str, int], position: int, window: int) -> dict | None:
    """The target's keys and values of positions before `position` per kind of layer, as in
    assistant_torch.shared_kv_states; None once a sliding layer's ring has wrapped (its keys are
    then out of order, and speculation on MLX has stopped there anyway: MLXCache.rollback_room)."""
    states = {}
    for kind, index in producers.items():
        layer = target.cache.layers[index]
        if layer.offset < position or layer.offset > getattr(layer, "max_size", layer.offset):
            return None
        first = window_start(position, window) if kind == "sliding_attention" else 0
        states[kind] = (layer.keys[:, :, first:position], layer.values[:, :, first:position])
    return states


class MLXAssistant:
    def __init__(self, folder: Path, config: dict, target: MLXBackend):
        self.target = target
        self.model = load_assistant(folder, config)
        text = _text_model(target.model)
        self.embed, self.embed_scale = text.embed_tokens, text.embed_scale  # Gemma's scaled embedding
        layer_types = [layer.layer_type for layer in text.layers]
        self.producers = kv_producers(layer_types, len(text.layers) - text.config.num_kv_shared_layers)
        self.window = self.model.args.sliding_window
        # its own random key: never the target's stream (the Leviathan/Chen proof needs independence)
        self._key = mx.random.key(entropy_seed())

    def seed(self, seed: int | None) -> None:
        self._key = mx.random.key(entropy_seed() if seed is None else seed)

    def _next_key(self) -> mx.array:
        self._key, key = mx.random.split(self._key)
        return key

    def step(self, token: mx.array, hidden: mx.array, position: int, kv: dict):
        """One assistant pass: token (1, 1), hidden (1, 1, backbone) -> logits (V,) float32 and the
        next step's hidden state."""
        # the hidden state's dtype: a quantized embedding's weight is packed integers
        embeds = mx.concatenate([(self.embed(token) * self.embed_scale).astype(hidden.dtype), hidden], axis=-1)
        logits, h = self.model(embeds, kv, position)
        return logits[0, -1, : self.target.vocab_limit].astype(mx.float32), h

    def draft(self, token: int, hidden: mx.array, position: int, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None):
        kv = shared_kv_states(self.target, self.producers, position, self.window)
        if kv is None:
            return (), (), None, None
        x, h = mx.array([[token]]), hidden.reshape(1, 1, -1)
        steps = DraftSteps(params, self._next_key)
        for _ in range(k):
            if should_stop is not None and should_stop():  # Stop is honoured between draft steps
                break
            logits, h = self.step(x, h, position, kv)
            x = steps.pick(logits).reshape(1, 1)
            mx.async_eval(x, h)  # keep the lazy graph short; no sync to Python
        return steps.result()
