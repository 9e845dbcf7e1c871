"""An EAGLE-3 head on PyTorch, drafting for its target (app/models/eagle3_head.py says what the
folder holds; app/engine/mtp.py's drafter feeds it, as it feeds an MTP layer).

Our port of the head's forward (EAGLE-3's published code and vLLM's speculators model read to
learn it; neither is run), over transformers' own Llama or Qwen3 decoder layer, attention, MLP,
RMSNorm and rotary embedding: the first layer's q/k/v projections take [embedding; state], 2H
wide, and its forward is EAGLE-3's (each half normed on its own, the residual the state half).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from safetensors import safe_open
from transformers import CONFIG_MAPPING
from transformers.cache_utils import DynamicCache

from app.engine.backends.head_cache_torch import CachedHead
from app.engine.backends.torch_backend import TorchBackend
from app.engine.backends.verdict_torch import DraftSteps
from app.engine.sampling import SamplingParams
from app.models.eagle3_head import Eagle3Head
from app.models.errors import ModelFileError
from app.models.head_sources import check_tensors

CLASSES = {  # the decoder layer, RMSNorm and rotary embedding of each layer type the port knows
    "llama": ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer", "LlamaRMSNorm", "LlamaRotaryEmbedding"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3DecoderLayer", "Qwen3RMSNorm", "Qwen3RotaryEmbedding"),
}
# keys of a head's layer config that describe its checkpoint, not the layer
NOT_LAYER_KEYS = ("architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
                  "speculators_config", "speculators_model_type", "speculators_version", "draft_vocab_size")


def layer_config(head: Eagle3Head):
    """transformers' config for the head's layers, computing with SDPA."""
    values = {k: v for k, v in head.layer_config.items() if k not in NOT_LAYER_KEYS and k != "model_type"}
    config = CONFIG_MAPPING[head.layer_config.get("model_type", "llama")](**values)
    config._attn_implementation = "sdpa"
    return config


def _classes(model_type: str):
    import importlib

    module, *names = CLASSES[model_type]
    loaded = importlib.import_module(module)
    return [getattr(loaded, name) for name in names]


class Eagle3Modules(torch.nn.Module):
    """The head's modules under the speculators layout's names (random until loaded)."""

    def __init__(self, head: Eagle3Head, config):
        super().__init__()
        layer_class, norm_class, rotary_class = _classes(head.layer_config.get("model_type", "llama"))
        hidden, eps, fused = config.hidden_size, config.rms_norm_eps, len(head.layers) * head.target_hidden_size
        self.flags = head.flags
        self.fc = torch.nn.Linear(fused, hidden, bias=False)
        self.layers = torch.nn.ModuleList([layer_class(config, i) for i in range(head.layer_count)])
        first = self.layers[0]
        attn, wide = first.self_attn, 2 * hidden
        bias = bool(getattr(config, "attention_bias", False))
        attn.q_proj = torch.nn.Linear(wide, attn.q_proj.out_features, bias=bias)
        attn.k_proj = torch.nn.Linear(wide, attn.k_proj.out_features, bias=bias)
        attn.v_proj = torch.nn.Linear(wide, attn.v_proj.out_features, bias=bias)
        first.hidden_norm = norm_class(hidden, eps=eps)
        self.norm = norm_class(hidden, eps=eps)
        self.lm_head = torch.nn.Linear(hidden, head.draft_vocab, bias=False)
        self.rotary_emb = rotary_class(config=config)
        if head.flags.get("norm_before_fc"):
            self.input_norm = norm_class(fused, eps=eps)
        if head.flags.get("fc_norm"):
            self.fc_norm = torch.nn.ModuleList([norm_class(head.target_hidden_size, eps=eps) for _ in head.layers])
        if head.own_embedding:
            self.embed_tokens = torch.nn.Embedding(head.target_vocab, hidden)
        self.register_buffer("d2t", torch.zeros(head.draft_vocab, dtype=torch.long))

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """The target's layers' states side by side (..., 3 H_target) -> the fused state (..., H)."""
        if self.flags.get("norm_before_fc"):
            states = self.input_norm(states)
        if self.flags.get("fc_norm"):
            parts = states.chunk(len(self.fc_norm), dim=-1)
            states = torch.cat([norm(part) for norm, part in zip(self.fc_norm, parts, strict=True)], -1)
        return self.fc(states)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor | None, cache: DynamicCache | None) -> torch.Tensor:
        """Embeddings (1, n, H) beside states (1, n, H) -> the last layer's output (1, n, H)."""
        first = self.layers[0]
        normed = first.hidden_norm(hidden)
        residual = normed if self.flags.get("norm_before_residual") else hidden
        wide = torch.cat([first.input_layernorm(embeds), normed], -1)
        rope = self.rotary_emb(embeds, position_ids)
        out, _ = first.self_attn(hidden_states=wide, position_embeddings=rope, attention_mask=mask,
                                 position_ids=position_ids, cache=cache)
        x = residual + out
        x = x + first.mlp(first.post_attention_layernorm(x))
        for layer in self.layers[1:]:
            x = layer(x, attention_mask=mask, position_ids=position_ids, cache=cache, position_embeddings=rope)
        return x


