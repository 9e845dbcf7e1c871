"""A Gemma 4 assistant on PyTorch: transformers' own `Gemma4AssistantForCausalLM`, fed the way its
`SinglePositionMultiTokenCandidateGenerator` feeds it (app/engine/assistant.py says how), with the
keys and values read from the target's DynamicCache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Gemma4AssistantForCausalLM, Gemma4UnifiedAssistantForCausalLM

from app.engine.assistant_kv import kv_producers, window_start
from app.engine.backends.base import entropy_seed
from app.engine.backends.torch_backend import TorchBackend
from app.engine.backends.verdict_torch import DraftSteps
from app.engine.sampling import SamplingParams

_CLASSES = {"gemma4_assistant": Gemma4AssistantForCausalLM,
            "gemma4_unified_assistant": Gemma4UnifiedAssistantForCausalLM}


def shared_kv_states(target: TorchBackend, producers: dict[str, int], position: int, window: int) -> dict:
    """The target's keys and values of positions before `position`, per kind of layer, as the
    assistant's `shared_kv_states`: all of them for full attention, the last window - 1 for sliding
    layers. Each (1, kv_heads, n, head_dim)."""
    states = {}
    for kind, index in producers.items():
        layer = target.cache.store.layers[index]
        held = layer.keys.shape[-2]
        # a sliding layer holds its last positions only: cumulative_length counts all it has seen
        first_held = getattr(layer, "cumulative_length", held) - held
        first = max(first_held, window_start(position, window) if kind == "sliding_attention" else 0)
        rows = slice(first - first_held, position - first_held)
        states[kind] = (layer.keys[:, :, rows], layer.values[:, :, rows])
    return states


class TorchAssistant:
    def __init__(self, folder: Path, config: dict, target: TorchBackend):
        self.target = target
        self.model = _CLASSES[config["model_type"]].from_pretrained(
            str(folder), dtype=target.model.dtype, trust_remote_code=False,  # never run shipped code
            use_safetensors=True).to(target.model.device).eval()
        self.embed = target.model.get_input_embeddings()  # Gemma's scaled embedding, as transformers feeds it
        text = target.model.config.get_text_config()
        self.producers = kv_producers(text.layer_types, text.num_hidden_layers - (text.num_kv_shared_layers or 0))
        self.window = self.model.config.get_text_config().sliding_window
        self.device = target.model.device
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(entropy_seed())

    def seed(self, seed: int | None) -> None:
        self._generator.manual_seed(entropy_seed() if seed is None else seed)

    @torch.inference_mode()
    def step(self, token: torch.Tensor, hidden: torch.Tensor, position: torch.Tensor, kv: dict):
        """One assistant pass: token (1, 1), hidden (1, 1, backbone) -> logits (V,) float32, and
        the projected hidden state (1, 1, backbone) the next step reads."""
        embeds = torch.cat([self.embed(token), hidden.to(self.model.dtype)], dim=-1)  # (1, 1, 2 * backbone)
        out = self.model(inputs_embeds=embeds, position_ids=position, shared_kv_states=kv)
        return out.logits[0, -1, : self.target.vocab_limit].float(), out.last_hidden_state

    @torch.inference_mode()
    def draft(self, token: int, hidden: torch.Tensor, position: int, k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None):
        kv = shared_kv_states(self.target, self.producers, position, self.window)
        x = torch.tensor([[token]], dtype=torch.long, device=self.device)
        h = hidden.reshape(1, 1, -1)
        at = torch.tensor([[position]], dtype=torch.long, device=self.device)  # constant for all k steps
        steps = DraftSteps(params, self._generator)
        for _ in range(k):
            if should_stop is not None and should_stop():  # Stop is honoured between draft steps
                break
            logits, h = self.step(x, h, at, kv)
            x = steps.pick(logits).view(1, 1)
        return steps.result()
