"""MLX backend: mlx-lm's model classes and prompt caches. Metal on Apple Silicon, CPU elsewhere.

MLX streams belong to one thread: a backend is created and used on the runner's thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from app.engine.backends.base import ModelBackend, Verdict, check_choice, check_layers, entropy_seed
from app.engine.backends.mlx_cache import MLXCache
from app.engine.backends.sampling_mlx import probs_from_logits
from app.engine.sampling import SamplingParams
from app.models.folder import check_model_folder, context_length_of


class DraftSteps:
    """What a drafter picks, one step at a time, lazily (no sync inside a loop): the argmax at
    temperature 0 (p: the softmax at temperature 1, for display), else a sample from the
    transformed distribution, whose row goes to the Leviathan/Chen rule; `next_key` draws the
    drafter's own random keys. `result()` is what ModelBackend.draft returns, one transfer."""

    def __init__(self, params: SamplingParams, next_key: Callable[[], mx.array], runner_up: bool = False):
        self.params, self.next_key = params, next_key
        self.tokens, self.p_of, self.rows = [], [], []
        # with `runner_up`: each step's most likely other token (a tree's alternative, tree.py)
        self.second: list[mx.array] | None = [] if runner_up else None

    def pick(self, logits: mx.array) -> mx.array:
        """The token after `logits` (V,), as a 0-d array."""
        if self.params.greedy:
            token = mx.argmax(logits)
            p = mx.softmax(logits)[token]
        else:
            probs = probs_from_logits(logits, self.params)
            token = mx.random.categorical(mx.log(probs), key=self.next_key())
            p = probs[token]
            self.rows.append(probs)
        self.tokens.append(token)
        self.p_of.append(p)
        if self.second is not None:  # the best of the rest: the top two, less the token taken
            top = mx.argpartition(-logits, 1)[:2]
            top = mx.where(logits[top[0]] >= logits[top[1]], top, top[::-1])  # (argpartition leaves them unordered)
            other = mx.where(top[0] == token, top[1], top[0])
            dist = mx.softmax(logits) if self.params.greedy else self.rows[-1]
            self.second.append(mx.stack([other.astype(mx.float32), dist[other].astype(mx.float32)]))
        return token

    def runner_ups(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Each step's most likely other token and its probability (as `p` is the taken one's)."""
        if not self.second:
            return (), ()
        pairs = mx.stack(self.second).tolist()
        return tuple(int(t) for t, _ in pairs), tuple(q for _, q in pairs)

    def drafted(self):
        """What ModelBackend.draft returns: `result()`, and where runner-ups were asked for, each
        step's runner-up too (`runner_ups()`)."""
        return (*self.result(), self.runner_ups()) if self.second is not None else self.result()

    def result(self):
        if not self.tokens:
            return (), (), None, None
        n = len(self.tokens)
        ids_a = mx.stack(self.tokens).astype(mx.int32)  # (n,)
        both = mx.concatenate([ids_a.astype(mx.float32), mx.stack(self.p_of)]).tolist()
        return (tuple(int(t) for t in both[:n]), tuple(both[n:]),
                (mx.stack(self.rows) if self.rows else None), ids_a)


def greedy_verdict(logits: mx.array, drafts: mx.array):
    """Greedy rule: accept while the draft token is the target's argmax.

    logits (k+1, V), drafts (k,) -> (n accepted, the target's next token, q of each draft at
    temperature 1 for display)."""
    k = drafts.shape[0]
    top = mx.argmax(logits, axis=-1)  # (k+1,)
    n = mx.cumprod((top[:k] == drafts).astype(mx.int32)).sum()
    q = mx.take_along_axis(mx.softmax(logits[:k], axis=-1), drafts.reshape(k, 1), axis=1)[:, 0]
    return n, mx.take(top, n), q


def residual(q: mx.array, p: mx.array) -> mx.array:
    """Where a rejected position resamples from: max(q - p, 0), unnormalised. (k, V)"""
    return mx.maximum(q - p, 0.0)


def rejection_verdict(q_all: mx.array, p_all: mx.array, drafts: mx.array, r: mx.array):
    """Leviathan et al. 2023 / Chen et al. 2023 (q = target, p = draft, same transform):
    accept draft x_i with probability min(1, q_i(x_i) / p_i(x_i)), i.e. while r_i < that ratio;
    at the first rejection n sample from normalize(max(q_n - p_n, 0)); after k acceptances
    sample the bonus token from q_k. Returns (n, next-token distribution (V,), q of drafts)."""
    k = drafts.shape[0]
    q = mx.take_along_axis(q_all[:k], drafts.reshape(k, 1), axis=1)[:, 0]
    p = mx.take_along_axis(p_all, drafts.reshape(k, 1), axis=1)[:, 0]
    n = mx.cumprod((r < mx.minimum(q / p, 1.0)).astype(mx.int32)).sum()
    rows = mx.concatenate([residual(q_all[:k], p_all), q_all[k:]])  # (k+1, V)
    row = mx.take(rows, n, axis=0)
    total = row.sum()
    # q == p leaves no residual mass; rejection then had probability 0, so q is the answer
    row = mx.where(total > 0, row / mx.maximum(total, 1e-30), mx.take(q_all, n, axis=0))
    return n, row, q


