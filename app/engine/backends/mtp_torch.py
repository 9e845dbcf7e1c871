"""A checkpoint's built-in MTP layer on PyTorch, drafting for its own target (app/engine/mtp.py).

The layer is transformers' own `MtpLayer` (the DeepSeek-V3 multi-token-prediction block: two
norms, a projection of [embedding; hidden] and a decoder layer, then a norm) around the target's
own decoder-layer class as a full-attention layer; the embedding, the rotary embedding and the
head are the target's modules, shared. Qwen3.5's checkpoint names map onto it one to one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from safetensors import safe_open
from transformers.modeling_layers import MtpLayer

from app.engine.backends.head_cache_torch import CachedHead
from app.engine.backends.subset_head_torch import SubsetHead
from app.engine.backends.torch_backend import TorchBackend, own_layers
from app.engine.backends.verdict_torch import DraftSteps
from app.engine.sampling import SamplingParams
from app.models.errors import ModelFileError
from app.models.mtp_weights import MTPWeights, misfit_message, mtp_misfit
from app.models.names import display_name

# Qwen3.5's names (under mtp.) -> transformers' MtpLayer's
RENAMES = (("fc.", "eh_proj."), ("pre_fc_norm_embedding.", "enorm."), ("pre_fc_norm_hidden.", "hnorm."),
           ("norm.", "post_norm."), ("layers.0.", "mtp_block."))


def to_layer_name(name: str) -> str:
    for ours, theirs in RENAMES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def to_checkpoint_name(name: str) -> str:
    for ours, theirs in RENAMES:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def mtp_config(text_config):
    """The target's text config for one full-attention layer at index 0 (its own KV cache)."""
    config = copy.deepcopy(text_config)
    config.num_hidden_layers = 1
    config.layer_types = ["full_attention"]
    if getattr(config, "_attn_implementation", None) is None:
        # a config read for a GGUF's shell names none: transformers then runs its eager attention
        # anyway, saying so on stderr at the first draft (in the middle of a CLI's answer)
        config._attn_implementation = "eager"
    return config


def build_layer(text_model: torch.nn.Module, config) -> MtpLayer:
    """An MTP layer of the target's kinds of decoder layer and norm (random weights)."""
    return MtpLayer(config, type(text_model.layers[-1]), type(text_model.norm), 0, use_post_norm=True)


def transformers_text_model(target: TorchBackend) -> tuple[object, torch.nn.Module]:
    """(the target's transformers config, a text model of transformers' classes to take the layer's
    kinds from). A GGUF loaded into Tandem's own modules (gguf_llama_torch.py) has neither: its
    folder's config is read by transformers and its classes are built on the meta device (no
    weights), one layer deep."""
    if not own_layers(target.model):
        return target.model.config, target.model.model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(target.folder))
    shell_config = mtp_config(config)
    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(shell_config)
    return config, shell.model


