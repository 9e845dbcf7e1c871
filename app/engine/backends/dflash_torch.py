"""A DFlash block drafter on PyTorch (app/models/dflash_head.py says what the folder holds;
app/engine/dflash.py's drafter feeds it the target's states).

Our port of the drafter's forward (z-lab's published model code read to learn it, never run as
remote code) over transformers' own Qwen3 decoder layer parts: its q/k/v/o projections, q and k
head norms, MLP and RMSNorms, and Qwen3's rotary embedding. What is DFlash's own: the context
features (fc, then hidden_norm, of the target's states) enter every layer as extra keys and
values beside the block's, and the block's queries attend to all of them with no causal mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import Qwen3Config
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import (Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding,
                                                      rotate_half)

from app.engine.backends.head_cache_torch import CachedHead
from app.engine.backends.head_graphs_torch import GraphedBlock
from app.engine.backends.torch_backend import TorchBackend
from app.engine.backends.verdict_torch import DraftSteps
from app.engine.sampling import SamplingParams
from app.models.dflash_head import DFlashHead
from app.models.errors import ModelFileError
from app.models.head_sources import check_tensors

NOT_LAYER_KEYS = ("architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
                  "dflash_config", "block_size", "num_target_layers", "model_type")


def layer_config(head: DFlashHead) -> Qwen3Config:
    config = Qwen3Config(**{k: v for k, v in head.config.items() if k not in NOT_LAYER_KEYS})
    config._attn_implementation = "sdpa"
    return config


class DFlashModules(torch.nn.Module):
    """The drafter's modules under its checkpoint's names (random until loaded)."""

    def __init__(self, head: DFlashHead, config: Qwen3Config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.layers = torch.nn.ModuleList([Qwen3DecoderLayer(config, i) for i in range(head.layer_count)])
        self.fc = torch.nn.Linear(len(head.layers) * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=eps)
        self.norm = Qwen3RMSNorm(hidden, eps=eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)

    def context(self, states: torch.Tensor) -> torch.Tensor:
        """The target's layers' states side by side (1, c, n H) -> context features (1, c, H)."""
        return self.hidden_norm(self.fc(states))

    def forward(self, context: torch.Tensor, noise: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Context features (N, c, H) at positions[:, :c], the blocks' embeddings (N, b, H) at
        positions[:, c:], appended to `cache` (its earlier context before them) -> the blocks'
        normed outputs (N, b, H). `mask` (N, 1, 1 or b, keys): which keys the block sees (a fixed
        buffer's padding hidden, head_graphs_torch.GraphedBlock); None: all of them."""
        n, b, c = noise.shape[0], noise.shape[1], context.shape[1]
        cos, sin = (t.unsqueeze(1) for t in self.rotary_emb(noise, positions))  # (1, 1, c + b, hd)
        x = noise
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            hd = attn.head_dim
            q = attn.q_norm(attn.q_proj(h).view(n, b, -1, hd)).transpose(1, 2)
            both = torch.cat([context, h], 1)  # the context's keys and values, then the block's
            k = attn.k_norm(attn.k_proj(both).view(n, c + b, -1, hd)).transpose(1, 2)
            v = attn.v_proj(both).view(n, c + b, -1, hd).transpose(1, 2)
            q = q * cos[:, :, c:] + rotate_half(q) * sin[:, :, c:]
            k = k * cos + rotate_half(k) * sin
            if cache is not None:
                k, v = cache.update(k, v, index)
            # no causal mask: the block sees every context position and the whole block (DFlash's rule)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(n, b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def load_modules(head: DFlashHead, device, dtype) -> DFlashModules:
    """The drafter's modules with its checkpoint's tensors, each checked by name and shape first."""
    modules = DFlashModules(head, layer_config(head))
    wanted = modules.state_dict()
    state = {name: value for name, value in wanted.items() if name.startswith("rotary_emb.")}  # from the config
    for path in set(head.files.values()):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name, at in head.files.items():
                if at == path and name in wanted:
                    state[name] = f.get_tensor(name)
    check_tensors(head.folder.name, "drafter", {n: tuple(t.shape) for n, t in state.items()},
                  {n: tuple(t.shape) for n, t in wanted.items()})
    modules.load_state_dict(state, strict=True)
    return modules.to(device=device, dtype=dtype).eval()