PRECISIONS = ("auto", "float32", "bfloat16", "float16", "int4", "int4-head")  # "auto": the weights' own
INT4_GROUP = 32  # GGUF's Q4 block, and the grid of the mlx-4bit demo variant


def _quantize_int4(model, include_head: bool) -> str:
    """MLX's affine quantization in memory (what mlx_lm.convert -q writes), optionally leaving the
    output head, and the tied embedding that serves as it, at full precision."""
    import mlx.nn as nn

    def wanted(path: str, module) -> bool:
        if not hasattr(module, "to_quantized"):
            return False
        if not include_head and (path.endswith("lm_head") or path.endswith("embed_tokens")):
            return False
        return module.weight.shape[-1] % INT4_GROUP == 0

    nn.quantize(model, group_size=INT4_GROUP, bits=4, class_predicate=wanted)
    return f"int4 (affine, g{INT4_GROUP}, {'int4' if include_head else 'float'} head)"


class _KeepsOutput:
    """Stands in for a model's final norm and keeps its last output: the hidden states the head
    reads. A plain callable, not an nn.Module, so it adds nothing to the parameter tree."""

    def __init__(self, norm):
        self.norm = norm
        self.last = self.entered = None

    def __call__(self, x):
        self.entered = x  # the last layer's output (an EAGLE-3 head may read it)
        self.last = self.norm(x)
        return self.last


class _KeepsInput:
    """Stands in for one decoder layer and keeps the state entering it (an EAGLE-3 head's inner
    layers); like _KeepsOutput a plain callable, the layer's own attributes read through."""

    def __init__(self, layer):
        self.layer = layer
        self.last = None

    def __call__(self, x, *args, **kwargs):
        self.last = x
        return self.layer(x, *args, **kwargs)

    def __getattr__(self, name):  # a model's loop may ask its layers what they are (is_linear, ...)
        return getattr(self.__dict__["layer"], name)