def run_layer(layer: MtpLayer, text_model, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
              cache, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One pass of the MTP layer: the tokens' embeddings (1, n) beside the hidden states (1, n, H) of
    the positions before them -> the layer's normed output (1, n, H), appended to `cache`. `mask`:
    where each row may look (1, 1, n, keys), or None for the rule by the cache's length."""
    embeds = text_model.embed_tokens(ids)
    position_ids = positions.view(1, -1)
    n, past = ids.shape[1], (cache.get_seq_length() if cache is not None else 0)
    if mask is None and n > 1 and past:  # SDPA's is_causal aligns a short query top-left: say where each row may look
        mask = torch.ones(n, past + n, dtype=torch.bool, device=ids.device).tril(past).view(1, 1, n, past + n)
    return layer(embeds, hidden.to(embeds.dtype), position_embeddings=text_model.rotary_emb(embeds, position_ids),
                 attention_mask=mask, position_ids=position_ids, cache=cache)


class TorchMTPHead(CachedHead):
    """The MTP layer with its own KV cache: entry i read the token at position i + 1 beside the
    target's hidden state at position i. With `vocab` (token ids), it drafts from those tokens only
    where the target's head allows taking its rows (SubsetHead), else from the whole vocabulary."""

    runner_ups = True  # its draft names each step's runner-up (a tree's leaves, MTPDrafter.propose_tree)

    def __init__(self, target: TorchBackend, weights: MTPWeights, vocab: Sequence[int] | None = None):
        text_model = getattr(target.model, "model", None)
        if text_model is None or not hasattr(text_model, "rotary_emb") or not hasattr(text_model, "layers"):
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach an MTP layer to this model's classes.")
        self.target, self.text_model = target, text_model
        config, classes = transformers_text_model(target)
        self.config = mtp_config(config)
        # the norm's weight says where and in what the model computes (a GGUF's embedding reads
        # rows from its file and has no weight tensor)
        device, dtype = text_model.norm.weight.device, text_model.norm.weight.dtype
        self.layer = build_layer(classes, self.config).to(device=device, dtype=dtype).eval()
        state = {}
        for name, path in weights.files.items():
            if not name.startswith("layers.0.") and name.startswith("layers."):
                continue  # a second MTP layer: Qwen3.5 chains its first; later ones wait for a model that uses them
            with safe_open(str(path), framework="pt", device="cpu") as f:
                state[to_layer_name(name)] = f.get_tensor(weights.prefix + name)
        # each tensor checked by name and shape first: load_state_dict's own error names the layer
        # class, not the checkpoint's tensor, and lists every mismatch on one long line
        owner = display_name(next(iter(weights.files.values())).parent)  # the model's folder, or a head's
        wanted = {to_checkpoint_name(name): tuple(value.shape) for name, value in self.layer.state_dict().items()}
        found = {to_checkpoint_name(name): tuple(value.shape) for name, value in state.items()}
        misfit = mtp_misfit(found, wanted, weights.prefix)
        if misfit is not None:
            raise ModelFileError(misfit_message(owner, target.model_type, misfit))
        try:
            self.layer.load_state_dict(state, strict=True)
        except RuntimeError as exc:  # what the names and shapes did not show (a dtype it cannot take)
            detail = " ".join(str(exc).strip().splitlines()[1:])[:300] or str(exc)[:300]
            raise ModelFileError(misfit_message(owner, target.model_type, detail.strip())) from exc
        self.layer.to(device=device, dtype=dtype)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.layer.parameters())
        self._own_stream(device)
        self.device = device
        head = target.model.get_output_embeddings()
        self.vocab = list(vocab) if vocab and SubsetHead.fits(head) else None
        self.subset = SubsetHead(head, self.vocab, target.vocab_limit) if self.vocab else None
        self._static_passes(target, self.layer.mtp_block.self_attn, 1, dtype, device)
        self.reset()

    def reset(self) -> None:
        super().reset()
        if getattr(self, "subset", None) is not None:
            self.subset.clear()  # a new conversation: its tokens join the draft vocabulary afresh

    def restart_vocab(self, tokens: Sequence[int]) -> None:
        if self.subset is not None:
            self.subset.clear()
            self.subset.add(tokens)

    def _pass(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        start = self.length
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        return run_layer(self.layer, self.text_model, ids, hidden, positions, self.cache)

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        """GraphedHead's pass: positions (1, n) and the mask given."""
        return run_layer(self.layer, self.text_model, ids, hidden, positions, self.cache, mask)

    def _tail_rule(self):
        """The whole head's logits run in the pass; a draft vocabulary that grows with the
        conversation (SubsetHead) changes shape, so its logits run after it."""
        return None if self.subset is not None else self.target.vocab_limit

    def _tail(self, row: torch.Tensor) -> torch.Tensor:
        return self.target.model.get_output_embeddings()(row)[0, : self.target.vocab_limit].float()

    def _step(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass: the output at the last token (1, 1, H) and its logits (V',)."""
        last, logits = self._graph_step(ids, hidden) if self.graph_mode else (self._pass(ids, hidden)[:, -1:], None)
        if logits is None:
            row = last[0, -1]
            head, limit = self.target.model.get_output_embeddings(), self.target.vocab_limit
            logits = self.subset(row) if self.subset is not None else head(last)[0, -1, :limit].float()
        return last, logits

    @torch.inference_mode()
    def draft(self, tokens: Sequence[int], rows: torch.Tensor, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """Read `tokens` beside `rows` (the target's hidden states of the positions before each),
        then draft k tokens, each step reading the last draft beside the layer's own output. The
        cache keeps the read pairs and all steps but the last. Returns what backend.draft returns
        (with `runner_up`, each step's runner-up token and its probability too)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        head, limit = self.target.model.get_output_embeddings(), self.target.vocab_limit
        if self.subset is not None:
            if self.subset.limit != limit:  # the target's vocab_limit changed
                self.subset = SubsetHead(head, self.vocab, limit)
            self.subset.add(tokens)  # every committed token passes here once: the conversation's
        last, logits = self._step(ids, rows.view(1, *rows.shape[-2:]))
        # (a tree's draft goes step by step: each step names its runner-up)
        chained = None if runner_up else self._greedy_chain(last, logits, k, params, lambda out: out, should_stop)
        if chained is not None:
            return chained
        steps = DraftSteps(params, self._generator, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():
                break
            token = steps.pick(logits)
            if i < k - 1:
                last, logits = self._step(token.view(1, 1), last)
        return steps.drafted()