def load_modules(head: Eagle3Head, device, dtype) -> Eagle3Modules:
    """The head's modules with its checkpoint's tensors, each checked by name and shape first."""
    config = layer_config(head)
    modules = Eagle3Modules(head, config)
    wanted = modules.state_dict()
    state = {}
    for path in {path for path, _ in head.files.values()}:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name, (at, stored) in head.files.items():
                if at == path and name in wanted:
                    state[name] = f.get_tensor(stored)
    if "d2t" not in state and head.draft_vocab == head.target_vocab:
        state["d2t"] = torch.zeros_like(wanted["d2t"])  # one vocabulary: the map is the identity
    label = head.folder.name
    check_tensors(label, "head", {n: tuple(t.shape) for n, t in state.items()},
                  {n: tuple(t.shape) for n, t in wanted.items()}, head.shown)
    d2t = state["d2t"].long()
    targets = torch.arange(head.draft_vocab) + d2t
    if int(targets.min()) < 0 or int(targets.max()) >= head.target_vocab or len(set(targets.tolist())) != len(targets):
        raise ModelFileError(f"{label}: its d2t map sends draft tokens outside the target's {head.target_vocab} "
                             "tokens or two onto one. The file is damaged.")
    state["d2t"] = d2t
    modules.load_state_dict(state, strict=True)
    return modules.to(device=device, dtype=dtype).eval()


class TorchEagle3Head(CachedHead):
    """The head with its own KV cache, drafting through MTPDrafter: entry i read the token at
    position i + 1 beside the target's fused state at position i; chained steps read the head's
    own output instead (EAGLE-3's test-time rule, the state before the final norm unless its
    config says norm_output)."""

    runner_ups = True  # its draft names each step's runner-up (a tree's leaves, MTPDrafter.propose_tree)

    def __init__(self, target: TorchBackend, head: Eagle3Head):
        text_model = getattr(target.model, "model", None)
        if text_model is None or not hasattr(text_model, "embed_tokens"):
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach an EAGLE-3 head to this model's classes.")
        self.target, self.text_model, self.spec = target, text_model, head
        device, dtype = text_model.norm.weight.device, text_model.norm.weight.dtype
        self.modules = load_modules(head, device, dtype)
        self.config = layer_config(head)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.modules.parameters())
        self.targets = torch.arange(head.draft_vocab, device=device) + self.modules.d2t  # draft id -> target id
        self.device = device
        self._own_stream(device)
        self._limit = -1
        self._static_passes(target, self.modules.layers[0].self_attn, len(self.modules.layers), dtype, device)
        self.reset()

    def restart_vocab(self, tokens: Sequence[int]) -> None:
        """The draft vocabulary is the head's own, fixed."""

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        own = getattr(self.modules, "embed_tokens", None)  # a head that carries its own copy
        return (own if own is not None else self.text_model.embed_tokens)(ids)

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        """Tokens (1, n) beside states (1, n, H) at positions (1, n), appended to the cache -> the
        outputs (1, n, H)."""
        return self.modules(self._embed(ids).to(hidden.dtype), hidden, positions, mask, self.cache)

    def _pass(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        past, n = self.length, ids.shape[1]
        positions = torch.arange(past, past + n, device=self.device).view(1, -1)
        mask = None
        if n > 1 and past:  # SDPA's is_causal aligns a short query top-left: say where each row may look
            mask = torch.ones(n, past + n, dtype=torch.bool, device=self.device).tril(past).view(1, 1, n, past + n)
        return self._run(ids, hidden, positions, mask)

    def _step(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass: the output at the last token (1, 1, H) and its logits (V',)."""
        if self.graph_mode:
            return self._graph_step(ids, hidden)  # the logits come out of the same replay
        last = self._pass(ids, hidden)[:, -1:]
        return last, self.logits(last[0, -1])

    def _tail_rule(self):
        self._prepare(self.target.vocab_limit)
        return self._limit

    def _tail(self, row: torch.Tensor) -> torch.Tensor:
        return self.logits(row[0])

    def _prepare(self, limit: int) -> None:
        """Which draft rows land on which target ids below `limit` (once per limit: a boolean index
        reads back to the host, which no captured pass may do)."""
        if limit != self._limit:
            keep = self.targets < limit
            self._limit, self._rows, self._ids = limit, keep.nonzero()[:, 0], self.targets[keep]

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The head's output row (H,) -> logits over the target's ids (V',), -inf where the draft
        vocabulary has no token (vLLM's rule: each draft logit at its d2t target id)."""
        small = self.modules.lm_head(self.modules.norm(out)).float()
        self._prepare(self.target.vocab_limit)
        full = torch.full((self._limit,), float("-inf"), device=self.device)
        return full.index_copy_(0, self._ids, small.index_select(0, self._rows))

    @torch.inference_mode()
    def draft(self, tokens: Sequence[int], rows: torch.Tensor, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """Read `tokens` beside `rows` (the target's layers' states of the positions before each,
        side by side), then draft k tokens, each step reading the last draft beside the head's own
        output. The cache keeps the read pairs and all steps but the last (`runner_up`: as
        TorchMTPHead.draft)."""
        dtype = self.modules.fc.weight.dtype
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        fused = self.modules.fuse(rows.view(1, *rows.shape[-2:]).to(dtype))
        last, logits = self._step(ids, fused)
        state = self.modules.norm if self.spec.flags.get("norm_output") else (lambda out: out)
        # (a tree's draft goes step by step: each step names its runner-up)
        chained = None if runner_up else self._greedy_chain(last, logits, k, params, state, should_stop)
        if chained is not None:
            return chained
        steps = DraftSteps(params, self._generator, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():
                break
            token = steps.pick(logits)
            if i < k - 1:
                last, logits = self._step(token.view(1, 1), state(last))
        return steps.drafted()