class TorchDFlashBlock(CachedHead):
    """The drafter with its KV cache of context features (one entry per committed position it has
    read; a block's own entries go after each pass), drafting a block per call."""

    runner_ups = True  # its draft names each position's runner-up (DFlashDrafter.propose_tree)

    def __init__(self, target: TorchBackend, head: DFlashHead):
        text_model = getattr(target.model, "model", None)
        if text_model is None or not hasattr(text_model, "embed_tokens"):
            raise ModelFileError(f"{target.model_type}: Tandem cannot attach a DFlash drafter to this model's classes.")
        self.target, self.text_model, self.spec = target, text_model, head
        device, dtype = text_model.norm.weight.device, text_model.norm.weight.dtype
        self.modules = load_modules(head, device, dtype)
        self.config = layer_config(head)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.modules.parameters())
        self.device = device
        self._own_stream(device)
        self._static_passes(target, self.modules.layers[0].self_attn, len(self.modules.layers), dtype, device)
        self.reset()

    def _static_block(self) -> GraphedBlock:
        if self._graphed is None:
            spec = self.spec
            self._graphed = GraphedBlock(self._run_block, self.static_kv,
                                         [spec.mask_token_id] * spec.block_size, self.modules.fc.in_features,
                                         self._in_dtype, self._planned, capture=self.graph_mode == "capture")
            self._rule = self.target.vocab_limit
        if self._rule != self.target.vocab_limit:  # the logits' width changed: capture again
            self._rule = self.target.vocab_limit
            self._graphed.drop()
        return self._graphed

    def _run_block(self, ids: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """GraphedBlock's pass: the block's logits after its first position, (b - 1, V')."""
        dtype = self.modules.fc.weight.dtype
        context = self.modules.context(rows.to(dtype))
        noise = self.text_model.embed_tokens(ids).to(dtype) * self.spec.input_scale
        out = self.modules(context, noise, positions, self.cache, mask)
        return self._logits(out[0, 1:])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head on the block's outputs (n, H) -> (n, V'), with the drafter's scale
        and soft cap where its config sets them."""
        logits = self.target.model.get_output_embeddings()(hidden)[:, : self.target.vocab_limit].float()
        if self.spec.output_scale != 1.0:
            logits = logits * self.spec.output_scale
        if self.spec.softcap > 0:
            logits = torch.tanh(logits / self.spec.softcap) * self.spec.softcap
        return logits

    def block(self, anchor: int, rows: torch.Tensor | None, start: int) -> torch.Tensor:
        """Read `rows` (the target's states of positions start .. start + c - 1; None: none new)
        into the cache, then the block at the positions after: its outputs (block_size, H)."""
        spec, device = self.spec, self.device
        dtype = self.modules.fc.weight.dtype
        c = 0 if rows is None else rows.shape[-2]
        context = (self.modules.context(rows.view(1, c, -1).to(dtype)) if c
                   else torch.zeros(1, 0, spec.hidden_size, device=device, dtype=dtype))
        ids = torch.tensor([[anchor] + [spec.mask_token_id] * (spec.block_size - 1)], device=device)
        # the target's own embedding, raw (z-lab embeds the block with its weight, times a scale)
        noise = self.text_model.embed_tokens(ids).to(dtype) * spec.input_scale
        positions = torch.arange(start, start + c + spec.block_size, device=device).view(1, -1)
        out = self.modules(context, noise, positions, self.cache)
        self.trim(self.length - spec.block_size)  # the block's own entries go: the cache keeps context only
        return out[0]

    def _block_logits(self, anchor: int, rows: torch.Tensor | None, start: int) -> torch.Tensor:
        """The block over the fixed buffer: its logits after the anchor, (b - 1, V')."""
        block = self._static_block()
        return self._without_graphs_if_need_be(lambda: block.forward(anchor, rows, start))

    @torch.inference_mode()
    def draft(self, anchor: int, rows: torch.Tensor | None, start: int, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """One block after `anchor`: up to k drafts (at most block_size - 1), each picked from its
        own position's distribution (the draft never conditions on its own picks, so each row is
        the distribution its token came from, as the Leviathan/Chen rule needs). With `runner_up`
        each position's most likely other token too (a tree's one-token leaves)."""
        n = min(k, self.spec.block_size - 1)
        if self.graph_mode:
            logits = self._block_logits(anchor, rows, start)[:n]
        else:
            logits = self._logits(self.block(anchor, rows, start)[1 : 1 + n])
        steps = DraftSteps(params, self._generator, runner_up)
        if n > 0 and not (should_stop is not None and should_stop()):
            for row in logits:
                steps.pick(row)
        return steps.drafted()

