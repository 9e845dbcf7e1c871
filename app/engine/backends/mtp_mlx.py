"""A checkpoint's built-in MTP layer on MLX, drafting for its own target (app/engine/mtp.py).

mlx-lm drops the `mtp.*` weights at load, so the layer is ours, small: the two norms and the
projection of [embedding; hidden] from mlx.nn, then mlx-lm's own Qwen3.5 decoder layer as a
full-attention layer, then a norm; the embedding and the head are the target's, shared. The
same arithmetic as transformers' MtpLayer, which the PyTorch side uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from app.engine.backends.base import entropy_seed
from app.engine.backends.mlx_backend import DraftSteps, MLXBackend
from app.engine.backends.subset_head_mlx import SubsetHead
from app.engine.sampling import SamplingParams
from app.models.errors import ModelFileError
from app.models.mtp_weights import MTPWeights, misfit_message, mtp_misfit, norms_stored_zero_centered
from app.models.names import display_name

# RMSNorm weights that Qwen3.5's checkpoints store as offsets from 1 (mlx.nn.RMSNorm wants the scale)
NORMS = ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight", ".input_layernorm.weight",
         ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


class MTPLayer(nn.Module):
    """Qwen3.5's MTP block under its checkpoint names: fc([norm(embedding); norm(hidden)]), one
    decoder layer, norm."""

    def __init__(self, args, block: nn.Module):
        super().__init__()
        hidden = args.hidden_size
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = [block]
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    def __call__(self, embeds: mx.array, hidden: mx.array, cache: KVCache) -> mx.array:
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], axis=-1))
        x = self.layers[0](x, create_attention_mask(x, cache), cache)
        return self.norm(x)


# Targets whose decoder layer mlx-lm builds from its args alone, with transformers' names and
# scale-form RMSNorm weights on both sides: a head trained on PyTorch (app/align/) loads as it is
PLAIN_BLOCKS = ("llama", "mistral", "qwen2", "qwen3")


def _block(language, aligned: bool) -> nn.Module:
    args = language.args
    if hasattr(args, "full_attention_interval"):  # Qwen3.5: a full-attention layer of its pattern
        from mlx_lm.models.qwen3_5 import DecoderLayer

        return DecoderLayer(args, args.full_attention_interval - 1)
    if aligned and getattr(args, "model_type", "") in PLAIN_BLOCKS:
        return type(language.model.layers[-1])(args)
    raise ModelFileError(f"{getattr(args, 'model_type', '?')}: Tandem cannot attach a draft head to this model's "
                         "classes on MLX; use it on PyTorch.")


class MLXMTPHead:
    """The MTP layer with its own KV cache: entry i read the token at position i + 1 beside the
    target's hidden state at position i (RoPE positions are the entries' indices). `aligned`: a
    head Tandem trained (app/align/), saved in transformers' conventions for the target's norms.
    With `vocab` (token ids) it drafts from those tokens only (SubsetHead)."""

    runner_ups = True  # its draft names each step's runner-up (a tree's leaves)

    def __init__(self, target: MLXBackend, weights: MTPWeights, aligned: bool = False,
                 vocab: Sequence[int] | None = None):
        language = getattr(target.model, "language_model", target.model)
        if getattr(language, "args", None) is None:
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach an MTP layer to this model's classes.")
        args = language.args
        self.target, self.language = target, language
        self.layer = MTPLayer(args, _block(language, aligned))
        dtype = language.model.norm.weight.dtype
        # transformers' Qwen3.5 norms compute x * (1 + w), mlx.nn's x * w; a built-in layer's
        # checkpoint says which form it stores, a trained head was saved in transformers' form
        shift = (hasattr(args, "full_attention_interval") if aligned
                 else norms_stored_zero_centered(target.folder))
        loaded = {}
        for path in sorted(set(weights.files.values())):
            for key, value in mx.load(str(path)).items():
                if not key.startswith(weights.prefix):
                    continue
                name = key[len(weights.prefix):]
                if name.startswith("layers.") and not name.startswith("layers.0."):
                    continue  # a second MTP layer: Qwen3.5 chains its first
                if shift and value.ndim == 1 and any(name.endswith(n) for n in NORMS):
                    value = value + 1.0
                loaded[name] = value.astype(dtype)
        ours = dict(tree_flatten(self.layer.parameters()))
        # by name and shape before load_weights, whose error names neither the model nor the fix
        misfit = mtp_misfit({name: tuple(value.shape) for name, value in loaded.items()},
                            {name: tuple(value.shape) for name, value in ours.items()}, weights.prefix)
        if misfit is not None:
            owner = display_name(next(iter(weights.files.values())).parent)  # the model's folder, or a head's
            raise ModelFileError(misfit_message(owner, target.model_type, misfit))
        self.layer.load_weights(list(loaded.items()))
        mx.eval(self.layer.parameters())
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(self.layer.parameters()))
        self._key = mx.random.key(entropy_seed())
        self.vocab = list(vocab) if vocab else None
        self.subset = SubsetHead(self._subset_module(), self.vocab, target.vocab_limit) if self.vocab else None
        self.reset()

    def reset(self) -> None:
        self.cache = KVCache()
        if getattr(self, "subset", None) is not None:
            self.subset.clear()  # a new conversation: its tokens join the draft vocabulary afresh

    @property
    def length(self) -> int:
        return self.cache.offset

    def trim(self, length: int) -> None:
        if self.cache.offset > length:
            self.cache.trim(self.cache.offset - length)

    def concat(self, rows, more):
        return mx.concatenate([rows, more])

    def restart_vocab(self, tokens: Sequence[int]) -> None:
        if self.subset is not None:
            self.subset.clear()
            self.subset.add(tokens)

    def _subset_module(self) -> nn.Module:
        return self.language.model.embed_tokens if self.language.args.tie_word_embeddings else self.language.lm_head

    def seed(self, seed: int | None) -> None:
        self._key = mx.random.key(entropy_seed() if seed is None else seed)

    def _next_key(self) -> mx.array:
        self._key, key = mx.random.split(self._key)
        return key

    def _logits(self, h: mx.array) -> mx.array:
        if self.subset is not None:
            return self.subset(h)
        if self.language.args.tie_word_embeddings:
            out = self.language.model.embed_tokens.as_linear(h)
        else:
            out = self.language.lm_head(h)
        return out[0, -1, : self.target.vocab_limit].astype(mx.float32)

    def _pass(self, ids: mx.array, hidden: mx.array) -> mx.array:
        embeds = self.language.model.embed_tokens(ids)
        return self.layer(embeds, hidden.astype(embeds.dtype), self.cache)

    def draft(self, tokens: Sequence[int], rows: mx.array, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """See TorchMTPHead.draft: read the pairs, then chain k steps on the layer's own output."""
        last = self._pass(mx.array([list(tokens)]), rows.reshape(1, *rows.shape[-2:]))[:, -1:]
        if self.subset is not None:
            if self.subset.limit != self.target.vocab_limit:  # the target's vocab_limit changed
                self.subset = SubsetHead(self._subset_module(), self.vocab, self.target.vocab_limit)
            self.subset.add(tokens)  # every committed token passes here once: the conversation's
        steps = DraftSteps(params, self._next_key, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():
                break
            token = steps.pick(self._logits(last))
            if i < k - 1:
                last = self._pass(token.reshape(1, 1), last)
                mx.async_eval(last)
        return steps.drafted()