class MLXBackend(ModelBackend):
    name = "mlx"

    def __init__(self, folder: Path, precision: str = "auto"):
        config = check_model_folder(folder)
        check_choice("precision", precision, PRECISIONS)
        self.folder = folder
        self.model, self._config = load_model(folder)
        self.device = "metal" if mx.metal.is_available() else "cpu"
        quant = config.get("quantization") or config.get("quantization_config")
        if isinstance(quant, dict) and "bits" in quant:
            self.dtype = f"int{quant['bits']} (affine, g{quant.get('group_size', 64)})"
        else:
            self.dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
            if precision in ("float32", "bfloat16", "float16"):
                self.model.set_dtype(getattr(mx, precision))
                self.dtype = precision
            elif precision.startswith("int4"):
                self.dtype = _quantize_int4(self.model, include_head=precision == "int4-head")
        # what the logits are rounded to (the bench's near-tie threshold follows it)
        self.logits_dtype = self.dtype if self.dtype in ("bfloat16", "float16") else "float32"
        self.model_type = config.get("model_type", "?")
        self.context_length = context_length_of(config)
        self.vocab_size = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 0)
        self.vocab_limit = self.vocab_size
        self.weights_bytes = sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))
        # Its own random key, split for every draw: MLX's global generator would be shared with
        # the draft model (one stream for both breaks the independence rejection sampling needs).
        self._key = mx.random.key(entropy_seed())
        self._layers_asked: tuple[int, ...] = ()
        self.reset()

    def reset(self) -> None:
        self.cache = MLXCache(make_prompt_cache(self.model))
        self.held = ()

    def seed(self, seed: int | None) -> None:
        self._key = mx.random.key(entropy_seed() if seed is None else seed)

    def _next_key(self) -> mx.array:
        self._key, key = mx.random.split(self._key)
        return key

    def _text_model(self):
        """mlx-lm's text model: `model`, or in a multimodal wrapper (Gemma 4's) `language_model.model`."""
        inner = getattr(self.model, "model", None)
        return inner if inner is not None else getattr(getattr(self.model, "language_model", None), "model", None)

    def capture_hidden(self, on: bool, layers: tuple[int, ...] = ()) -> str:
        inner = self._text_model()
        norm = getattr(inner, "norm", None)
        blocks = getattr(inner, "layers", None)
        if isinstance(blocks, list):  # layers kept for the last answer go back first
            blocks[:] = [b.layer if isinstance(b, _KeepsInput) else b for b in blocks]
        self._layers_asked = tuple(layers) if on else ()
        if isinstance(norm, _KeepsOutput) and not on:
            inner.norm = norm.norm
        elif not isinstance(norm, _KeepsOutput) and on:
            if norm is None:
                return f"{self.model_type} has no final norm to read its hidden states from"
            inner.norm = _KeepsOutput(norm)
        elif isinstance(norm, _KeepsOutput):
            norm.last = None
        if on and layers:
            if not isinstance(blocks, list):
                return f"{self.model_type} has no decoder layer list to read inner states from"
            why = check_layers(tuple(layers), len(blocks))
            if why:
                return why
            for index in layers:  # the last layer's output is what enters the final norm
                if index < len(blocks):
                    blocks[index] = _KeepsInput(blocks[index])
        return ""

    def last_hidden(self) -> mx.array | None:
        inner = self._text_model()
        norm = getattr(inner, "norm", None)
        if not isinstance(norm, _KeepsOutput) or norm.last is None:
            return None
        if not self._layers_asked:
            return norm.last[0]
        blocks = inner.layers
        rows = [norm.entered if i == len(blocks) else blocks[i].last for i in self._layers_asked]
        return mx.concatenate([row[0] for row in rows], axis=-1)

    def join_hidden(self, parts: list) -> mx.array:
        return mx.concatenate(parts)

    def keep_hidden_rows(self, rows: Sequence[int]) -> None:
        """After a tree's verdict: the kept states are those of the pass's `rows`, in that order."""
        inner = self._text_model()
        norm = getattr(inner, "norm", None)
        if not isinstance(norm, _KeepsOutput) or norm.last is None:
            return
        taken = mx.array(list(rows), dtype=mx.int32)
        norm.last = mx.take(norm.last, taken, axis=1)
        norm.entered = mx.take(norm.entered, taken, axis=1)
        for block in inner.layers:
            if isinstance(block, _KeepsInput) and block.last is not None:
                block.last = mx.take(block.last, taken, axis=1)

    def tree_note(self) -> str:
        from app.engine.backends.tree_mlx import why_not

        return why_not(self)

    def verify_tree(self, ids: Sequence[int], tree, params: SamplingParams):
        """The target's verdict on a token tree, its cache keeping `ids` and the accepted path
        (tree_mlx.py)."""
        from app.engine.backends.tree_mlx import verify_tree

        return verify_tree(self, ids, tree, params)

    def _forward(self, ids: mx.array) -> mx.array:
        """Append ids (1, n) to the cache; logits of every new position (n, V') float32."""
        logits = self.model(ids, cache=self.cache.layers)
        self.cache.appended(ids.shape[1])
        return logits[0, :, : self.vocab_limit].astype(mx.float32)

    def forward_last(self, ids: Sequence[int]) -> mx.array:
        """Logits of the last position after appending `ids`. (V,) float32."""
        return self._forward(mx.array([list(ids)]))[-1]

    def top2(self, ids: Sequence[int]) -> tuple[float, float]:
        self.reset()
        top = mx.sort(self.forward_last(ids))[-2:]
        self.reset()
        return float(top[1].item()), float(top[0].item())

    def prefill(self, ids: Sequence[int]) -> None:
        if ids:
            # the caches are what a prefill is for (mlx-lm's generate_step evaluates them alone):
            # evaluating a row of the logits computed the head over every position of the chunk,
            # a fifth of a small model's prefill, to keep one row that nothing reads
            self._forward(mx.array([list(ids)]))
            hidden = self.last_hidden()
            mx.eval([layer.state for layer in self.cache.layers], *(() if hidden is None else (hidden,)))

    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        logits = self.forward_last(ids)
        if params.greedy:
            return int(mx.argmax(logits).item())
        return int(mx.random.categorical(mx.log(probs_from_logits(logits, params)), key=self._next_key()).item())

    def draft(self, ids: Sequence[int], k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """k drafts after `ids`: (ids, p, probs, ids array), and with `runner_up` each step's most
        likely other token too (a tree's alternatives)."""
        x = mx.array([list(ids)])
        steps = DraftSteps(params, self._next_key, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():  # Stop is honoured between draft steps
                break
            token = steps.pick(self._forward(x)[-1])
            if i < k - 1:
                x = token.reshape(1, 1)
                mx.async_eval(x)  # keep the lazy graph short; no sync to Python
        return steps.drafted()

    def verify(self, ids: Sequence[int], proposal, params: SamplingParams) -> Verdict:
        k = len(proposal.ids)
        # (k+1, V): position i predicts draft i+1 (ids may start with tokens the cache lacked)
        logits = self._forward(mx.array([list(ids)]))[-(k + 1):]
        drafts = proposal.ids_array
        if drafts is None:
            drafts = mx.array(proposal.ids, dtype=mx.int32)
        drafts = drafts.reshape(k)
        if params.greedy:
            n, token, q = greedy_verdict(logits, drafts)
        else:
            q_all = probs_from_logits(logits, params)  # (k+1, V) target q
            p_all = proposal.probs  # (k, V) draft p, after the same transform
            if p_all is None:  # a deterministic drafter: p is one-hot at its token
                p_all = (mx.arange(q_all.shape[-1])[None, :] == drafts[:, None]).astype(mx.float32)
            r = mx.random.uniform(shape=(k,), key=self._next_key())
            n, row, q = rejection_verdict(q_all, p_all, drafts, r)
            token = mx.random.categorical(mx.log(row), key=self._next_key())
        out = mx.concatenate([n.reshape(1).astype(mx.float32), token.reshape(1).astype(mx.float32),
                              q.astype(mx.float32)]).tolist()
        return Verdict(accepted=int(out[0]), token=int(out[1]), q=tuple(out[2:]))
