"""Tiny random Gemma 4 models from transformers' own classes, saved as the real checkpoints are laid
out: a text-only target (sliding and full attention, per-layer embeddings, KV-shared layers) and
its assistant (model_type "gemma4_assistant", every layer reading the target's keys and values)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

VOCAB = 512
WINDOW = 64  # prompts and answers in the tests stay inside it (MLX's ring buffer stops speculation there)
HEAD_DIM, GLOBAL_HEAD_DIM, KV_HEADS = 16, 32, 2


def _scale(model, factor: float):
    with torch.no_grad():  # larger weights than the init, so greedy choices are not near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(factor)
    return model


def tiny_gemma4(seed: int, hidden: int = 64, vocab: int = VOCAB, scale: float = 4.0) -> Gemma4ForCausalLM:
    """Five layers: sliding, sliding, full, then a sliding and a full one that reuse the keys and
    values of layers 1 and 2 (the target's own KV sharing); per-layer embeddings as in e2b/e4b."""
    torch.manual_seed(seed)
    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, global_head_dim=GLOBAL_HEAD_DIM,
        sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                            "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab, num_kv_shared_layers=2,
        final_logit_softcapping=30.0, max_position_embeddings=512, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return _scale(Gemma4ForCausalLM(config).eval(), scale)


def tiny_assistant(seed: int, backbone: int = 64, hidden: int = 32, ordered: bool = False,
                   scale: float = 4.0, vocab: int = VOCAB, centroids: int = 16) -> Gemma4AssistantForCausalLM:
    """Two layers (sliding, full) whose queries read a target's keys and values of the shapes above;
    `ordered`: the centroid-masked head of the real assistants (use_ordered_embeddings)."""
    torch.manual_seed(seed)
    text = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, global_head_dim=GLOBAL_HEAD_DIM,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, max_position_embeddings=512, final_logit_softcapping=30.0,
        bos_token_id=2, eos_token_id=1, pad_token_id=0)
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone, use_ordered_embeddings=ordered,
                                   num_centroids=centroids, centroid_intermediate_top_k=centroids // 4)
    model = _scale(Gemma4AssistantForCausalLM(config).eval(), scale)
    if ordered:  # a permutation of the vocabulary: which tokens each centroid stands for
        model.masked_embedding.token_ordering.copy_(torch.randperm(vocab))
    return model


def _text_dict(config) -> dict:
    """The text config as Google's config.json files write it: global_head_dim, not transformers'
    derived per_layer_config (mlx-lm reads the former)."""
    text = config.to_dict()
    text.pop("per_layer_config", None)
    text["global_head_dim"] = GLOBAL_HEAD_DIM
    return text


def _save(model, folder: Path, config: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tied = config.get("tie_word_embeddings", True)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if not (k == "lm_head.weight" and tied)}
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def save_gemma4(model: Gemma4ForCausalLM, folder: Path, multimodal: bool = False) -> Path:
    """Text-only (model_type "gemma4_text"), or `multimodal` as Google publishes Gemma 4: model_type
    "gemma4", the text config under text_config, the weights under model.language_model (no vision
    or audio tower here: the configs leave them out)."""
    if not multimodal:
        config = {**_text_dict(model.config), "architectures": ["Gemma4ForCausalLM"], "dtype": "float32"}
        return _save(model, folder, config)
    from transformers import Gemma4Config

    text = _text_dict(model.config)
    config = Gemma4Config(text_config=text, vision_config=None, audio_config=None).to_dict()
    config.update(text_config=text, architectures=["Gemma4ForConditionalGeneration"], dtype="float32",
                  tie_word_embeddings=True, vocab_size=text["vocab_size"])  # mlx-lm reads the top-level one
    wrapped = _Renamed({k.replace("model.", "model.language_model.", 1): v for k, v in model.state_dict().items()})
    return _save(wrapped, folder, config)


class _Renamed:
    def __init__(self, weights: dict):
        self.weights = weights

    def state_dict(self) -> dict:
        return self.weights


def save_assistant(model: Gemma4AssistantForCausalLM, folder: Path) -> Path:
    config = model.config.to_dict()
    config.update(text_config=_text_dict(model.config.text_config), architectures=["Gemma4AssistantForCausalLM"],
                  dtype="float32")
    return _save(model, folder, config)
